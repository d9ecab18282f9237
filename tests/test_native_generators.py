"""Direct records: generators and coroutines whose one user is the native function_graph.

The C core calls the native user's generator hooks (engine/fgraph_direct.h) with C values, and
keeps each such call in a *direct record*: a record list (so the engine's Python code sees an
ordinary record) whose three times are C fields. Each test runs a real program under the
native user and under the Python user (``TraceContext.native_users = False``, ordinary
records and Python handlers) and requires the same trace, or checks one of the engine's rules
on direct records: parking and resuming on another thread, exceptions thrown in, generators
closed early or abandoned, unregistering while calls are parked or open, overruns, threads
registering and unregistering while others run generators, no leaks.
"""

import asyncio
import gc
import queue
import threading

import pytest

from programs import calls, gens
from rethook.control import Tracefs
from rethook.engine.core import (
    FLAG_CLOSED,
    FLAG_UNFINISHED,
    REC_CODE,
    REC_FRAME,
    REC_HEADER,
    REC_KEY,
    REC_PARKED_AT,
    REC_SLEEP,
    REC_TIME,
    EntryKind,
    claims,
    entry_kind,
)
from rethook.tracers import native
from rethook.tracers.function_graph import GraphOps, NativeGraphOps
from test_native import _dispatch_of, assert_flat
from test_tracers import normalise

pytestmark = pytest.mark.skipif(native._native is None, reason="the native users are not built")


@pytest.fixture
def on_c_core(engine):
    if not engine.core.capabilities.native_users:
        pytest.skip(f"the {engine.core.name} core runs no native users")
    return engine

try:
    from rethook.engine._ccore import DirectRecord
except ImportError:  # the C core is not built: on_c_core skips every test
    DirectRecord = None
GENS = "*:mod:programs.gens programs.calls.leaf programs.calls.block"


def _events(fs):
    return fs.ctx.buffer.snapshot()


def _shape(events):
    """(type, depth, name, flags) of the function_graph events: what must not differ."""
    out = []
    for e in events:
        if e[0] == 3:
            out.append((3, e[3], e[4], e[8]))
        elif e[0] in (2, 4, 5):
            out.append((e[0], e[3], e[4]))
    return out


def _run_events(program, *, native_users, filt=GENS, settings=None):
    """Run program traced; its events (the buffer's tuples) after tracing stops."""
    fs = Tracefs()
    try:
        fs.ctx.native_users = native_users
        fs.write("buffer_size_kb", "4096")
        for path, value in (settings or {}).items():
            fs.write(path, value)
        fs.write("set_ftrace_filter", filt)
        fs.write("current_tracer", "function_graph")
        assert type(fs.tracer.ops) is (NativeGraphOps if native_users else GraphOps)
        program(fs)
        fs.write("tracing_on", "0")
        return _events(fs)
    finally:
        fs.close()


def _both_events(program, **kw):
    gc.collect()
    got = _run_events(program, native_users=True, **kw)
    gc.collect()
    want = _run_events(program, native_users=False, **kw)
    return got, want


# --- the record the engine sees -----------------------------------------------------------
def test_a_parked_direct_record_reads_like_a_record(on_c_core):
    """While a generator is parked, the engine's parked table holds a direct record: an
    ordinary record to Python (entry_kind, claims, the header by item access) whose times
    are exact, sleep growing with each suspension."""
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "programs.gens.count")
        fs.write("current_tracer", "function_graph")
        core, ops = fs.ctx.engine.core, fs.tracer.ops
        assert _dispatch_of(fs, gens.count)[4] is not None
        g = gens.count(5)
        next(g)
        frame = g.gi_frame
        rec = core.parked()[frame]
        assert type(rec) is DirectRecord and isinstance(rec, list)
        assert entry_kind(rec) is EntryKind.RECORD
        assert rec[REC_KEY] is rec[REC_FRAME] is frame and rec[REC_CODE] is gens.count.__code__
        ((reg, data),) = claims(rec)
        assert reg.ops is ops and type(data).__name__ == "NCall"
        t0, sleep0, parked0 = rec[REC_TIME], rec[REC_SLEEP], rec[REC_PARKED_AT]
        assert t0 > 0 and sleep0 == 0 and parked0 >= t0
        assert rec[-len(rec) + REC_TIME] == t0  # negative indices too
        assert list(rec)[:REC_HEADER] == rec[:REC_HEADER] == [frame, rec[REC_CODE], frame,
                                                              t0, 0, parked0]
        assert str(t0) in repr(rec)
        next(g)
        assert core.parked()[frame] is rec
        assert rec[REC_SLEEP] > 0 and rec[REC_PARKED_AT] > parked0 and rec[REC_TIME] == t0
        rec[REC_SLEEP] = 7  # item assignment writes the field (as core.py's callbacks do)
        assert rec[REC_SLEEP] == 7
        rest = list(g)
        assert rest == [2, 3, 4] and frame not in core.parked()
        fs.write("tracing_on", "0")
        events = _events(fs)
    finally:
        fs.close()
    kinds = [e[0] for e in events if e[4] == "programs.gens.count"]
    assert kinds == [2, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 3]
    exit_ = [e for e in events if e[0] == 3][0]
    assert exit_[7] >= 7 and exit_[8] == 0  # the sleep includes what was written


def test_a_second_user_gets_ordinary_records(on_c_core):
    """Only a lone C user gets direct records: with a second user (a kretprobe) the
    generator's calls get ordinary records with both claims, and direct records again when
    it leaves."""
    from rethook.probes import Kretprobe
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "programs.gens.count")
        fs.write("current_tracer", "function_graph")
        assert _dispatch_of(fs, gens.count)[4] is not None
        rp = Kretprobe("programs.gens.count", handler=lambda ri, v: None)
        rp.register()
        try:
            assert _dispatch_of(fs, gens.count)[4] is None
            g = gens.count(2)
            next(g)
            rec = fs.ctx.engine.core.parked()[g.gi_frame]
            assert type(rec) is list and len(claims(rec)) == 2
            assert list(g) == [1]
        finally:
            rp.unregister()
        assert _dispatch_of(fs, gens.count)[4] is not None
    finally:
        fs.close()


# --- the same trace as the Python user ----------------------------------------------------
def _thrown(fs):
    c = gens.catcher()
    next(c)
    assert c.throw(ValueError("x")) == "caught x"
    next(c)
    with pytest.raises(KeyError):
        c.throw(KeyError("k"))  # not caught: PY_THROW, then PY_UNWIND out of the generator
    g = gens.count(3)
    next(g)
    with pytest.raises(RuntimeError):
        g.throw(RuntimeError("r"))
    list(gens.delegate(2))


def _closed_early(fs):
    log = []
    g = gens.guarded(5, log)  # try/finally: close() throws GeneratorExit in (events)
    next(g)
    g.close()
    assert log == ["guarded-finally"]
    h = gens.count(5)  # no try: on 3.13.0 close() fires no event (CPython issue 140373)
    next(h)
    h.close()
    fs.ctx.engine.collect_parked()  # what stop would do: the closed call's exit, FLAG_CLOSED
    calls.leaf(1)


_KEPT: list = []


def _abandoned(fs):
    _KEPT.clear()
    for i in range(4):
        g = gens.count(10)
        next(g)
        if i % 2:
            _KEPT.append(g)  # still suspended when tracing ends: unfinished at teardown
    del g
    gc.collect()  # the others are collected while suspended
    fs.ctx.engine.collect_parked()  # their exits, FLAG_CLOSED


def _overflow(fs):
    """More suspended generators dropped than the parked table's high-water mark: the
    overflow hook (collect_parked) runs from the yield that passes it."""
    for _ in range(1500):
        g = gens.count(3)
        next(g)
    del g
    calls.leaf(1)


def _asyncio(fs):
    asyncio.run(gens.gather_naps())
    assert asyncio.run(gens.cancel_one()) == "cancelled"
    assert asyncio.run(gens.time_out()) == "timed out"
    asyncio.run(gens.consume_agen(3))


def _other_thread(fs):
    """Suspended on one thread, resumed on another, finished on the first."""
    g = gens.count(6)
    assert next(g) == 0
    t = threading.Thread(target=lambda: [next(g), next(g)], name="resumer")
    t.start()
    t.join()
    assert list(g) == [3, 4, 5]


def _new_thread(fs):
    """A generator whose call is a new thread's first traced event (the user prepares the
    thread from the generator's entry), then one parked there and resumed by another new
    thread (prepared from the resumption)."""
    t = threading.Thread(target=lambda: list(gens.count(3)), name="enterer")
    t.start()
    t.join()
    g = gens.count(4)
    t = threading.Thread(target=lambda: next(g), name="first")
    t.start()
    t.join()
    t = threading.Thread(target=lambda: list(g), name="second")
    t.start()
    t.join()


@pytest.mark.parametrize("program", [_thrown, _closed_early, _abandoned, _overflow, _asyncio,
                                     _other_thread, _new_thread])
@pytest.mark.parametrize("settings", [{}, {"options/sleep-time": "0"}, {"max_graph_depth": "1"},
                                      {"set_graph_notrace": "programs.gens.count"}],
                         ids=["default", "nosleep", "depth1", "notrace"])
def test_direct_records_trace_like_the_python_user(on_c_core, program, settings):
    got, want = _both_events(program, settings=settings)
    assert len(want) >= 4 or "set_graph_notrace" in settings  # (count is all some run)
    assert _shape(got) == _shape(want)
    # the times a direct record keeps in C: each exit's sleep is at most its duration
    for e in got:
        if e[0] == 3:
            assert 0 <= e[7] and e[5] <= e[1]
    if program is _closed_early and not settings:
        assert any(e[0] == 3 and e[8] & FLAG_CLOSED for e in got) == any(
            e[0] == 3 and e[8] & FLAG_CLOSED for e in want)


def test_trace_text_of_generators_equals_the_python_users(on_c_core):
    """The trace file's text, line for line (durations, timestamps, thread ids normalised)."""
    texts = {}
    for native_users in (True, False):
        gc.collect()
        fs = Tracefs()
        try:
            fs.ctx.native_users = native_users
            fs.write("set_ftrace_filter", GENS)
            fs.write("current_tracer", "function_graph")
            for program in (_thrown, _closed_early, _asyncio, _other_thread):
                program(fs)
            fs.write("tracing_on", "0")
            texts[native_users] = normalise(fs.read("trace"))
        finally:
            fs.close()
    assert len(texts[False]) > 20
    assert texts[True] == texts[False]


def test_a_generator_resumed_on_another_thread_records_there(on_c_core):
    events = _run_events(_other_thread, native_users=True, filt="programs.gens.count")
    main, other = threading.get_native_id(), None
    kinds = [(e[0], e[2] == main) for e in events]
    # entry and first suspension here, two resumes and suspensions there, the rest here
    assert kinds == [(2, True), (4, True), (5, False), (4, False), (5, False), (4, False),
                     (5, True), (4, True), (5, True), (4, True), (5, True), (4, True),
                     (5, True), (3, True)]
    other = {e[2] for e in events} - {main}
    assert len(other) == 1
    assert all(e[3] == 0 for e in events)  # depth 0 on both threads


def test_generators_prepare_the_threads_they_enter_and_resume_on(on_c_core):
    """A thread whose first traced event is a generator's entry or resumption gets its state
    then (gen_entry and gen_resume answer RH_DIRECT_PREPARE; the core prepares the thread):
    every event lands in the ring of the thread it happened on, none is missed."""
    events = _run_events(_new_thread, native_users=True, filt="programs.gens.count")
    by_thread: dict[int, list[int]] = {}
    for e in events:
        by_thread.setdefault(e[2], []).append(e[0])
    assert sorted(by_thread.values()) == sorted([
        [2, 4, 5, 4, 5, 4, 5, 3],  # enterer: the whole call
        [2, 4],                    # first: entry and first suspension
        [5, 4, 5, 4, 5, 4, 5, 3],  # second: the rest
    ])
    assert all(e[3] == 0 for e in events)


# --- teardown while calls are parked or open ----------------------------------------------
def test_unregister_while_a_generator_is_parked(on_c_core):
    """The parked call's exit is delivered once, unfinished, into the ring of the thread it
    last ran on; resuming and finishing it later adds nothing, and a new registration sees
    the generator's new calls only."""
    results = {}
    for native_users in (True, False):
        fs = Tracefs()
        try:
            fs.ctx.native_users = native_users
            fs.write("set_ftrace_filter", "programs.gens.count")
            fs.write("current_tracer", "function_graph")
            ops, engine = fs.tracer.ops, fs.ctx.engine
            g = gens.count(4)
            next(g)
            next(g)
            engine.unregister_ftrace_graph(ops)
            assert not engine.core.parked() or all(
                len(r) == REC_HEADER for r in engine.core.parked().values())
            swept = _events(fs)
            assert list(g) == [2, 3]
            assert _events(fs) == swept
            engine.register_ftrace_graph(ops)
            assert list(gens.count(1)) == [0]
            fs.write("tracing_on", "0")
            results[native_users] = _events(fs)
            assert engine.stats()["internal_errors"] == 0
        finally:
            fs.close()
    got, want = results[True], results[False]
    assert _shape(got) == _shape(want)
    exits = [e for e in got if e[0] == 3]
    assert [e[8] & FLAG_UNFINISHED for e in exits] == [FLAG_UNFINISHED, 0]
    assert exits[0][7] > 0  # the sleep of its first suspension, exact through Python


def _gen_blocking(started, release):
    yield 1
    calls.block(started, release)
    yield 2


def test_stop_while_a_generator_runs_in_another_thread(on_c_core):
    """Tracing stopped while a thread is inside a generator's body (its direct record on that
    thread's stack, under a plain call's direct entry): one unfinished exit each, newest
    first, in that thread's ring; their real ends add nothing."""
    started, release = threading.Event(), threading.Event()

    def work():
        for _ in _gen_blocking(started, release):
            pass

    t = threading.Thread(target=work)
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "*._gen_blocking programs.calls.block")
        fs.write("current_tracer", "function_graph")
        ops, engine = fs.tracer.ops, fs.ctx.engine
        t.start()
        started.wait()
        engine.unregister_ftrace_graph(ops)  # both open calls are swept from here
        events = _events(fs)
        release.set()
        t.join()
        after = _events(fs)
        engine.register_ftrace_graph(ops)  # (for the tracer's own teardown)
    finally:
        release.set()
        t.join()
        fs.close()
    assert after == events
    assert [e[0] for e in events] == [2, 4, 5, 2, 3, 3]
    exits = [e for e in events if e[0] == 3]
    assert [(e[4].rsplit(".", 1)[-1], e[8] & FLAG_UNFINISHED, e[2]) for e in exits] == [
        ("block", FLAG_UNFINISHED, t.native_id),
        ("_gen_blocking", FLAG_UNFINISHED, t.native_id)]


def test_a_generator_parked_by_a_thread_that_ended_resumes_elsewhere(on_c_core):
    """A thread's end flushes the calls on its stack, not the ones it parked: a generator it
    suspended resumes in another thread and ends there, traced whole."""
    def work(out):
        g = gens.count(3)
        next(g)
        out.append(g)

    out = []
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "programs.gens.count")
        fs.write("current_tracer", "function_graph")
        t = threading.Thread(target=work, args=(out,))
        t.start()
        t.join()
        gc.collect()
        assert out[0].gi_frame in fs.ctx.engine.core.parked()
        assert list(out[0]) == [1, 2]  # resumed here, after its thread ended
        fs.write("tracing_on", "0")
        events = _events(fs)
    finally:
        fs.close()
    assert [e[0] for e in events] == [2, 4, 5, 4, 5, 4, 5, 3]
    assert events[0][2] == t.native_id and events[-1][2] == threading.get_native_id()
    assert events[-1][8] == 0


# --- overruns, recursion, threads ------------------------------------------------------------
def test_overrun_and_recursion_with_direct_records(on_c_core):
    """Past the engine's max_depth a generator's call is counted as an overrun (no record);
    the calls within the limit are traced as by the Python user."""
    def program(fs):
        fs.ctx.engine.set_max_depth(1)
        try:
            list(gens.delegate(3))  # delegate -> count: count's entry (depth 1) overruns
            calls.outer(1)  # outer -> leaf: leaf's overruns
        finally:
            fs.ctx.engine.set_max_depth(None)

    got, want = _both_events(program, filt=GENS + " programs.calls.outer")
    assert _shape(got) == _shape(want)
    names = {e[4] for e in got if e[0] == 2}
    assert names == {"programs.gens.delegate", "programs.calls.outer"}  # the rest overran


def test_threads_pass_generators_around_while_users_come_and_go(on_c_core):
    """Threads resume generators other threads started, while the main thread unregisters
    and registers the native user over and over: every entry gets exactly one exit
    (returned, unfinished, or closed), no internal error, nothing lost."""
    q: queue.Queue = queue.Queue()
    stop = threading.Event()
    errors = []

    def producer():
        try:
            for _ in range(300):
                g = gens.count(4)
                next(g)
                q.put(g)
                if stop.is_set():
                    break
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            q.put(None)

    def consumer():
        try:
            while (g := q.get()) is not None:
                list(g)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    fs = Tracefs()
    threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
    try:
        fs.write("buffer_size_kb", "65536")
        fs.write("set_ftrace_filter", "programs.gens.count")
        fs.write("current_tracer", "function_graph")
        ops, engine = fs.tracer.ops, fs.ctx.engine
        internal_before = engine.stats()["internal_errors"]
        for t in threads:
            t.start()
        for _ in range(20):
            engine.unregister_ftrace_graph(ops)
            engine.register_ftrace_graph(ops)
        for t in threads:
            t.join()
        fs.write("tracing_on", "0")
        events = _events(fs)
        stats = engine.stats()
    finally:
        stop.set()
        fs.close()
    assert errors == []
    assert stats["internal_errors"] == internal_before
    assert stats["handler_errors"] == 0
    assert fs.ctx.buffer.totals().lost == 0
    n_in = sum(1 for e in events if e[0] == 2)
    n_out = sum(1 for e in events if e[0] == 3)
    assert n_in == n_out > 0


def test_no_leaks_with_direct_records(on_c_core):
    """Records, entry data and frames come back: refcounts and object counts stay flat, and
    no direct record outlives its call (beyond the core's freelist of 32)."""
    code = gens.count.__code__

    def once():
        fs = Tracefs()
        try:
            fs.write("set_ftrace_filter", "*:mod:programs.gens")
            fs.write("current_tracer", "function_graph")
            for _ in range(50):
                list(gens.count(3))
                list(gens.delegate(2))
                g = gens.count(3)
                next(g)
                g.close()
                c = gens.catcher()
                next(c)
                c.throw(ValueError("v"))
            asyncio.run(gens.gather_naps())
            fs.write("current_tracer", "nop")
            fs.write("trace", "")
        finally:
            fs.close()

    assert_flat(once, code, 5)
    assert sum(1 for o in gc.get_objects() if type(o) is DirectRecord) <= 32


_CAPSULE_NAME = b"rethook.engine.fgraph_direct"  # (a capsule keeps a pointer to its name)


def _first_version_capsule(capsule):
    """A capsule of the same hooks as a user of fgraph_direct.h's first version makes it: no
    context, so no generator hooks."""
    import ctypes
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_New.restype = ctypes.py_object
    api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    api.PyCapsule_GetContext.restype = ctypes.c_void_p
    api.PyCapsule_GetContext.argtypes = [ctypes.py_object]
    assert api.PyCapsule_GetContext(capsule)  # this version's: the struct's size
    return api.PyCapsule_New(api.PyCapsule_GetPointer(capsule, _CAPSULE_NAME), _CAPSULE_NAME,
                             None)


def test_a_user_without_generator_hooks_gets_ordinary_records(on_c_core):
    """A capsule without the generator hooks (no context: the first version's struct): its
    plain functions keep their direct entries, its generators get ordinary records and its
    Python handlers, with the same trace."""
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "programs.gens.count programs.calls.outer "
                 "programs.calls.leaf")
        fs.write("current_tracer", "function_graph")
        ops, engine = fs.tracer.ops, fs.ctx.engine
        ops.direct = _first_version_capsule(ops.direct)
        engine.unregister_ftrace_graph(ops)
        engine.register_ftrace_graph(ops)
        assert _dispatch_of(fs, gens.count)[4] is not None  # the engine offers it...
        g = gens.count(3)
        next(g)
        rec = engine.core.parked()[g.gi_frame]
        assert type(rec) is list and len(claims(rec)) == 1  # ...the core declines it
        calls.outer(1)  # (plain functions: direct entries, through the same capsule)
        assert list(g) == [1, 2]
        fs.write("tracing_on", "0")
        events = _events(fs)
    finally:
        fs.close()
    assert [(e[0], e[4].rsplit(".", 1)[-1]) for e in events] == [
        (2, "count"), (4, "count"), (2, "outer"), (2, "leaf"), (3, "leaf"), (2, "leaf"),
        (3, "leaf"), (3, "outer"), (5, "count"), (4, "count"), (5, "count"), (4, "count"),
        (5, "count"), (3, "count")]


@pytest.mark.parametrize("sleep_time", ["1", "0"])
def test_sleep_is_the_time_spent_suspended(on_c_core, sleep_time):
    """A generator suspended 30 ms twice: its exit's sleep is at least 60 ms, and with
    sleep-time off its duration leaves that out; the same with either user."""
    import time

    def program(fs):
        g = gens.count(3)
        next(g)
        time.sleep(0.03)
        next(g)
        time.sleep(0.03)
        assert list(g) == [2]

    for native_users in (True, False):
        events = _run_events(program, native_users=native_users, filt="programs.gens.count",
                             settings={"options/sleep-time": sleep_time})
        (exit_,) = [e for e in events if e[0] == 3]
        t1, calltime, sleep = exit_[1], exit_[5], exit_[7]
        assert sleep >= 60_000_000, native_users
        if sleep_time == "1":
            assert t1 - calltime >= sleep
        else:
            assert t1 - calltime < sleep  # its active time, well under the 60 ms asleep
