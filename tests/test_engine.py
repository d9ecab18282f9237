"""The hook engine on real programs: pairing, order, data, limits, errors, live changes."""

import sys

import pytest

from forking import fork_while_held
from programs import calls
from recorder import Recorder
from rethook.engine import toolid
from rethook.engine.core import FLAG_UNFINISHED
from rethook.engine.engine import FGRAPH_ARRAY_SIZE, Engine, EngineError, FgraphOps, FtraceOps
from rethook.engine.filters import FilterError

MOD = "*:mod:programs.calls"


def fib_calls(n):
    return 1 if n < 2 else 1 + fib_calls(n - 1) + fib_calls(n - 2)


def test_recursion_pairs_every_call(engine):
    rec = Recorder("fib")
    engine.register_ftrace_graph(rec)
    try:
        assert calls.fib(12) == 144
    finally:
        engine.unregister_ftrace_graph(rec)
    assert len(rec.entries) == fib_calls(12) == 465
    rec.assert_exactly_once()
    # every return carries the real value of its call, none is unfinished
    assert sorted({r[2] for r in rec.returns}) == [0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144]
    assert all(r[4] == 0 and r[3] is None for r in rec.returns)
    # depths: the outermost call is 0, a child is one deeper than its parent
    assert rec.entries[min(rec.entries)][1] == 0
    assert max(e[1] for e in rec.entries.values()) == 11


def test_mutual_recursion_and_nesting_order(engine):
    rec = Recorder("is_even is_odd")
    engine.register_ftrace_graph(rec)
    try:
        assert calls.is_even(7) is False
    finally:
        engine.unregister_ftrace_graph(rec)
    assert rec.names("enter") == ["is_even", "is_odd"] * 4
    # returns come back innermost first: a strict LIFO of the entries
    assert rec.returned() == sorted(rec.entries, reverse=True)


@pytest.mark.parametrize("at", range(5))
def test_exceptions_caught_at_every_level(engine, at):
    for level in range(at):
        rec = Recorder("_down")
        engine.register_ftrace_graph(rec)
        seen = []
        try:
            assert calls.catch_at(level, at, seen) == "caught"
        finally:
            engine.unregister_ftrace_graph(rec)
        rec.assert_exactly_once()
        (boom,) = seen
        by_depth = {rec.entries[r[0]][1]: r for r in rec.returns}
        assert sorted(by_depth) == list(range(at + 1))
        for depth, (_, _, retval, exc, flags, *_rest) in by_depth.items():
            if depth > level:  # frames the exception left: they see that very object
                assert exc is boom and retval is None
            else:  # the catching frame and its callers return normally
                assert exc is None and retval == "caught"
            assert flags == 0


def test_finally_and_uncaught_exception(engine):
    rec = Recorder("with_finally raiser")
    engine.register_ftrace_graph(rec)
    log = []
    try:
        with pytest.raises(calls.Boom) as info:
            calls.with_finally(log)
    finally:
        engine.unregister_ftrace_graph(rec)
    assert log == ["finally"]
    rec.assert_exactly_once()
    assert [r[1] for r in rec.returns] == ["raiser", "raiser", "raiser", "with_finally"]
    assert all(r[3] is info.value for r in rec.returns)


def test_return_handlers_run_in_reverse_entry_order(engine):
    log = []
    users = [Recorder("leaf outer", log=log, name=f"u{i}") for i in range(5)]
    for u in users:
        engine.register_ftrace_graph(u)
    try:
        assert calls.outer(3) == 14
    finally:
        for u in users:
            engine.unregister_ftrace_graph(u)
    names = [u.name for u in users]
    enter_outer = [e[0] for e in log[:5]]
    assert enter_outer == names  # slot order at entry
    # first leaf: entries in slot order, returns in reverse
    assert [(e[0], e[1]) for e in log[5:15]] == (
        [(n, "enter") for n in names] + [(n, "return") for n in reversed(names)])
    assert [(e[0], e[1]) for e in log[-5:]] == [(n, "return") for n in reversed(names)]
    for u in users:
        u.assert_exactly_once()


def test_entry_data_round_trip_and_declines(engine):
    # one user takes only even arguments, the other every call: each gets its own data back
    evens = Recorder("fib", accept=lambda code, frame: frame.f_locals["n"] % 2 == 0, name="e")
    every = Recorder("fib", name="a")
    engine.register_ftrace_graph(evens)
    engine.register_ftrace_graph(every)
    try:
        calls.fib(8)
    finally:
        engine.unregister_ftrace_graph(evens)
        engine.unregister_ftrace_graph(every)
    evens.assert_exactly_once()
    every.assert_exactly_once()
    assert len(every.entries) == fib_calls(8)
    assert set(evens.entries).isdisjoint(every.entries)
    assert 0 < len(evens.entries) < len(every.entries)
    # declined calls of the same function never disturb the pairing of accepted ones
    assert sorted(r[2] for r in evens.returns) == sorted(
        calls.fib(n) for n in _fib_args(8) if n % 2 == 0)


def _fib_args(n):
    yield n
    if n >= 2:
        yield from _fib_args(n - 1)
        yield from _fib_args(n - 2)


def test_declining_everything_hooks_no_return(engine):
    rec = Recorder("fib", accept=lambda code, frame: False)
    engine.register_ftrace_graph(rec)
    try:
        calls.fib(6)
    finally:
        engine.unregister_ftrace_graph(rec)
    assert rec.entries == {} and rec.returns == []


class SelfTime(FgraphOps):
    """The profiler's pattern: charge each child's duration to its parent's entry data."""

    def __init__(self, filter):
        super().__init__(filter=filter)
        self.self_time = {}

    def entryfunc(self, code, frame, depth, t):
        return [0]  # children's time

    def retfunc(self, code, frame, depth, data, retval, exc, t0, t1, sleep, flags):
        total = t1 - t0
        parent = self.parent_data()
        if parent is not None:
            parent[0] += total
        self.self_time.setdefault(code.co_name, []).append((total, data[0]))


def test_parent_data_charges_children_to_parents(engine):
    prof = SelfTime("outer leaf")
    engine.register_ftrace_graph(prof)
    try:
        calls.outer(1)
    finally:
        engine.unregister_ftrace_graph(prof)
    leaves = prof.self_time["leaf"]
    ((outer_total, outer_children),) = prof.self_time["outer"]
    assert len(leaves) == 2 and all(children == 0 for _, children in leaves)
    assert outer_children == sum(total for total, _ in leaves)
    assert outer_total >= outer_children


def test_task_var_is_per_thread_and_per_user(engine):
    import threading

    a, b = FgraphOps(filter="leaf"), FgraphOps(filter="leaf")
    a.task_var()["x"] = 1
    seen = {}

    def other():
        seen["a"] = dict(a.task_var())
        a.task_var()["x"] = 2

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["a"] == {} and a.task_var() == {"x": 1} and b.task_var() == {}


def test_slot_limit_is_a_clear_error(engine):
    users = [FgraphOps(filter="leaf", name=f"u{i}") for i in range(FGRAPH_ARRAY_SIZE)]
    for u in users:
        engine.register_ftrace_graph(u)
    try:
        with pytest.raises(EngineError, match=f"all {FGRAPH_ARRAY_SIZE} fgraph slots"):
            engine.register_ftrace_graph(FgraphOps(filter="leaf", name="one-too-many"))
        assert calls.outer(1) == 6
    finally:
        for u in users:
            engine.unregister_ftrace_graph(u)
    assert not engine.running


def test_overrun_past_max_depth_is_counted(engine):
    rec = Recorder("deep")
    engine.set_max_depth(10)
    engine.register_ftrace_graph(rec)
    try:
        assert calls.deep(50) == 50
        stats = engine.stats()
        nmissed = engine.registration(rec).nmissed
    finally:
        engine.unregister_ftrace_graph(rec)
        engine.set_max_depth(None)
    rec.assert_exactly_once()
    assert len(rec.entries) == 10
    assert stats["overrun"] == 41
    assert nmissed == 41


def test_ten_thousand_deep_recursion(engine):
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(30000)
    rec = Recorder("deep")
    engine.register_ftrace_graph(rec)
    try:
        assert calls.deep(10000) == 10000
    finally:
        engine.unregister_ftrace_graph(rec)
        sys.setrecursionlimit(old)
    assert len(rec.entries) == 10001
    rec.assert_exactly_once()


def test_handlers_may_call_hooked_code(engine):
    inner = []

    class Nosy(Recorder):
        def entryfunc(self, code, frame, depth, t):
            inner.append(calls.fib(5))  # hooked, but not hooked again from in here
            return super().entryfunc(code, frame, depth, t)

    rec = Nosy("fib")
    engine.register_ftrace_graph(rec)
    try:
        # (the count is this thread's since the process started: earlier tests' stay in it)
        recursion = engine.stats()["recursion"]
        assert calls.fib(4) == 3
        stats = engine.stats()
    finally:
        engine.unregister_ftrace_graph(rec)
    assert len(rec.entries) == fib_calls(4)
    rec.assert_exactly_once()
    assert inner == [5] * fib_calls(4)
    # CPython delivers no monitoring events inside a callback: those calls are invisible
    assert stats["recursion"] == recursion


def test_handlers_run_by_the_engine_are_protected_and_counted(engine):
    # A return delivered by unregister (here, for a suspended generator) runs outside any
    # sys.monitoring callback; hooked code it calls is skipped by the engine and counted.
    from programs import gens

    watcher = Recorder("fib", name="watcher")

    class CallsFib(Recorder):
        def retfunc(self, code, frame, depth, data, retval, exc, t0, t1, sleep, flags):
            calls.fib(3)
            super().retfunc(code, frame, depth, data, retval, exc, t0, t1, sleep, flags)

    caller = CallsFib("count", name="caller")
    engine.register_ftrace_graph(watcher)
    engine.register_ftrace_graph(caller)
    # (the count is this thread's since the process started: earlier tests' stay in it)
    recursion = engine.stats()["recursion"]
    try:
        g = gens.count(3)
        next(g)
        engine.unregister_ftrace_graph(caller)
        stats = engine.stats()
        assert list(g) == [1, 2]
    finally:
        engine.unregister_ftrace_graph(watcher)
    caller.assert_exactly_once()
    assert [r[4] for r in caller.returns] == [FLAG_UNFINISHED]
    assert watcher.entries == {}  # fib ran only inside the handler
    assert stats["recursion"] == recursion + fib_calls(3)


def test_handler_exceptions_never_reach_the_program(engine, capfd):
    class Broken(FgraphOps):
        def entryfunc(self, code, frame, depth, t):
            if code.co_name == "leaf":
                raise RuntimeError("entry handler bug")
            return True

        def retfunc(self, *args):
            raise KeyError("return handler bug")

    broken = Broken(filter="outer leaf", name="broken")
    fine = Recorder("outer leaf")
    engine.register_ftrace_graph(broken)
    engine.register_ftrace_graph(fine)
    try:
        for _ in range(3):
            assert calls.outer(2) == 10
        errors = engine.stats()["handler_errors"]
    finally:
        engine.unregister_ftrace_graph(broken)
        engine.unregister_ftrace_graph(fine)
    fine.assert_exactly_once()
    assert len(fine.entries) == 9
    assert errors == 6 + 3  # six leaf entries raised; three outer returns raised
    err = capfd.readouterr().err
    assert err.count("Traceback") == 1 and "entry handler bug" in err


def test_entry_users_see_function_and_caller(engine):
    seen = []
    ops = FtraceOps(lambda code, frame: seen.append((code.co_name, frame.f_back.f_code.co_name)),
                    filter="leaf outer")
    engine.register_ftrace_function(ops)
    try:
        calls.outer(1)
    finally:
        engine.unregister_ftrace_function(ops)
    assert seen == [("outer", "test_entry_users_see_function_and_caller"),
                    ("leaf", "outer"), ("leaf", "outer")]


def test_methods_properties_static_and_class_methods(engine):
    rec = Recorder("Shape.*")
    engine.register_ftrace_graph(rec)
    try:
        s = calls.Shape.make(3)
        assert s.double == 18 and calls.Shape.unit().area() == 1
    finally:
        engine.unregister_ftrace_graph(rec)
    assert rec.names() == ["make", "__init__", "double", "area", "unit", "__init__", "area"]
    rec.assert_exactly_once()


def test_unregister_mid_call_delivers_unfinished_and_then_nothing(engine):
    rec = Recorder("deep")
    state = {}

    def unregister_at_bottom(code, frame, depth, t):
        if frame.f_locals["n"] == 0 and "done" not in state:
            state["done"] = True
            engine.unregister_ftrace_graph(rec)
        return Recorder.entryfunc(rec, code, frame, depth, t)

    rec.entryfunc = unregister_at_bottom
    engine.register_ftrace_graph(rec)
    assert calls.deep(5) == 5
    assert not engine.running
    # the five open outer calls got FLAG_UNFINISHED while still open; the sixth entry (at
    # n == 0) was accepted by a handler whose user had just unregistered: discarded
    assert len(rec.entries) == 6 and len(rec.returns) == 5
    assert all(r[4] == FLAG_UNFINISHED for r in rec.returns)
    assert set(rec.returned()) == set(rec.entries) - {max(rec.entries)}


def test_a_stale_slot_never_fires_for_the_next_user(engine):
    first = Recorder("deep", name="first")
    second = Recorder("deep", name="second")

    def swap(code, frame, depth, t):
        if frame.f_locals["n"] == 0:
            engine.unregister_ftrace_graph(first)
            engine.register_ftrace_graph(second)  # takes the slot first just left
            return None
        return Recorder.entryfunc(first, code, frame, depth, t)

    first.entryfunc = swap
    engine.register_ftrace_graph(first)
    slot = engine.registration(first).index
    try:
        calls.deep(4)
        assert engine.registration(second).index == slot
    finally:
        engine.unregister_ftrace_graph(second)
    first.assert_exactly_once()
    assert second.entries == {} and second.returns == []


def test_live_filter_change(engine):
    rec = Recorder("leaf")
    engine.register_ftrace_graph(rec)
    try:
        calls.outer(1)
        rec.set_filter("outer")
        calls.outer(1)
        rec.set_filter("leaf", append=True)
        calls.outer(1)
    finally:
        engine.unregister_ftrace_graph(rec)
    assert rec.names() == ["leaf", "leaf", "outer", "outer", "leaf", "leaf"]
    rec.assert_exactly_once()


def test_filter_matching_nothing_is_an_error(engine):
    with pytest.raises(FilterError, match="no_such_function"):
        FgraphOps(filter="no_such_function_anywhere")


def test_unhooked_code_has_no_events(engine):
    rec = Recorder("leaf")
    engine.register_ftrace_graph(rec)
    try:
        tool = engine.tool_id
        assert sys.monitoring.get_local_events(tool, calls.leaf.__code__) != 0
        assert sys.monitoring.get_local_events(tool, calls.outer.__code__) == 0
        assert sys.monitoring.get_local_events(tool, calls.fib.__code__) == 0
    finally:
        engine.unregister_ftrace_graph(rec)
    assert sys.monitoring.get_tool(tool) is None  # the last user gave the id back


def test_one_tool_id_for_every_user_and_none_taken_from_others(engine):
    held = [i for i in range(6) if sys.monitoring.get_tool(i) is None and i != 4]
    for i in held:
        sys.monitoring.use_tool_id(i, f"other-{i}")
    try:
        users = [Recorder("leaf") for _ in range(3)]
        for u in users:
            engine.register_ftrace_graph(u)
        assert engine.tool_id == 4
        assert [sys.monitoring.get_tool(i) for i in range(6)].count("rethook") == 1
        for u in users:
            engine.unregister_ftrace_graph(u)
        sys.monitoring.use_tool_id(4, "other-4")
        with pytest.raises(toolid.ToolIdError, match="other-4"):
            engine.register_ftrace_graph(Recorder("leaf"))
    finally:
        for i in [*held, 4]:
            if sys.monitoring.get_tool(i) is not None and sys.monitoring.get_tool(i) != "rethook":
                sys.monitoring.free_tool_id(i)
    assert not engine.users


def test_another_tool_restarting_events_changes_nothing(engine):
    other = 3 if sys.monitoring.get_tool(3) is None else 5
    sys.monitoring.use_tool_id(other, "disabler")
    ev = sys.monitoring.events
    disables = []

    def disable(code, offset):
        disables.append(code.co_name)
        return sys.monitoring.DISABLE

    sys.monitoring.register_callback(other, ev.PY_START, disable)
    sys.monitoring.set_events(other, ev.PY_START)
    rec = Recorder("fib")
    engine.register_ftrace_graph(rec)
    try:
        calls.fib(5)
        sys.monitoring.restart_events()
        calls.fib(5)
        sys.monitoring.restart_events()
        calls.fib(5)
    finally:
        engine.unregister_ftrace_graph(rec)
        sys.monitoring.set_events(other, 0)
        sys.monitoring.register_callback(other, ev.PY_START, None)
        sys.monitoring.free_tool_id(other)
    assert len(rec.entries) == 3 * fib_calls(5)
    rec.assert_exactly_once()
    assert disables.count("fib") == 3  # the other tool saw its events re-armed each time


def test_works_beside_cprofile_and_coverage(engine):
    import cProfile
    import pstats

    import coverage

    rec = Recorder("fib")
    cov = coverage.Coverage(data_file=None, include=[calls.__file__])
    prof = cProfile.Profile()
    engine.register_ftrace_graph(rec)
    try:
        cov.start()
        prof.enable()
        calls.fib(10)
        prof.disable()
        cov.stop()
    finally:
        engine.unregister_ftrace_graph(rec)
    rec.assert_exactly_once()
    assert len(rec.entries) == fib_calls(10)
    stats = pstats.Stats(prof).stats
    (fib_stat,) = [v for k, v in stats.items() if k[2] == "fib"]
    assert fib_stat[1] == fib_calls(10)  # total calls, recursive included
    lines = cov.get_data().lines(calls.__file__)
    assert calls.fib.__code__.co_firstlineno + 1 in lines


def test_code_imported_after_registration_is_hooked(engine):
    import importlib

    sys.modules.pop("programs.late", None)
    rec = Recorder("*:mod:programs.late")
    engine.register_ftrace_graph(rec)
    try:
        late = importlib.import_module("programs.late")
        assert late.RESULT == 6  # computed while the module body ran, already hooked
        assert late.triple(3) == 9
    finally:
        engine.unregister_ftrace_graph(rec)
    assert rec.names() == ["triple", "triple"]
    rec.assert_exactly_once()


def test_keyboard_interrupt_from_an_entry_user_keeps_returns_matched(engine):
    # Ctrl-C arriving inside a handler reaches the program, but only after the engine's
    # bookkeeping: the interrupted call's exit still matches its own record.
    rec = Recorder("deep")

    def interrupt(code, frame):
        if frame.f_locals["n"] == 2:
            raise KeyboardInterrupt

    ops = FtraceOps(interrupt, filter="deep")
    engine.register_ftrace_graph(rec)
    engine.register_ftrace_function(ops)
    try:
        with pytest.raises(KeyboardInterrupt):
            calls.deep(4)
        assert calls.deep(1) == 1
    finally:
        engine.unregister_ftrace_function(ops)
        engine.unregister_ftrace_graph(rec)
    rec.assert_exactly_once()
    # deep(4) and deep(3) got the KeyboardInterrupt as their exception exit; the graph users
    # of deep(2), the interrupted call, never saw it (both cores); deep(1) and deep(0) then
    # returned normally: nothing drifted
    excs = [type(r[3]).__name__ for r in rec.returns]
    interrupted = 2
    assert excs == ["KeyboardInterrupt"] * interrupted + ["NoneType"] * 2


@pytest.mark.parametrize("started", [False, True])
def test_fork_while_another_thread_is_in_the_engine(started: bool) -> None:
    """A thread inside an engine method when the program forks (the engine running or not):
    the child's engine is usable, not locked by a thread the child does not have."""
    eng = Engine()
    if started:
        eng.start()
    try:
        assert fork_while_held(eng) == 0
    finally:
        eng.stop()
