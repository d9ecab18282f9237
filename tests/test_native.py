"""The native users (function, function_graph, profiler in C) against the Python users.

On the C core the built-in tracers run native users by default. Each test here runs the same
real program twice in one process, once with the native users and once with the Python users
(``TraceContext.native_users = False``), and requires the same trace: the same lines once
durations, timestamps and thread ids are normalised, the same profiler hits.
"""

import asyncio
import gc
import sys
import threading

import pytest

from programs import calls, gens, shapes, stdlib_heavy
from rethook.control import Tracefs
from rethook.tracers import native
from rethook.tracers.function_graph import GraphOps, NativeGraphOps
from rethook.tracers.profiler import NativeProfileOps, ProfileOps
from test_tracers import normalise

pytestmark = pytest.mark.skipif(native._native is None, reason="the native users are not built")


@pytest.fixture
def on_c_core(engine):
    if not engine.core.capabilities.native_users:
        pytest.skip(f"the {engine.core.name} core runs no native users")
    return engine


def run_traced(program, *, native_users: bool, tracer: str = "function_graph",
               settings: dict[str, str] | None = None, filt: str = "*:mod:programs.*"):
    fs = Tracefs()
    try:
        fs.ctx.native_users = native_users
        fs.write("buffer_size_kb", "4096")
        for path, value in (settings or {}).items():
            fs.write(path, value)
        fs.write("set_ftrace_filter", filt)
        fs.write("current_tracer", tracer)
        ops_type = type(fs.tracer.ops)
        program()
        fs.write("tracing_on", "0")
        return normalise(fs.read("trace")), ops_type
    finally:
        fs.close()


def both(program, **kw):
    gc.collect()
    got, native_type = run_traced(program, native_users=True, **kw)
    gc.collect()
    want, python_type = run_traced(program, native_users=False, **kw)
    return got, want, native_type, python_type


def shapes_program():
    shapes.top(3)
    shapes.noisy()


def recursion_program():
    calls.fib(12)
    seen = []
    calls.catch_at(5, 25, seen)
    try:
        calls.with_finally([])
    except calls.Boom:
        pass


def generators_program():
    list(gens.count(5))
    list(gens.delegate(3))
    asyncio.run(gens.gather_naps())
    asyncio.run(gens.consume_agen(3))


def threads_program():
    def work(n):
        for _ in range(3):
            calls.fib(n)
    threads = [threading.Thread(target=work, args=(8 + i,), name=f"w{i}") for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("program", [shapes_program, recursion_program, generators_program])
@pytest.mark.parametrize("settings", [
    {},
    {"options/sleep-time": "0"},
    {"options/funcgraph-tail": "1", "options/funcgraph-proc": "1"},
    {"set_graph_function": "programs.calls.fib programs.shapes.middle programs.gens.count"},
    {"set_graph_notrace": "programs.shapes.middle programs.calls.fib"},
    {"max_graph_depth": "3"},
], ids=["default", "nosleep", "tail-proc", "graph_function", "graph_notrace", "depth3"])
def test_function_graph_native_equals_python(on_c_core, program, settings):
    got, want, native_type, python_type = both(program, settings=settings)
    assert native_type is NativeGraphOps and python_type is GraphOps
    assert len(want) > 6
    assert got == want


def test_function_graph_threads_native_equals_python(on_c_core):
    got, want, *_ = both(threads_program)
    # threads interleave differently from run to run: compare each thread's own lines
    def per_thread(lines):
        out: dict[str, list[str]] = {}
        for line in lines[4:]:
            col, _, rest = line.partition(")")
            out.setdefault(col, []).append(rest)
        return sorted(out.values())
    assert len(per_thread(want)) == 3  # three workers
    assert per_thread(got) == per_thread(want)


def test_tracing_thresh_records_only_slow_exits(on_c_core):
    got, want, *_ = both(shapes.mixed, settings={"tracing_thresh": "10000"})
    assert got == want
    body = [line for line in got if not line.startswith("#")]
    assert [line.split("|", 1)[1].strip() for line in body] == [
        "} /* programs.shapes.slow */", "} /* programs.shapes.mixed */"]


def callers_program():
    """Calls of hooked functions from every kind of caller: a function, a builtin (no Python
    frame between), a comprehension, a lambda, a generator, a coroutine and this module."""
    recursion_program()
    shapes_program()
    sorted(range(5), key=shapes.leaf)
    list(map(shapes.middle, range(3)))
    [shapes.leaf(i) for i in range(3)]
    (lambda: shapes.top(1))()
    generators_program()


@pytest.mark.parametrize("settings", [{}, {"trace_options": "sym-offset"}],
                         ids=["default", "sym-offset"])
def test_function_tracer_native_equals_python(on_c_core, settings):
    """The native function user reads the caller from the interpreter's frames
    (engine/pyframe.h), the Python user from frame.f_back: same callers, same lines."""
    got, want, *_ = both(callers_program, tracer="function", settings=settings)
    assert len(want) > 100
    assert got == want


def test_python_only_options_fall_back_to_the_python_user(on_c_core):
    for option in ("funcgraph-retval", "funcgraph-args"):
        fs = Tracefs()
        try:
            fs.write(f"options/{option}", "1")
            fs.write("set_ftrace_filter", "*:mod:programs.shapes")
            fs.write("current_tracer", "function_graph")
            assert type(fs.tracer.ops) is GraphOps, option
            shapes.middle(1)
            fs.write("tracing_on", "0")
            assert ("= 4" if option == "funcgraph-retval" else "x=1") in fs.read("trace")
        finally:
            fs.close()
    ctx_reason = native.native_unavailable
    fs = Tracefs()
    try:
        fs.write("options/funcgraph-retval", "1")
        assert (ctx_reason(fs.ctx, "function_graph")
                == "option funcgraph-retval needs the Python user")
        fs.write("options/funcgraph-retval", "0")
        assert ctx_reason(fs.ctx, "function_graph") is None
    finally:
        fs.close()


def _hits(fs) -> dict[str, int]:
    out = {}
    for line in fs.read("trace_stat/function0").splitlines()[2:]:
        name, hit = line.split()[:2]
        out[name] = int(hit)
    return out


def _profile(program, native_users: bool, graph_time: str = "1"):
    fs = Tracefs()
    try:
        fs.ctx.native_users = native_users
        fs.write("options/graph-time", graph_time)
        fs.write("set_ftrace_filter", "*:mod:programs.*")
        fs.write("function_profile_enabled", "1")
        kind = type(fs.profiler.ops)
        program()
        fs.write("function_profile_enabled", "0")
        return fs, kind
    except BaseException:
        fs.close()
        raise


@pytest.mark.parametrize("graph_time", ["1", "0"])
def test_profiler_native_hits_equal_python(on_c_core, graph_time):
    def program():
        recursion_program()
        generators_program()
        stdlib_heavy.main()
    results = []
    for native_users in (True, False):
        fs, _ = _profile(program, native_users, graph_time)
        try:
            ops = fs.profiler.last
            assert type(ops) is (NativeProfileOps if native_users else ProfileOps)
            results.append((_hits(fs), ops.rows()))
        finally:
            fs.close()
    (native_hits, native_rows), (python_hits, _) = results
    assert len(python_hits) > 15
    assert native_hits == python_hits
    by_code = {}
    for _, code, hit, _prim, t, sq, _total, _self in native_rows:
        by_code.setdefault(code.co_name, []).append((hit, t, sq))
        assert hit >= 1 and sq >= 0
        if graph_time == "1":
            assert t >= 0
    # fib's time includes its children's with graph-time on, excludes them with it off
    (fib_hit, fib_time, _), = by_code["fib"]
    assert fib_hit == calls_of_fib(12)


def calls_of_fib(n: int) -> int:
    return 1 if n < 2 else 1 + calls_of_fib(n - 1) + calls_of_fib(n - 2)


@pytest.mark.parametrize("graph_time", ["1", "0"])
def test_profiler_self_time_is_total_minus_children(on_c_core, graph_time):
    """outer's self time is its total minus the time of the leaf calls under it, exactly,
    and the kernel's Time column is the total with graph-time on, the self time with it off.
    Every figure comes from one run, so nothing depends on how long a call took."""
    fs, _ = _profile(lambda: [calls.outer(i) for i in range(200)], True, graph_time)
    try:
        rows = {r[1].co_name: r[2:] for r in fs.profiler.last.rows()}
        edges = {(e[1].co_name, e[2].co_name): e[3:] for e in fs.profiler.last.edges()
                 if e[1] is not None}
    finally:
        fs.close()
    hit, _prim, time_ns, _sq, total, self_ = rows["outer"]
    leaf_hit, _, leaf_time, _, leaf_total, leaf_self = rows["leaf"]
    assert hit == 200 and leaf_hit == 400  # outer calls leaf twice
    e_hit, _, e_total, _e_self = edges[("outer", "leaf")]
    assert e_hit == 400 and e_total == leaf_total
    assert self_ == total - e_total
    assert leaf_self == leaf_total == leaf_time  # a leaf's self time is its total
    assert time_ns == (total if graph_time == "1" else self_)


def test_deep_recursion_and_teardown_with_open_calls(on_c_core):
    """10,000-deep recursion recorded natively; tracing stopped while calls are open
    closes them as unfinished exits, exactly once each."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 12000))
    fs = Tracefs()
    try:
        fs.write("buffer_size_kb", "65536")
        fs.write("set_ftrace_filter", "programs.calls.deep")
        fs.write("current_tracer", "function_graph")
        assert type(fs.tracer.ops) is NativeGraphOps
        calls.deep(10_000)
        fs.write("tracing_on", "0")
        events = fs.ctx.buffer.snapshot()
    finally:
        fs.close()
    entries = [e for e in events if e[0] == 2]
    exits = [e for e in events if e[0] == 3]
    assert len(entries) == len(exits) == 10_001
    assert max(e[3] for e in entries) == 10_000


@pytest.mark.parametrize("overwrite", [True, False])
def test_a_ring_that_fills_keeps_whole_calls_in_order(on_c_core, overwrite):
    """The smallest ring, filled many times over by plain direct calls (whose hooks write
    through the fast lane while the ring's records are quiet, and the general path once they
    hold what they overwrite or the ring passes its mark): what it keeps is a run of whole
    events in time order, newest last when it overwrites, oldest first when it refuses, and
    the rest is counted as lost."""
    fs = Tracefs()
    try:
        fs.write("buffer_size_kb", "1")
        fs.write("options/overwrite", "1" if overwrite else "0")
        fs.write("set_ftrace_filter", "programs.calls.fib")
        fs.write("current_tracer", "function_graph")
        assert type(fs.tracer.ops) is NativeGraphOps
        assert calls.fib(14) == 377
        fs.write("tracing_on", "0")
        events = fs.ctx.buffer.snapshot()
        totals = fs.ctx.buffer.totals()
    finally:
        fs.close()
    calls_made = 1219  # fib(14)'s calls: two events each
    assert 0 < len(events) < 2 * calls_made
    assert (totals.written, totals.lost) == (2 * calls_made, 2 * calls_made - len(events))
    assert [e[1] for e in events] == sorted(e[1] for e in events)
    assert {e[0] for e in events} <= {2, 3} and {e[4] for e in events} == {"programs.calls.fib"}
    for e in events:
        if e[0] == 3:
            assert e[5] <= e[1] and e[8] == 0  # calltime before the exit, no flags
    last = events[-1] if overwrite else events[0]
    assert last[0] == (3 if overwrite else 2) and last[3] == 0  # the outermost call's end/start


def test_unfinished_exit_when_tracing_ends_inside_a_call(on_c_core):
    fs = Tracefs()
    started, release = threading.Event(), threading.Event()
    t = threading.Thread(target=calls.block, args=(started, release))
    try:
        fs.write("set_ftrace_filter", "*:mod:programs.calls")
        fs.write("current_tracer", "function_graph")
        assert type(fs.tracer.ops) is NativeGraphOps
        calls.outer(1)
        t.start()
        started.wait()
    finally:
        fs.close()  # block() is open in t: its exit is delivered now, unfinished
        release.set()
        t.join()
    events = fs.ctx.buffer.snapshot()
    exits = [e for e in events if e[0] == 3 and e[4] == "programs.calls.block"]
    assert len(exits) == 1 and exits[0][8] & 1  # FLAG_UNFINISHED
    assert exits[0][2] == t.native_id  # stamped with the thread the call ran in
    outer_exits = [e for e in events if e[0] == 3 and e[4] == "programs.calls.outer"]
    assert len(outer_exits) == 1 and not outer_exits[0][8] & 1


def test_native_records_hold_no_program_objects(on_c_core):
    """Records keep code objects only: the program's values are never kept alive."""
    class Big:
        pass

    def make():
        return Big()

    import weakref
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "*make*")
        fs.write("current_tracer", "function_graph")
        obj = make()
        ref = weakref.ref(obj)
        del obj
        gc.collect()
        assert ref() is None
    finally:
        fs.close()


def test_no_leaks_over_many_runs(on_c_core):
    code = calls.fib.__code__

    def once():
        fs = Tracefs()
        try:
            fs.write("set_ftrace_filter", "programs.calls.fib")
            fs.write("current_tracer", "function_graph")
            fs.write("function_profile_enabled", "1")
            calls.fib(10)
            fs.write("function_profile_enabled", "0")
            fs.write("current_tracer", "nop")
            fs.write("trace", "")
        finally:
            fs.close()

    assert_flat(once, code, 20)


def assert_flat(once, code, runs: int) -> None:
    """``once()`` once to warm up, then ``runs`` times more: ``code``'s references and the
    number of objects the GC tracks stay where they were."""
    once()
    gc.collect()
    before = sys.getrefcount(code), len(gc.get_objects())
    for _ in range(runs):
        once()
    gc.collect()
    after = sys.getrefcount(code), len(gc.get_objects())
    assert after[0] == before[0]
    assert after[1] - before[1] < 200


def test_bad_native_user_input_is_a_clear_error():
    with pytest.raises(ValueError, match="kind must be"):
        native._native.NativeUser("bogus")
    with pytest.raises(TypeError, match="need a buffer"):
        native._native.NativeUser("function_graph")
    user = native._native.NativeUser("profile")
    with pytest.raises(AttributeError, match="no handler 'func'"):
        user.handler("func")
    with pytest.raises(TypeError, match="entry data of a native user"):
        user.handler("retfunc")(None, None, 0, object(), None, None, 0, 1, 0, 0)


# --- the direct entry (engine/fgraph_direct.h) -----------------------------------------------
def _dispatch_of(fs, func):
    return fs.ctx.engine._table[id(func.__code__)]


def test_direct_entry_only_where_the_native_user_is_alone(on_c_core):
    """Functions whose one user is the native function_graph get a direct entry (plain
    functions share it, generators' calls get direct records); functions shared with another
    user and funcgraph-overrun do not."""
    from rethook.probes import Kretprobe
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "programs.calls.fib programs.calls.leaf programs.gens.count")
        fs.write("current_tracer", "function_graph")
        direct = _dispatch_of(fs, calls.fib)[4]
        assert direct is not None and direct[0] is calls.fib.__code__
        assert direct[2] is fs.tracer.ops.direct
        gen_direct = _dispatch_of(fs, gens.count)[4]  # direct records (fgraph_direct.h)
        assert gen_direct is not None and gen_direct[0] is gens.count.__code__
        assert _dispatch_of(fs, gens.count)[3] is None  # (no marker: matched by frame)
        rp = Kretprobe("programs.calls.leaf", handler=lambda ri, v: None)
        assert _dispatch_of(fs, calls.leaf)[4] is not None
        rp.register()
        try:
            assert _dispatch_of(fs, calls.leaf)[4] is None  # two users: ordinary records
            assert _dispatch_of(fs, calls.fib)[4] is not None
        finally:
            rp.unregister()
        assert _dispatch_of(fs, calls.leaf)[4] is not None
        fs.write("options/funcgraph-overrun", "1")
        assert fs.tracer.ops.direct is None
        assert _dispatch_of(fs, calls.fib)[4] is None
    finally:
        fs.close()


def test_the_function_tracer_is_called_directly_where_it_is_alone(on_c_core):
    """The native function user is an entry user with a direct hook (fgraph_direct.h, "Direct
    calls of an entry user"): functions it alone hooks carry it, those another user shares
    (a kretprobe) do not, and a call through either records the same."""
    from rethook.probes import Kretprobe
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "programs.calls.fib programs.calls.leaf")
        fs.write("current_tracer", "function")
        direct = _dispatch_of(fs, calls.fib)[4]
        assert direct is not None and direct[2] is fs.tracer.ops.direct
        assert _dispatch_of(fs, calls.fib)[:2] == ((direct[1],), ())  # one entry user
        kp = Kretprobe("programs.calls.leaf", handler=lambda ri, v: None)
        kp.register()
        try:
            assert _dispatch_of(fs, calls.leaf)[4] is None  # two users: the ordinary call
            calls.fib(5)
            calls.leaf(1)
        finally:
            kp.unregister()
        assert _dispatch_of(fs, calls.leaf)[4] is not None
        lines = [line for line in fs.read("trace").splitlines() if not line.startswith("#")]
        assert sum("programs.calls.fib <-" in line for line in lines) == 15
        assert sum("programs.calls.leaf <-" in line for line in lines) == 1
    finally:
        fs.close()


def test_direct_and_ordinary_entries_mixed_on_one_stack(on_c_core):
    """A kretprobe (Python) shares some functions with the native user: those calls get
    records, the others direct entries, all on one shadow stack. The graph is the one the
    Python user makes, and the probe sees every return."""
    from rethook.probes import Kretprobe

    def program():
        calls.fib(9)
        calls.catch_at(3, 12, [])
        calls.outer(4)

    def run(native_users):
        seen = []
        rp = Kretprobe("programs.calls._down", handler=lambda ri, v: seen.append(v))
        rp.register()
        try:
            return run_traced(program, native_users=native_users), len(seen)
        finally:
            rp.unregister()

    (got, got_type), got_seen = run(True)
    (want, want_type), want_seen = run(False)
    assert got_type is NativeGraphOps and want_type is GraphOps
    assert got == want
    assert got_seen == want_seen == 13  # _down at depths 0..12 returns or raises


def test_direct_calls_stopped_from_another_thread_are_unfinished_once(on_c_core):
    """Unregistering while another thread is inside directly hooked calls: each open call
    gets one unfinished exit, in that thread's ring; the calls' real exits later add
    nothing; the next tracer starts clean on the same thread."""
    started, release = threading.Event(), threading.Event()

    def work():
        calls.outer(1)
        calls.block(started, release)

    fs = Tracefs()
    t = threading.Thread(target=work)
    try:
        fs.write("set_ftrace_filter", "programs.calls.block programs.calls.outer "
                 "programs.calls.leaf")
        fs.write("current_tracer", "function_graph")
        ops, engine = fs.tracer.ops, fs.ctx.engine
        t.start()
        started.wait()
        engine.unregister_ftrace_graph(ops)  # block() is open in t: swept from here
        events = fs.ctx.buffer.snapshot()
        release.set()
        t.join()
        after = fs.ctx.buffer.snapshot()
        engine.register_ftrace_graph(ops)  # (a new tracer would clear the buffer)
        calls.outer(2)
        fs.write("tracing_on", "0")
        again = fs.ctx.buffer.snapshot()
    finally:
        release.set()
        fs.close()
    block_exits = [e for e in events if e[0] == 3 and e[4] == "programs.calls.block"]
    assert len(block_exits) == 1 and block_exits[0][8] & 1  # FLAG_UNFINISHED
    assert block_exits[0][2] == t.native_id
    assert after == events  # block's real return came after the tracer left: nothing more
    mine = [(e[0], e[4]) for e in again if e[2] == threading.get_native_id()]
    assert mine[-6:] == [(2, "programs.calls.outer"), (2, "programs.calls.leaf"),
                         (3, "programs.calls.leaf"), (2, "programs.calls.leaf"),
                         (3, "programs.calls.leaf"), (3, "programs.calls.outer")]


def test_python_events_inside_native_calls_keep_their_order(on_c_core):
    """Events written from Python (a probe event) and records written in C share one clock:
    merged by time, a probe hit inside a directly hooked call lands between its entry and
    exit lines."""
    fs = Tracefs()
    try:
        fs.write("dynamic_events", "p:leafhit programs.calls.leaf x")
        fs.write("events/enable", "1")
        fs.write("set_ftrace_filter", "programs.calls.outer")
        fs.write("current_tracer", "function_graph")
        assert _dispatch_of(fs, calls.outer)[4] is not None
        for i in range(50):
            calls.outer(i)
        fs.write("tracing_on", "0")
        body = [line for line in fs.read("trace").splitlines() if not line.startswith("#")]
    finally:
        fs.close()
    kinds = ["hit" if "leafhit" in line else "entry" if line.rstrip().endswith("{")
             else "exit" for line in body]
    assert kinds == ["entry", "hit", "hit", "exit"] * 50


def test_publish_rejects_a_malformed_direct_entry(on_c_core):
    from rethook.engine import _ccore
    code = calls.fib.__code__
    reg = object()
    with pytest.raises(TypeError, match="direct entry"):
        _ccore.publish({id(code): ((), (reg,), 2, (code,), (code, reg))})
    with pytest.raises(ValueError):  # not a direct-hooks capsule
        _ccore.publish({id(code): ((), (reg,), 2, (code,), (code, reg, object()))})
    with pytest.raises(TypeError, match="direct entry"):  # two users cannot share one
        _ccore.publish({id(code): ((), (reg, reg), 2, (code,), (code, reg, None))})
    fdirect = Tracefs()
    try:
        fdirect.write("current_tracer", "function")
        capsule = fdirect.tracer.ops.direct
    finally:
        fdirect.close()
    with pytest.raises(TypeError, match="entry user's direct entry"):  # and a graph user
        _ccore.publish({id(code): ((reg,), (reg,), 2, (code,), (code, reg, capsule))})
    _ccore.publish({})


def test_calls_open_while_a_function_changes_between_direct_and_records(on_c_core):
    """A kretprobe joins (the function's new calls get records, the open call keeps its
    direct entry) and leaves again (a record's probe claim is swept, the native claim stays):
    every call of the function is in the graph exactly once, the probe sees the calls made
    while it was registered."""
    from rethook.probes import Kretprobe
    seen = []
    rp = Kretprobe("programs.calls.block", handler=lambda ri, v: seen.append(v))
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "programs.calls.block")
        fs.write("current_tracer", "function_graph")
        for step in ("join", "leave"):
            started, release = threading.Event(), threading.Event()
            t = threading.Thread(target=calls.block, args=(started, release))
            t.start()
            started.wait()
            if step == "join":
                assert _dispatch_of(fs, calls.block)[4] is not None  # t's call: direct
                rp.register()
                assert _dispatch_of(fs, calls.block)[4] is None
            else:
                rp.unregister()  # t's call has a record with both claims
                assert _dispatch_of(fs, calls.block)[4] is not None
            release.set()
            t.join()
            if step == "join":  # a call made while both are registered: a record
                started, release = threading.Event(), threading.Event()
                release.set()
                calls.block(started, release)
        fs.write("tracing_on", "0")
        events = fs.ctx.buffer.snapshot()
    finally:
        if rp.registered:
            rp.unregister()
        fs.close()
    entries = [e for e in events if e[0] == 2 and e[4] == "programs.calls.block"]
    exits = [e for e in events if e[0] == 3 and e[4] == "programs.calls.block"]
    assert len(entries) == len(exits) == 3
    assert [e[8] & 1 for e in exits] == [0, 0, 0]  # all real returns, none unfinished
    # the probe saw the calls that entered while it was registered: one returned, the other
    # was still open when it left (delivered unfinished: no return value)
    assert seen == ["released", None]


def test_threads_run_direct_calls_while_users_come_and_go(on_c_core):
    """Four threads run recursive calls while the main thread unregisters and registers the
    native graph user and a kretprobe on the same function, over and over: every thread's
    graph stays balanced (each entry has one exit, returned or unfinished), nothing is
    counted as an internal error, and the probe's entries and returns match."""
    from rethook.probes import Kretprobe
    stop = threading.Event()
    errors = []

    def work():
        try:
            for _ in range(400):  # ~27,000 calls: the ring never fills
                calls.fib(8)
                if stop.is_set():
                    break
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    probe_hits = []
    rp = Kretprobe("programs.calls.fib", handler=lambda ri, v: probe_hits.append(v))
    fs = Tracefs()
    threads = [threading.Thread(target=work) for _ in range(4)]
    try:
        fs.write("buffer_size_kb", "65536")
        fs.write("set_ftrace_filter", "programs.calls.fib")
        fs.write("current_tracer", "function_graph")
        ops, engine = fs.tracer.ops, fs.ctx.engine
        internal_before = engine.stats()["internal_errors"]
        for t in threads:
            t.start()
        for i in range(30):
            if i % 2:
                rp.register()
            else:
                engine.unregister_ftrace_graph(ops)
                engine.register_ftrace_graph(ops)
            if rp.registered:
                rp.unregister()
        for t in threads:
            t.join()
        fs.write("tracing_on", "0")
        events = fs.ctx.buffer.snapshot()
        internal_after = engine.stats()["internal_errors"]
    finally:
        stop.set()
        if rp.registered:
            rp.unregister()
        fs.close()
    assert errors == []
    assert internal_after == internal_before
    assert fs.ctx.buffer.totals().lost == 0
    per_thread: dict[int, list[int]] = {}
    for e in events:
        if e[0] in (2, 3):
            per_thread.setdefault(e[2], [0, 0])[e[0] - 2] += 1
    assert len(per_thread) == 4
    assert all(n_in == n_out > 0 for n_in, n_out in per_thread.values())
    assert all(v is None or isinstance(v, int) for v in probe_hits)


def test_first_call_on_a_thread_is_not_charged_for_its_ring(on_c_core):
    """A thread's ring is made on its first traced call; the call's entry time is taken after
    that, so a large buffer does not lengthen the first call (issue 9: honest timings). No
    timing threshold: the entry is stamped no earlier than the moment the ring was ready."""
    from rethook.engine.clock import now_ns

    fs = Tracefs()
    try:
        buf = fs.ctx.buffer
        ready: dict[int, int] = {}
        make = buf.native_local

        def native_local(name_of):
            ring = make(name_of)
            ready.setdefault(threading.get_native_id(), now_ns())
            return ring

        buf.native_local = native_local  # the native user asks the buffer for each thread
        fs.write("buffer_size_kb", "16384")
        fs.write("set_ftrace_filter", "programs.calls.fib")
        fs.write("current_tracer", "function_graph")
        assert fs.tracer.ops is not None and "Native" in type(fs.tracer.ops).__name__
        t = threading.Thread(target=calls.fib, args=(3,))
        t.start()
        t.join()
        calls.fib(2)
        fs.write("tracing_on", "0")
        events = list(buf.iter_trace())
    finally:
        fs.close()
    first: dict[int, tuple] = {}
    for ev in events:
        first.setdefault(ev[2], ev)
    assert len(first) == 2 and set(ready) == set(first)
    for tid, ev in first.items():
        assert ev[1] >= ready[tid], (tid, ev, ready[tid])


def test_a_thread_whose_ring_cannot_be_made_runs_untraced(on_c_core, capsys):
    """The native user makes a thread's ring on its first call (fgraph_direct.h's prepare
    hook, through Python). When that fails, each call of the thread is declined and counted
    as the user's error, its exit stays matched, and the program's results are unchanged;
    the other threads keep recording."""
    fs = Tracefs()
    try:
        buf = fs.ctx.buffer
        make = buf.native_local
        refused: set[int] = set()

        def native_local(name_of):
            if threading.current_thread() is not threading.main_thread():
                refused.add(threading.get_native_id())
                raise MemoryError("no ring for this thread")
            return make(name_of)

        buf.native_local = native_local
        fs.write("set_ftrace_filter", "programs.calls.fib")
        fs.write("current_tracer", "function_graph")
        assert "Native" in type(fs.tracer.ops).__name__
        out: list[int] = []
        t = threading.Thread(target=lambda: out.append(calls.fib(6)))
        t.start()
        t.join()
        assert out == [8]
        assert calls.fib(3) == 2
        fs.write("tracing_on", "0")
        events = list(buf.iter_trace())
        errors = fs.ctx.engine.registration(fs.tracer.ops).errors
    finally:
        fs.close()
    assert len(refused) == 1 and not refused & {ev[2] for ev in events}
    assert len(events) == 2 * 5  # fib(3) on the main thread: 5 calls, entry and exit each
    assert errors == 25  # fib(6): 25 calls, each declined
    assert "no ring for this thread" in capsys.readouterr().err
