"""Property tests of the hook engine: random programs under random users with live changes.

Each example generates a program (real Python source, imported as a module: plain calls,
recursion and mutual recursion, exceptions raised and caught at random depths, try/finally,
generators partly consumed / closed / thrown into / dropped / kept and resumed elsewhere,
``yield from``; or coroutines under ``asyncio.run`` with awaits, sleeps, ``gather`` and
orphan tasks), 1-6 random users (graph users with random filters and notrace, accept/decline
answers, unique entry data, some handlers failing on purpose; entry users), and random steps
performed while the program runs (register, unregister, re-register into the same slot,
set_filter / set_notrace, another tool's ``restart_events()``), from the program or from inside
the users' own handlers. The program logs what really happened; the checker
(tests/propgen/checker.py) replays that log against the engine's contract: entry handlers in
slot order exactly for the users whose filter selects the function, exactly one return per
accepted entry (normal with the real return value, exception with the very exception object,
FLAG_UNFINISHED inside the unregister that cut it short, FLAG_CLOSED for generators closed
silently), return handlers in reverse entry order right at the exit, entry data round trip,
no return without an accepted entry, no stale-slot firing, counters that match.

``RETHOOK_PROP_EXAMPLES=500`` (for instance) runs many more examples per test.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from propgen import Violation, actions, check, harness, known, programs, run, user_specs
from propgen.harness import _module_dir
from propgen.program import Call, Func, Program, Step, UseGen
from propgen.users import Action, UserSpec
from rethook.engine import select
from rethook.engine.core import FLAG_CLOSED, FLAG_UNFINISHED
from rethook.engine.engine import FgraphOps, get_engine
from rethook.engine.registry import Registry

_SCALE = int(os.environ.get("RETHOOK_PROP_EXAMPLES", "0"))


def _settings(n: int) -> settings:
    return settings(max_examples=_SCALE or n, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much,
                                           HealthCheck.function_scoped_fixture])


@st.composite
def scenarios(draw, is_async=False, entry_users=True, handler_steps=()):
    program = draw(programs(is_async=is_async))
    users = [draw(user_specs(program, entry_users, first=True, handler_steps=handler_steps))]
    users += draw(st.lists(user_specs(program, entry_users, handler_steps=handler_steps),
                           max_size=5))
    steps = draw(actions(program, len(users)))
    return program, users, steps


CORES = ["python"] + (["c"] if select.c_core_available() else [])


@pytest.fixture(params=CORES)
def core(request):
    """Run the test on each hook core: the process engine's core is swapped while it is
    stopped (the same examples, both cores: the pure one is the reference)."""
    eng = get_engine()
    assert not eng.running
    saved = eng.core
    eng.core = select.choose_core(request.param)
    try:
        yield request.param
    finally:
        assert not eng.running
        eng.core = saved


@pytest.fixture(scope="module", autouse=True)
def registry_import_hook():
    """Keep the registry's import hook on for this module's tests: each example imports a new
    module while no engine runs, and without a subscriber the registry would rescan the whole
    heap for it (a cost that grows with every example)."""
    unsubscribe = get_engine().registry.subscribe(lambda infos: None)
    yield
    unsubscribe()


def run_and_check(scenario) -> dict[str, int]:
    program, users, steps = scenario
    out = run(program, users, steps)
    counts = check(out)
    assert not get_engine().running
    return counts


def _user(filter=(("all",),), registered=True, **kw) -> UserSpec:
    spec = dict(kind="graph", filter=filter, notrace=(), decline_mod=0, decline_res=0,
                decline_value=None, falsy_data=False, registered=registered)
    spec.update(kw)
    return UserSpec(**spec)


# A registered, calls entered, A unregistered (its open calls: FLAG_UNFINISHED), B registered
# into A's slot, the calls return: B must see no return for entries it never accepted.
STALE_SLOT = (
    Program((Func("f0", "func", (Step(), Step(), Call("f0"))),), depth=2, entry="f0"),
    [_user(), _user(registered=False)],
    (Action("toggle", 0), Action("toggle", 1)),
)
# The same with a generator suspended across the swap, resumed and finished afterwards.
STALE_SLOT_GENERATOR = (
    Program((Func("f0", "func", (UseGen("g0", 1, "keep"), Step(), Step())),
             Func("f1", "func", ()),
             Func("g0", "gen", ())), depth=2, entry="f0"),
    [_user(), _user(registered=False)],
    (Action("swap", 0, 1),),
)
# A bare generator closed at a yield outside any try (3.13 fires no event: FLAG_CLOSED).
SILENT_CLOSE = (
    Program((Func("f0", "func", (UseGen("b0", 1, "close"), Step())),
             Func("b0", "bare", (), 2)), depth=2, entry="f0"),
    [_user(), _user(registered=False)],
    (Action("toggle", 1),),
)


@_settings(140)
@given(scenario=scenarios())
@example(scenario=STALE_SLOT)
@example(scenario=STALE_SLOT_GENERATOR)
@example(scenario=SILENT_CLOSE)
def test_sync_programs(scenario, core):
    run_and_check(scenario)


@_settings(60)
@given(scenario=scenarios(is_async=True))
def test_async_programs(scenario, core):
    run_and_check(scenario)


@_settings(40)
@given(scenario=scenarios())
def test_programs_loaded_past_the_import_hook(scenario, core):
    """Discovery: the program is loaded once the users are registered, the way plugin
    loaders do (``exec_module``), so the engine meets its code only as it runs; the same
    contract holds (its functions hooked from their first call)."""
    program, users, steps = scenario
    check(run(program, users, steps, late=True))
    assert not get_engine().running


@_settings(100)
@given(scenario=st.booleans().flatmap(
    lambda is_async: scenarios(is_async=is_async, handler_steps=("entry", "ret"))))
def test_steps_from_inside_handlers(scenario, core):
    """Register, unregister, set_filter from the users' own entry and return handlers.

    propgen.known probes for the engine bugs these tests once found, so runs would steer around
    any that came back; the tests below reproduce each one."""
    run_and_check(scenario)


# --- the checker is not vacuous ---------------------------------------------------------------
def test_the_checker_notices_a_tampered_log(core):
    """Missing, doubled, reordered or foreign returns in a real run's log are all reported."""
    program, users, steps = STALE_SLOT
    out = run(program, [_user(), _user()], ())
    counts = check(out)
    assert counts["multi_claim_exits"] and counts["normal"] == 2 * counts["calls"]
    log = out.log
    rets = [i for i, ev in enumerate(log) if ev[0] == "R"]

    def tampered(new_log):
        out.log = new_log
        with pytest.raises(Violation):
            check(out)

    tampered(log[:rets[0]] + log[rets[0] + 1:])  # a return missing
    tampered(log[:rets[0] + 1] + [log[rets[0]]] + log[rets[0] + 1:])  # a return twice
    first, second = rets[0], rets[0] + 1
    assert log[second][0] == "R"
    tampered(log[:first] + [log[second], log[first]] + log[second + 1:])  # wrong order
    foreign = log[rets[0]][:3] + (object(),) + log[rets[0]][4:]
    tampered(log[:rets[0]] + [foreign] + log[rets[0] + 1:])  # data never accepted
    out.log = log
    check(out)


def test_a_generator_of_an_earlier_run_stays_out_of_a_later_runs_log(core, monkeypatch):
    """Found as a rare flake ("exit of call N that is not open"): a generator left by an earlier
    run of the same program (garbage the GC had not collected yet) was finalised while a later
    run of that program ran, and its exit went into the later run's log."""
    program = STALE_SLOT_GENERATOR[0]
    out = run(program, [_user()], ())
    mod = sys.modules[out.module]
    stale = mod.g0(mod._nc(), 1)  # a call of that run, suspended at its yield
    next(stale)
    run_entry = harness.run_entry

    def drop_then_run(*args):
        nonlocal stale
        stale = None  # finalised (GeneratorExit) as the later run's program starts
        return run_entry(*args)

    monkeypatch.setattr(harness, "run_entry", drop_then_run)
    check(run(program, [_user()], ()))
    assert stale is None


# --- engine bugs found by these tests: minimal reproducers ---------------------------------------
def test_a_declined_call_that_raises_keeps_the_programs_exception(core):
    """Found by the property tests (fixed): the exit of a declined call (a marker on the shadow
    stack) by an exception read a record field from the marker and raised IndexError into the
    program in place of the program's own exception."""
    mod = known.probe_module()
    eng = get_engine()
    ops = FgraphOps(lambda *_: None, lambda *_: None, filter=f"{mod.__name__}.r")
    eng.register_ftrace_graph(ops)
    try:
        internal = eng.stats()["internal_errors"]
        with pytest.raises(KeyError, match="the program's own"):
            mod.r()
        assert eng.stats()["internal_errors"] == internal
    finally:
        eng.unregister_ftrace_graph(ops)
    assert not eng.running


def test_unregister_from_another_users_entry_handler_delivers_the_claim(core):
    """Found by the property tests (fixed: the record is pushed before the entry handlers run,
    and a discarded entry is not counted): user A accepts a call, then user B's entry
    handler for the same call unregisters A; the record being built in _on_start is not on
    the shadow stack yet, so the sweep misses A's claim: unregister(A) returns without A's
    FLAG_UNFINISHED return and A never gets a return for an entry it accepted.
    """
    got = known.reproduce_unregister_from_other_entry_handler()
    assert not get_engine().running
    assert got == [("a-data", FLAG_UNFINISHED), "unregistered"]


def test_last_user_leaving_from_its_entry_handler_leaves_no_record(core):
    """Found by the property tests (fixed: the record is pushed before the entry handlers run,
    and a discarded entry is not counted): when the last user unregisters itself from its
    entry handler, the engine stops (and clears the shadow stacks) inside _on_start, which
    then pushes the call's record onto the cleared stack: a record stays behind after stop
    (stats open_calls=1), the next session's depths are off by one and its
    unfinished_returns counts a delivery to nobody.
    """
    stats = known.reproduce_last_user_leaves_from_entry_handler()
    assert not get_engine().running
    assert stats["open_calls"] == 0


def test_set_filter_from_an_entry_handler_keeps_the_calls_normal_return(core):
    """Found by the property tests (fixed: the record is pushed before the entry handlers run,
    and a discarded entry is not counted): an entry handler whose set_filter takes the
    entered function out of every filter: the accepted call is not on the shadow stack yet,
    so the reconcile sees no open call of that function and turns its return events off at
    once (no draining); the call's normal return is lost, delivered only as FLAG_UNFINISHED
    at unregister.
    """
    at_return, total = known.reproduce_entry_handler_drops_own_function()
    assert not get_engine().running
    assert at_return == [("data", 0)] and total == [("data", 0)]


def test_set_filter_from_an_entry_handler_keeps_a_generators_normal_return(core):
    """Found by the property tests (fixed): the generator twin of the bug above. While its
    entry handlers run, a generator's record has no claim yet, and the sweep took such a
    record for a marker and named rec[0] as the open code; but a generator record's key is
    its frame, so the generator was not seen as open, its return events went off at once
    and its normal return was lost (delivered only as FLAG_UNFINISHED later)."""
    at_return, total = known.reproduce_entry_handler_drops_own_generator()
    assert not get_engine().running
    assert at_return == [("data", 0)] and total == [("data", 0)]


def test_a_discarded_entry_is_not_counted_as_an_unfinished_return(core):
    """Found by the property tests (fixed: the record is pushed before the entry handlers run,
    and a discarded entry is not counted): an entry discarded because its user unregistered
    itself from its entry handler stays as a claim (to a stubbed registration) on the
    record; a later sweep (another user leaving, engine stop) counts it in
    stats()['unfinished_returns'] although no handler is called.
    """
    got, counted = known.reproduce_discarded_claim_counted()
    assert not get_engine().running
    assert got == [("B", FLAG_UNFINISHED)] and counted == 1


@pytest.mark.skipif(sys.version_info < (3, 13), reason=(
    "3.12 fires PY_THROW/PY_UNWIND when such a generator is closed: no FLAG_CLOSED delivery"))
def test_a_discarded_entry_is_not_counted_as_a_closed_return(core):
    """Found by the property tests (fixed): on 3.13 an entry discarded because its user
    unregistered itself from its entry handler still counted in stats()['closed_returns']
    when its generator was closed silently and collect_parked delivered the call with
    FLAG_CLOSED (every claim on the record was counted, the discarded one included)."""
    got, counted = known.reproduce_discarded_claim_counted_as_closed()
    assert not get_engine().running
    assert got == [("A", "a-data", FLAG_CLOSED)] and counted == 1


def test_registry_sees_an_import_after_a_module_was_removed():
    """Found by the property tests (fixed): with no subscriber (no engine running) the registry
    noticed new imports by ``len(sys.modules)`` changing; a module removed from sys.modules and
    another imported left the length unchanged, so the new module was never listed and a
    filter naming it raised FilterError."""
    d = _module_dir()
    names = [f"rh_regcount_{os.getpid()}_{i}" for i in range(2)]
    for n in names:
        with open(os.path.join(d, n + ".py"), "w") as f:
            f.write("def fn():\n    return 1\n")
    importlib.invalidate_caches()
    reg = Registry()
    importlib.import_module(names[0])
    assert any(i.module == names[0] for i in reg.functions())
    sys.modules.pop(names[0])
    importlib.import_module(names[1])
    assert any(i.module == names[1] for i in reg.functions())
