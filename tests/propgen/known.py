"""Probes for engine bugs the property tests found, so the random runs can steer around them
while they exist (and test those paths again, automatically, once they are fixed).

Each probe runs the bug's minimal reproducer (the same one as the bug's test in
tests/test_engine_properties.py) once per hook core (C or pure Python) and caches the answer.
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


def b():
    yield 1
    yield 2
"""


@functools.cache
def probe_module():
    """A small real module (f, g, h calling HOOK, r raising, b a generator with no try
    around its yields) in the generated-modules dir."""
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


def _per_core(probe):
    """Cache a probe's answer per core of the process engine (the cores may differ)."""
    cached = functools.cache(lambda core_name: probe())

    @functools.wraps(probe)
    def wrapper() -> bool:
        return cached(get_engine().core.name)

    return wrapper


@_per_core
def other_entry_unregister_loses_claim() -> bool:
    """Bug: a claim made earlier in the same entry is never delivered when another user's
    entry handler unregisters its owner."""
    from rethook.engine.core import FLAG_UNFINISHED

    return reproduce_unregister_from_other_entry_handler() != [
        ("a-data", FLAG_UNFINISHED), "unregistered"]


@_per_core
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


def reproduce_entry_handler_drops_own_generator() -> tuple[list, list]:
    """The same as reproduce_entry_handler_drops_own_function, for a generator (whose record
    is keyed by its frame): returns (returns seen when it finished, returns seen after
    unregister); the contract: ``[("data", 0)]`` both times."""
    mod = probe_module()
    eng = get_engine()
    got: list = []

    def entry(code, *_):
        ops.set_filter(f"{mod.__name__}.g")
        return "data"

    ops = FgraphOps(entry, lambda *r: got.append((r[3], r[9])),
                    filter=f"{mod.__name__}.b", name="dropper")
    eng.register_ftrace_graph(ops)
    try:
        assert list(mod.b()) == [1, 2]
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


@_per_core
def entry_filter_drop_loses_return() -> bool:
    """Bug: an entry handler that takes the entered function out of every filter loses the
    call's normal return (its return events go off: the entry is not on the stack yet)."""
    return reproduce_entry_handler_drops_own_function() != ([("data", 0)], [("data", 0)])


@_per_core
def entry_filter_drop_loses_generator_return() -> bool:
    """Bug: the same for a generator or coroutine: while its entry handlers run, its record
    has no claim yet, and the engine's sweep takes such a record for a marker, reading the
    code from ``rec[0]``, which for a generator record is the frame (the match key): the code
    is not seen as open, its return events go off, the return is lost."""
    return reproduce_entry_handler_drops_own_generator() != ([("data", 0)], [("data", 0)])


@_per_core
def discarded_claim_counted() -> bool:
    """Bug: a claim discarded because its user left from its own entry handler stays on the
    record and is later counted in ``unfinished_returns`` though no handler is called."""
    return reproduce_discarded_claim_counted()[1] != 1


def reproduce_discarded_claim_counted_as_closed() -> tuple[list, int]:
    """A and B hook a generator; B leaves from its own entry handler (its entry is discarded);
    the generator is closed while suspended at a yield outside any try (CPython 3.13 fires no
    event: the call is delivered with FLAG_CLOSED when A leaves). Returns (returns seen,
    growth of ``closed_returns``); the contract: one return (A's), counted once."""
    mod = probe_module()
    eng = get_engine()
    got: list = []
    a = FgraphOps(lambda *_: "a-data", lambda *r: got.append(("A", r[3], r[9])),
                  filter=f"{mod.__name__}.b", name="A")

    def b_entry(*_):
        eng.unregister_ftrace_graph(b)
        return "b-data"

    b = FgraphOps(b_entry, lambda *r: got.append(("B", r[3], r[9])),
                  filter=f"{mod.__name__}.b", name="B")
    eng.register_ftrace_graph(a)
    eng.register_ftrace_graph(b)
    before = eng.stats()["closed_returns"]
    try:
        gen = mod.b()
        next(gen)
        gen.close()
        del gen
    finally:
        for ops in (a, b):
            if ops in eng.users:
                eng.unregister_ftrace_graph(ops)
    return got, eng.stats()["closed_returns"] - before


@_per_core
def discarded_claim_counted_as_closed() -> bool:
    """Bug: the same discarded claim is counted in ``closed_returns`` when its generator's call
    is delivered with FLAG_CLOSED (3.13: closing a generator at a yield outside any try)."""
    got, counted = reproduce_discarded_claim_counted_as_closed()
    return counted > len(got)


def probe_all() -> None:
    other_entry_unregister_loses_claim()
    last_user_entry_unregister_leaks_record()
    entry_filter_drop_loses_return()
    entry_filter_drop_loses_generator_return()
    discarded_claim_counted()
    discarded_claim_counted_as_closed()
