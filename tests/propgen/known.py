"""Probes for engine bugs the property tests found, so the random runs can steer around them
while they exist (and test those paths again, automatically, once they are fixed).

Each probe runs the bug's minimal reproducer once (the same one as the bug's
``xfail(strict=True)`` test in tests/test_engine_properties.py) and caches the answer.
"""

from __future__ import annotations

import functools
import importlib
import os

from rethook.engine.engine import FgraphOps, get_engine

_SOURCE = """\
HOOK = None


def f():
    return 1


def g():
    return 2


def h():
    HOOK()
    return 3


def r():
    raise KeyError("the program's own")
"""


@functools.cache
def probe_module():
    """A small real module (f, g, h calling HOOK, r raising) in the generated-modules dir."""
    from propgen.harness import _module_dir

    name = f"rh_probe_{os.getpid()}"
    with open(os.path.join(_module_dir(), name + ".py"), "w") as f:
        f.write(_SOURCE)
    importlib.invalidate_caches()
    return importlib.import_module(name)


def reproduce_unregister_from_other_entry_handler() -> list:
    """A accepts a call; B's entry handler, for the same call, unregisters A. Returns A's
    returns (the contract: exactly one, FLAG_UNFINISHED, before ``unregister`` returns)."""
    mod = probe_module()
    eng = get_engine()
    got: list = []
    a = FgraphOps(lambda *_: "a-data", lambda *r: got.append((r[3], r[9])),
                  filter=f"{mod.__name__}.f", name="A")

    def b_entry(*_):
        if a in eng.users:
            eng.unregister_ftrace_graph(a)
            got.append("unregistered")
        return None

    b = FgraphOps(b_entry, lambda *r: None, filter=f"{mod.__name__}.f", name="B")
    eng.register_ftrace_graph(a)
    eng.register_ftrace_graph(b)
    try:
        mod.f()
    finally:
        for ops in (a, b):
            if ops in eng.users:
                eng.unregister_ftrace_graph(ops)
    return got


def reproduce_last_user_leaves_from_entry_handler() -> dict:
    """The only user unregisters itself from its entry handler (the engine stops there).
    Returns the engine's stats afterwards (the contract: no record left behind)."""
    mod = probe_module()
    eng = get_engine()

    def entry(*_):
        eng.unregister_ftrace_graph(ops)
        return "data"

    ops = FgraphOps(entry, lambda *r: None, filter=f"{mod.__name__}.f", name="alone")
    eng.register_ftrace_graph(ops)
    try:
        mod.f()
    finally:
        if ops in eng.users:
            eng.unregister_ftrace_graph(ops)
    stats = eng.stats()
    ts = eng.core.current_thread_state()
    if ts is not None:
        ts.stack.clear()  # don't let the probe's leftover disturb the runs after it
    return stats


@functools.cache
def other_entry_unregister_loses_claim() -> bool:
    """Bug: a claim made earlier in the same entry is never delivered when another user's
    entry handler unregisters its owner."""
    from rethook.engine.core import FLAG_UNFINISHED

    return reproduce_unregister_from_other_entry_handler() != [
        ("a-data", FLAG_UNFINISHED), "unregistered"]


@functools.cache
def last_user_entry_unregister_leaks_record() -> bool:
    """Bug: the record of the entry running when the last user left from its entry handler is
    pushed after the engine stopped, and stays on the shadow stack."""
    return reproduce_last_user_leaves_from_entry_handler()["open_calls"] != 0


def reproduce_entry_handler_drops_own_function() -> tuple[list, list]:
    """The only user of ``f`` takes ``f`` out of its filter from its entry handler, and accepts.
    Returns (returns seen when ``f`` returned, returns seen after unregister); the contract:
    the call keeps its normal return (``[("data", 0)]``, then nothing more)."""
    mod = probe_module()
    eng = get_engine()
    got: list = []

    def entry(code, *_):
        ops.set_filter(f"{mod.__name__}.g")
        return "data"

    ops = FgraphOps(entry, lambda *r: got.append((r[3], r[9])),
                    filter=f"{mod.__name__}.f", name="dropper")
    eng.register_ftrace_graph(ops)
    try:
        mod.f()
        at_return = list(got)
    finally:
        eng.unregister_ftrace_graph(ops)
    return at_return, got


def reproduce_discarded_claim_counted() -> tuple[list, int]:
    """A leaves from its own entry handler (its entry is discarded); the last user B leaves
    while that call is open. Returns (returns seen, growth of ``unfinished_returns``); the
    contract: the counter counts the returns delivered (one, B's)."""
    mod = probe_module()
    eng = get_engine()
    got: list = []

    def a_entry(*_):
        eng.unregister_ftrace_graph(a)
        return "a-data"

    a = FgraphOps(a_entry, lambda *r: got.append(("A", r[9])), filter=f"{mod.__name__}.h",
                  name="A")
    b = FgraphOps(lambda *_: "b-data", lambda *r: got.append(("B", r[9])),
                  filter=f"{mod.__name__}.h", name="B")
    eng.register_ftrace_graph(b)
    eng.register_ftrace_graph(a)
    before = eng.stats()["unfinished_returns"]
    mod.HOOK = lambda: eng.unregister_ftrace_graph(b)
    try:
        mod.h()
    finally:
        for ops in (a, b):
            if ops in eng.users:
                eng.unregister_ftrace_graph(ops)
    return got, eng.stats()["unfinished_returns"] - before


@functools.cache
def entry_filter_drop_loses_return() -> bool:
    """Bug: an entry handler that takes the entered function out of every filter loses the
    call's normal return (its return events go off: the entry is not on the stack yet)."""
    return reproduce_entry_handler_drops_own_function() != ([("data", 0)], [("data", 0)])


@functools.cache
def discarded_claim_counted() -> bool:
    """Bug: a claim discarded because its user left from its own entry handler stays on the
    record and is later counted in ``unfinished_returns`` though no handler is called."""
    return reproduce_discarded_claim_counted()[1] != 1


def probe_all() -> None:
    other_entry_unregister_loses_claim()
    last_user_entry_unregister_leaks_record()
    entry_filter_drop_loses_return()
    discarded_claim_counted()
