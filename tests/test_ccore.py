"""The C core (rethook.engine._ccore): the same contract as the pure-Python core, under stress.

- ``choose_core`` and ``RETHOOK_ENGINE``;
- differential runs: one workload (plain calls, exceptions caught at every level, generators,
  ``throw``, generators collected while suspended, async code, several users that accept,
  decline, fail, need no frame or no time, an entry user, overruns and recursion) traced by
  each core must give the same handler calls with the same arguments, in the same order, and
  the same counters;
- stress on the C core: threads registering and unregistering users while others run traced
  code, many short threads, exceptions unwinding deep stacks, 10,000-deep recursion,
  generators collected while suspended, KeyboardInterrupt from handlers;
- no leaked references (refcounts of every object the core touches come back; object counts
  and traced memory stay flat over many rounds) and no crash under ``python -X dev``;
- the engine test modules run against the other core than this process's, in a subprocess,
  so one ``./dev.sh test`` run covers both cores.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import os
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from programs import calls, gens
from recorder import Recorder
from rethook.engine import core as pycore
from rethook.engine import select
from rethook.engine.core import FLAG_CLOSED
from rethook.engine.engine import Engine, FgraphOps, FtraceOps, get_engine

TESTS = os.path.dirname(os.path.abspath(__file__))
JOIN_SECONDS = 30  # bounds a wait that would otherwise hang the suite; never reached
ROOT = os.path.dirname(TESTS)

needs_c = pytest.mark.skipif(
    not select.c_core_available() and not os.environ.get("RETHOOK_REQUIRE_CCORE"),
    reason=f"the C core is not built: {select.C_CORE_ERROR}")


def test_c_core_is_built_here():
    """gcc and the Python headers are present on this machine: the build must have worked."""
    if os.environ.get("RETHOOK_ALLOW_NO_CCORE"):
        pytest.skip("RETHOOK_ALLOW_NO_CCORE is set")
    assert select.c_core_available(), select.C_CORE_ERROR


def _extensions() -> list[tuple[str, list[str]]]:
    """setup.py's extensions: (module, its sources and the headers it depends on)."""
    import ast

    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Extension":
            files = [elt.value for kw in node.keywords if kw.arg in ("sources", "depends")
                     for elt in kw.value.elts]
            out.append((node.args[0].value, files))
    return out


def test_every_extension_is_built_from_its_current_sources():
    """The extensions are optional: a build that fails leaves no error, only the previous
    build (or none), and the suite would test what that build does. Each must import, and
    be newer than its sources (an edited .c not rebuilt: ``pip install --no-deps -e .``)."""
    if os.environ.get("RETHOOK_ALLOW_NO_CCORE"):
        pytest.skip("RETHOOK_ALLOW_NO_CCORE is set")
    extensions = _extensions()
    assert len(extensions) >= 5
    for module, files in extensions:
        mod = importlib.import_module(module)
        if not mod.__file__.startswith(os.path.join(ROOT, "src")):
            continue  # an installed copy: its sources are not these
        built = os.path.getmtime(mod.__file__)
        stale = [f for f in files if os.path.getmtime(os.path.join(ROOT, f)) > built]
        assert not stale, f"{module} is older than {stale}: rebuild (pip install --no-deps -e .)"


@needs_c
def test_the_callbacks_are_called_through_their_own_vectorcall():
    """The callbacks CPython calls are the C core's Hook objects: positional arguments only,
    and a call without a hooked code object does nothing."""
    from rethook.engine import _ccore

    for name in ("on_start", "on_return", "on_unwind", "on_yield", "on_resume"):
        hook = getattr(_ccore, name)
        assert type(hook).__name__ == "Hook" and name in repr(hook)
        assert hook() is None
        with pytest.raises(TypeError, match=f"{name} takes no keyword arguments"):
            hook(code=None)


@needs_c
def test_the_fast_lanes_read_the_thread_state_where_the_interpreter_keeps_it(tmp_path):
    """fasttstate.h: on x86-64 glibc Linux the fast lanes read the thread state at its offset
    from the thread pointer, and every thread's first callback agrees (a disagreement would
    turn it off). A recording with four threads counts every call of each, as it does with the
    function call."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""
        import sys, threading
        from rethook.engine import _ccore

        def leaf(i):
            return i

        def work():
            for i in range(1000):
                leaf(i)

        ts = [threading.Thread(target=work) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        print(_ccore.fast_tstate())
    """))
    out = tmp_path / "t.dat"
    r = subprocess.run([sys.executable, "-m", "rethook", "record", "-l", "__main__.leaf",
                        "-o", str(out), str(prog)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    glibc_x86 = sys.platform == "linux" and os.uname().machine == "x86_64" and \
        os.confstr("CS_GNU_LIBC_VERSION") is not None
    assert r.stdout.strip() == str(glibc_x86)
    assert "8,000 events (0 lost)" in r.stderr  # 4 threads x 1,000 calls, entry and exit


# --- choosing the core --------------------------------------------------------------------
def test_choose_core_prefer_and_environment(monkeypatch):
    monkeypatch.delenv(select.ENV_VAR, raising=False)
    assert select.choose_core("python").name == "python"
    assert type(select.choose_core("python")) is pycore.PyCore
    with pytest.raises(ValueError, match="unknown rethook engine"):
        select.choose_core("fortran")
    monkeypatch.setenv(select.ENV_VAR, "python")
    core = select.choose_core()
    assert core.name == "python" and "RETHOOK_ENGINE" in core.note
    monkeypatch.setenv(select.ENV_VAR, "bogus")
    with pytest.raises(ValueError):
        select.choose_core()
    assert select.choose_core("python").name == "python"  # prefer wins over the environment
    monkeypatch.delenv(select.ENV_VAR)
    if select.c_core_available():
        assert select.choose_core().name == "c"
        assert select.choose_core("c").name == "c"
        monkeypatch.setenv(select.ENV_VAR, "C")
        assert select.choose_core().name == "c"
    else:
        assert select.choose_core().name == "python"
        assert "not built" in select.choose_core().note
        with pytest.raises(RuntimeError, match="not available"):
            select.choose_core("c")


def test_without_the_extension_the_pure_core_runs_and_says_why(tmp_path):
    """An install where the extension did not build: a stub that fails to import stands in."""
    script = textwrap.dedent("""
        import sys, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "rethook.engine._ccore":
                    raise ImportError("no C core in this install")
        sys.meta_path.insert(0, Block())
        from rethook.engine import select
        from rethook.engine.engine import Engine
        core = select.choose_core()
        print(core.name, "|", core.note)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "RETHOOK_ENGINE": ""}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("python | pure-Python core (the C core is not built:")


@needs_c
def test_c_core_reads_the_trace_clock():
    from rethook.engine import _ccore, clock

    a = clock.now_ns()
    b = _ccore.now()
    c = clock.now_ns()
    assert a <= b <= c


# --- an engine on a given core ------------------------------------------------------------
class _Counters:
    """Thread-state counters are per thread and outlive engines (stats() sums them): put back
    what a test here added, so tests elsewhere that count from zero are not disturbed."""

    def __enter__(self):
        self.ts = pycore.PyCore.current_thread_state() or pycore._new_thread_state()
        self.saved = (self.ts.recursion, self.ts.overrun, list(pycore._dead_counts))
        return self

    def __exit__(self, *exc):
        self.ts.recursion, self.ts.overrun, pycore._dead_counts[:] = self.saved


def _engine_on(kind: str) -> Engine:
    """A fresh engine (its own counters and limits) on the given core."""
    assert not get_engine().running, "the process engine is running"
    eng = Engine()
    eng.core = select.choose_core(kind)
    return eng


@pytest.fixture
def cengine():
    """A fresh engine on the C core, whatever core the rest of the suite runs on."""
    if not select.c_core_available():
        pytest.skip(f"the C core is not built: {select.C_CORE_ERROR}")
    with _Counters():
        eng = _engine_on("c")
        try:
            yield eng
        finally:
            leftover = eng.users
            eng.stop()
            assert not leftover, f"test left users registered: {leftover}"


# --- differential: the same workload on both cores gives the same handler calls ------------
CALLS = "*:mod:programs.calls"
GENS = "*:mod:programs.gens"


def _norm(value):
    if value is None or isinstance(value, (bool, int, str, float)):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_norm(v) for v in value)
    if isinstance(value, BaseException):
        return f"{type(value).__name__}{value.args!r}"
    return type(value).__name__


class Logger(FgraphOps):
    """Logs every handler call with its arguments normalised (no times, no addresses)."""

    def __init__(self, log, name, accept=lambda code: True, fail_on=(), **kw):
        super().__init__(name=name, **kw)
        self.log = log
        self.accept = accept
        self.fail_on = fail_on
        self.n = 0

    def entryfunc(self, code, frame, depth, t):
        ok = self.accept(code)
        self.log.append((self.name, "enter", code.co_name, depth, frame is None,
                         frame is not None and frame.f_code is code, t > 0, ok))
        if not ok:
            return None
        self.n += 1
        return f"{self.name}{self.n}"

    def retfunc(self, code, frame, depth, data, retval, exc, t0, t1, sleep, flags):
        self.log.append((self.name, "return", code.co_name, depth, data, _norm(retval),
                         _norm(exc), flags, frame is None, t0 > 0, t1 >= t0, sleep >= 0,
                         (t1 - t0 >= sleep) if t0 else True))
        if code.co_name in self.fail_on:
            raise RuntimeError(f"{self.name} fails on {code.co_name}")

    def suspendfunc(self, code, frame, depth, data, t):
        self.log.append((self.name, "suspend", code.co_name, depth, data, t > 0))

    def resumefunc(self, code, frame, depth, data, t):
        self.log.append((self.name, "resume", code.co_name, depth, data, t > 0))


def _workload():
    calls.fib(5)
    calls.outer(3)
    seen = []
    calls.catch_at(2, 5, seen)
    try:
        calls.raiser(0, 4)
    except calls.Boom:
        pass
    log = []
    try:
        calls.with_finally(log)
    except calls.Boom:
        pass
    calls.is_even(6)
    assert calls.Shape.make(2).double == 8
    list(gens.count(3))
    list(gens.delegate(2))
    g = gens.catcher()
    next(g)
    g.throw(ValueError("x"))
    g.close()
    g2 = gens.guarded(3, [])
    next(g2)
    del g2  # collected while suspended, with a finally: GeneratorExit runs through it
    g3 = gens.count(5)
    next(g3)
    del g3  # collected while suspended without a try (3.13: no event at all)
    gc.collect()
    asyncio.run(gens.consume_agen(2))
    asyncio.run(gens.cancel_one())
    calls.deep(12)  # past max_depth: overruns
    with pycore.notrace():  # skipped, counted in recursion and each user's nmissed
        calls.fib(3)


def _differential_run(kind: str) -> tuple[list, dict]:
    with _Counters():
        return _differential_run_in(_engine_on(kind))


def _differential_run_in(eng: Engine) -> tuple[list, dict]:
    log: list = []
    eng.set_max_depth(9)
    users = [
        Logger(log, "A", filter=f"{CALLS} {GENS}"),
        Logger(log, "B", filter=f"{CALLS} {GENS}", accept=lambda c: c.co_name != "leaf",
               fail_on=("raiser",)),
        Logger(log, "C", filter="fib deep count", fail_on=("fib",)),
    ]
    users[1].wants_time = False
    users[2].wants_frame = False

    def entry_user(code, frame):
        log.append(("E", code.co_name, frame.f_code is code))
        if code.co_name == "area":
            calls.leaf(1)  # a handler calling hooked code: not traced

    eops = FtraceOps(entry_user, filter="outer *.area count")
    start = eng.stats()
    try:
        for u in users:
            eng.register_ftrace_graph(u)
        eng.register_ftrace_function(eops)
        import contextlib
        import io
        with contextlib.redirect_stderr(io.StringIO()):  # the handler errors' one report
            _workload()
        regs = {u.name: (eng.registration(u).errors, eng.registration(u).nmissed)
                for u in users}
    finally:
        for u in users:
            if u in eng.users:
                eng.unregister_ftrace_graph(u)
        if eops in eng.users:
            eng.unregister_ftrace_function(eops)
        eng.set_max_depth(None)
        eng.stop()
    end = eng.stats()
    stats = {k: end[k] - start[k] for k in end if k not in ("threads", "hooked_functions")}
    stats["regs"] = regs
    return log, stats


@needs_c
def test_both_cores_make_the_same_calls():
    py_log, py_stats = _differential_run("python")
    c_log, c_stats = _differential_run("c")
    assert len(py_log) > 200
    for i, (a, b) in enumerate(zip(py_log, c_log, strict=False)):
        assert a == b, f"event {i} differs: python {a} vs c {b}"
    assert len(py_log) == len(c_log)
    assert py_stats == c_stats
    assert py_stats["overrun"] > 0 and py_stats["recursion"] > 0
    assert py_stats["regs"]["B"][0] > 0 and py_stats["regs"]["C"][0] > 0


# --- the C core under stress --------------------------------------------------------------
@needs_c
def test_publish_adds_new_entries_in_place():
    """publish(table, added): the published dict grown by new entries is stored without a
    rebuild while the hash has room, rebuilt otherwise; a bad entry changes nothing."""
    from rethook.engine import _ccore

    codes = [compile(f"def f{i}(): pass", "<t>", "exec").co_consts[0] for i in range(200)]
    entry = lambda c: ((), (), 0, (c,))  # noqa: E731
    saved = _ccore.table()
    try:
        table = {id(c): entry(c) for c in codes[:10]}
        _ccore.publish(table)
        for start in range(10, 200, 10):  # grows past the first hash's room: rebuilt then
            added = {id(c): entry(c) for c in codes[start:start + 10]}
            table.update(added)
            _ccore.publish(table, added)
            assert _ccore.table() is table
            assert all(_ccore.lookup(c) == entry(c) for c in codes[:start + 10])
            assert _ccore.lookup(codes[-1]) is None or start + 10 == 200
        before = [_ccore.lookup(c) for c in codes]
        with pytest.raises(TypeError):
            extra = compile("def g(): pass", "<t>", "exec").co_consts[0]
            _ccore.publish(table, {id(extra): entry(extra), id(codes[0]) + 1: ("bad",)})
        assert [_ccore.lookup(c) for c in codes] == before  # all or nothing
        again = {id(codes[0]): ((), (), 2, (codes[0],))}  # not new: a rebuild from the dict
        table.update(again)
        _ccore.publish(table, again)
        assert _ccore.lookup(codes[0]) == again[id(codes[0])]
    finally:
        _ccore.publish(saved)


def test_frames_are_the_called_functions(cengine):
    seen = []
    rec = FgraphOps(lambda code, frame, depth, t: seen.append(frame.f_code is code) or True,
                    filter="fib leaf outer")
    cengine.register_ftrace_graph(rec)
    try:
        calls.fib(4)
        calls.outer(1)
    finally:
        cengine.unregister_ftrace_graph(rec)
    assert seen and all(seen)


def test_notrace_holds_the_c_core(cengine):
    rec = Recorder("leaf")
    cengine.register_ftrace_graph(rec)
    try:
        before = cengine.stats()["recursion"]
        with pycore.notrace():
            calls.leaf(1)
        calls.leaf(2)
    finally:
        cengine.unregister_ftrace_graph(rec)
    assert len(rec.entries) == 1
    assert cengine.stats()["recursion"] == before + 1


def test_registering_and_unregistering_while_threads_run(cengine):
    stop = threading.Event()
    errors = []

    def spin(i):
        try:
            while not stop.is_set():
                assert calls.fib(7) == 13
                assert calls.deep(40) == 40
                assert list(gens.count(4)) == [0, 1, 2, 3]
                try:
                    calls.raiser(0, 25)
                except calls.Boom:
                    pass
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    keeper = FgraphOps(filter="leaf")
    cengine.register_ftrace_graph(keeper)
    threads = [threading.Thread(target=spin, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    users = []
    try:
        for round_ in range(60):
            filt = ("fib deep", "count raiser", "fib", "*:mod:programs.calls")[round_ % 4]
            u = Recorder(filt, name=f"r{round_}")
            cengine.register_ftrace_graph(u)
            users.append(u)
            if round_ % 3 == 0:
                u.set_filter("deep raiser")
            if round_ % 5 == 0:  # overlapping users: several claims per record
                v = Recorder("fib deep raiser count", name=f"v{round_}")
                cengine.register_ftrace_graph(v)
                users.append(v)
                time.sleep(0.001)
                cengine.unregister_ftrace_graph(v)
            time.sleep(0.001)
            cengine.unregister_ftrace_graph(u)
    finally:
        stop.set()
        for t in threads:
            t.join()
        cengine.unregister_ftrace_graph(keeper)
    assert not errors
    for u in users:
        u.assert_exactly_once()
    assert sum(len(u.returns) for u in users) > 100
    stats = cengine.stats()
    assert stats["open_calls"] == 0 and stats["internal_errors"] == 0


def test_many_short_threads(cengine):
    rec = Recorder("fib leaf")
    cengine.register_ftrace_graph(rec)
    try:
        for _ in range(20):
            ts = [threading.Thread(target=calls.fib, args=(5,)) for _ in range(10)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
    finally:
        cengine.unregister_ftrace_graph(rec)
    rec.assert_exactly_once()
    assert len(rec.entries) == 200 * 15
    assert all(r[4] == 0 for r in rec.returns)
    assert cengine.stats()["internal_errors"] == 0


def test_exceptions_unwinding_a_deep_stack(cengine):
    a = Recorder("raiser", name="a")
    b = Recorder("raiser", name="b", accept=lambda code, frame: frame.f_locals["n"] % 2)
    log = []
    a.log = b.log = log
    cengine.register_ftrace_graph(a)
    cengine.register_ftrace_graph(b)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        with pytest.raises(calls.Boom):
            calls.raiser(0, 3000)
    finally:
        sys.setrecursionlimit(limit)
        cengine.unregister_ftrace_graph(b)
        cengine.unregister_ftrace_graph(a)
    a.assert_exactly_once()
    b.assert_exactly_once()
    assert len(a.returns) == 3001 and len(b.returns) == 1500
    assert all(type(r[3]) is calls.Boom and r[2] is None and r[4] == 0 for r in a.returns)
    # reverse entry order per call: b (the later slot) sees each return before a
    for i, e in enumerate(log):
        if e[0] == "b" and e[1] == "return":
            assert log[i + 1][:2] == ("a", "return")
    assert cengine.stats()["open_calls"] == 0


def test_ten_thousand_deep_recursion(cengine):
    rec = Recorder("deep")
    cengine.register_ftrace_graph(rec)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        assert calls.deep(10_000) == 10_000
    finally:
        sys.setrecursionlimit(limit)
        cengine.unregister_ftrace_graph(rec)
    rec.assert_exactly_once()
    depths = sorted(d for _, d, _ in rec.entries.values())
    assert depths == list(range(10_001))
    assert all(r[4] == 0 for r in rec.returns)


def test_generators_collected_while_suspended(cengine):
    rec = Recorder(GENS)
    cengine.register_ftrace_graph(rec)
    try:
        held = []
        for i in range(3000):  # past the parked high-water mark: the overflow hook runs
            g = gens.count(10)
            next(g)
            if i % 3 == 0:
                held.append(g)
            del g
        parked_mid = len(cengine.core.parked())
        del held
        gc.collect()
        for _ in range(5):
            c = gens.guarded(2, [])
            next(c)
            c.close()
    finally:
        cengine.unregister_ftrace_graph(rec)
    rec.assert_exactly_once()
    assert parked_mid < 3000
    flags = [r[4] for r in rec.returns]
    assert len(flags) == 3005 and set(flags) <= {0, FLAG_CLOSED}
    assert not cengine.core.parked()


def test_generator_resumed_in_another_thread(cengine):
    rec = Recorder("count")
    cengine.register_ftrace_graph(rec)
    try:
        g = gens.count(3)
        next(g)
        out = []
        t = threading.Thread(target=lambda: out.extend(g))
        t.start()
        t.join()
    finally:
        cengine.unregister_ftrace_graph(rec)
    assert out == [1, 2]
    rec.assert_exactly_once()
    assert [r[4] for r in rec.returns] == [0]
    assert rec.returns[0][5] >= 0  # sleep


def test_keyboard_interrupt_from_return_handlers_after_bookkeeping(cengine):
    log = []

    def ret(name):
        def fn(code, frame, depth, data, retval, exc, t0, t1, sleep, flags):
            log.append(name)
            if name == "second" and len(log) == 1:
                raise KeyboardInterrupt
        return fn

    first = FgraphOps(retfunc=ret("first"), filter="leaf")
    second = FgraphOps(retfunc=ret("second"), filter="leaf")
    cengine.register_ftrace_graph(first)
    cengine.register_ftrace_graph(second)
    try:
        with pytest.raises(KeyboardInterrupt):
            calls.outer(1)
        assert log == ["second", "first"]  # both delivered, reverse order, then raised
        assert cengine.stats()["open_calls"] == 0
        assert calls.outer(1) == 6
    finally:
        cengine.unregister_ftrace_graph(second)
        cengine.unregister_ftrace_graph(first)
    assert log == ["second", "first"] * 3


def test_keyboard_interrupt_from_an_entry_handler(cengine):
    def entry(code, frame, depth, t):
        if frame.f_locals["x"] == 1:
            raise KeyboardInterrupt
        return True

    got = []
    ops = FgraphOps(entry, lambda *r: got.append(r[3]), filter="leaf")
    cengine.register_ftrace_graph(ops)
    try:
        with pytest.raises(KeyboardInterrupt):
            calls.leaf(1)
        assert cengine.stats()["open_calls"] == 0
        assert calls.outer(5) == 22
    finally:
        cengine.unregister_ftrace_graph(ops)
    assert got == [True, True]


def test_handler_errors_are_counted_and_reported_once(cengine, capsys):
    def bad(*_):
        raise RuntimeError("boom")

    ops = FgraphOps(bad, filter="leaf")
    ret = FgraphOps(retfunc=bad, filter="leaf")
    cengine.register_ftrace_graph(ops)
    cengine.register_ftrace_graph(ret)
    try:
        for i in range(5):
            assert calls.leaf(i) == 2 * i
    finally:
        cengine.unregister_ftrace_graph(ret)
        cengine.unregister_ftrace_graph(ops)
    err = capsys.readouterr().err
    assert err.count("raised (reported once") == 2
    assert cengine.registration(ops) is None


# --- leaks --------------------------------------------------------------------------------
_LEAK_MOD = '''
def ident(x):
    return x

def fail(e):
    raise e

def gen(x):
    yield x
    yield x

def outer(x, e):
    ident(x)
    try:
        fail(e)
    except Exception:
        pass
    return list(gen(x))
'''


@pytest.fixture
def leakmod(tmp_path, monkeypatch):
    name = f"rh_ccore_leak_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(_LEAK_MOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    mod = importlib.import_module(name)
    yield mod
    sys.modules.pop(name, None)


def test_no_leaked_references(cengine, leakmod):
    token = object()
    value = object()
    exc = ValueError("x")
    one = FgraphOps(lambda *a: token, lambda *a: None, filter=f"*:mod:{leakmod.__name__}",
                    suspendfunc=lambda *a: None, resumefunc=lambda *a: None)
    two = FgraphOps(lambda *a: token, filter=f"*:mod:{leakmod.__name__}")
    seen = FtraceOps(lambda code, frame: None, filter=f"*:mod:{leakmod.__name__}")
    cengine.register_ftrace_graph(one)
    reg = cengine.registration(one)
    watched = [token, value, exc, leakmod.ident.__code__, leakmod.gen.__code__, reg]

    def rounds(n):
        for _ in range(n):
            leakmod.outer(value, exc)
            exc.__traceback__ = None

    try:
        rounds(10)
        before = [sys.getrefcount(o) for o in watched]
        rounds(2000)
        assert [sys.getrefcount(o) for o in watched] == before
        cengine.register_ftrace_graph(two)
        cengine.register_ftrace_function(seen)
        rounds(10)
        before = [sys.getrefcount(o) for o in watched]
        rounds(2000)
        assert [sys.getrefcount(o) for o in watched] == before
    finally:
        cengine.unregister_ftrace_function(seen)
        cengine.unregister_ftrace_graph(two)
        cengine.unregister_ftrace_graph(one)


def test_object_counts_and_memory_stay_flat(cengine, leakmod):
    token = object()
    users = [FgraphOps(lambda *a: token, lambda *a: None, filter=f"*:mod:{leakmod.__name__} fib",
                       suspendfunc=lambda *a: None, resumefunc=lambda *a: None)
             for _ in range(2)]
    users.append(FgraphOps(lambda *a: token, filter="outer"))
    entry = FtraceOps(lambda code, frame: None, filter="ident")
    exc = KeyError("k")

    def workload():
        for _ in range(300):
            leakmod.outer(1, exc)
            calls.fib(5)
            exc.__traceback__ = None
        g = leakmod.gen(1)
        next(g)
        del g  # collected while suspended (no event on 3.13): parked until collect_parked
        cengine.collect_parked()

    for u in users:
        cengine.register_ftrace_graph(u)
    cengine.register_ftrace_function(entry)
    try:
        for _ in range(5):
            workload()
        gc.collect()
        n0 = len(gc.get_objects())
        tracemalloc.start()
        try:
            workload()
            gc.collect()
            m0 = tracemalloc.get_traced_memory()[0]
            for _ in range(30):
                workload()
            gc.collect()
            m1 = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        gc.collect()
        n1 = len(gc.get_objects())
    finally:
        cengine.unregister_ftrace_function(entry)
        for u in users:
            cengine.unregister_ftrace_graph(u)
    # (a few objects come from gc and tracemalloc themselves)
    assert n1 - n0 < 50, f"{n1 - n0} more objects after 30 rounds"
    assert m1 - m0 < 8 * 1024, f"{m1 - m0} more bytes traced after 30 rounds"


# --- python -X dev ------------------------------------------------------------------------
_DEV_SCRIPT = r'''
import asyncio, gc, sys, threading
sys.path.insert(0, {tests!r})
from programs import calls, gens
from recorder import Recorder
from rethook.engine.engine import get_engine
eng = get_engine()
assert eng.core.name == "c", eng.core.name
recs = [Recorder("*:mod:programs.calls *:mod:programs.gens") for _ in range(3)]
for r in recs:
    eng.register_ftrace_graph(r)
def work():
    for _ in range(20):
        calls.fib(8); calls.catch_at(3, 9, []); list(gens.delegate(3))
        g = gens.count(4); next(g); del g
        try:
            calls.raiser(0, 30)
        except calls.Boom:
            pass
ts = [threading.Thread(target=work) for _ in range(4)]
for t in ts: t.start()
work()
asyncio.run(gens.gather_naps())
for t in ts: t.join()
eng.unregister_ftrace_graph(recs[1])
sys.setrecursionlimit(20000)
calls.deep(5000)
for r in (recs[0], recs[2]):
    eng.unregister_ftrace_graph(r)
for r in recs:
    r.assert_exactly_once()
gc.collect()
print("ok", eng.stats()["internal_errors"])
'''


@needs_c
def test_no_crash_under_dev_mode(tmp_path):
    script = tmp_path / "dev_run.py"
    script.write_text(_DEV_SCRIPT.format(tests=TESTS))
    plugin = _force_plugin(tmp_path)
    env = {**os.environ, "RETHOOK_ENGINE": "c", "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-X", "dev", "-c",
                          f"import {plugin}; exec(open({str(script)!r}).read())"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip() == "ok 0", out.stdout + out.stderr[-4000:]
    assert "Fatal Python error" not in out.stderr


# --- the engine test modules against the other core ---------------------------------------
_FORCE_PLUGIN = '''
"""Every Engine runs on the core choose_core() picks (also before Engine uses it itself)."""
from rethook.engine import engine as _engine
from rethook.engine.select import choose_core

_orig = _engine.Engine.__init__


def _init(self, *a, **k):
    _orig(self, *a, **k)
    self.core = choose_core()


_engine.Engine.__init__ = _init


def pytest_report_header(config):
    return f"rethook core (forced): {choose_core().name}"


def pytest_sessionfinish(session, exitstatus):
    core = _engine.get_engine().core.name
    print(f"\\nRETHOOK-CORE-USED: {core}")
'''

# The whole suite but this module (which runs both cores itself): every test of the engine,
# tracers, probes, buffer, files and command line also runs on the other core.
ENGINE_MODULES = sorted(name for name in os.listdir(TESTS)
                        if name.startswith("test_") and name.endswith(".py")
                        and name != "test_ccore.py")


def _force_plugin(tmp_path) -> str:
    name = "rethook_force_core"
    (tmp_path / f"{name}.py").write_text(_FORCE_PLUGIN)
    return name


@needs_c
@pytest.mark.skipif(bool(os.environ.get("RETHOOK_NO_OTHER_CORE")),
                    reason="RETHOOK_NO_OTHER_CORE is set")
def test_the_suite_on_the_other_core(tmp_path):
    """This process runs the suite on one core; run the rest of the suite on the other one."""
    here = get_engine().core.name  # the core this process's suite runs on
    other, = (c.name for c in select.available_cores() if c.name != here)  # the matrix
    plugin = _force_plugin(tmp_path)
    env = {**os.environ, "RETHOOK_ENGINE": other, "RETHOOK_NO_OTHER_CORE": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", plugin, "-p", "no:cacheprovider",
         *[os.path.join(TESTS, m) for m in ENGINE_MODULES]],
        capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    tail = out.stdout[-6000:] + out.stderr[-3000:]
    assert f"RETHOOK-CORE-USED: {other}" in out.stdout, tail
    assert out.returncode == 0, tail


# --- the drain's rounds ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["c", "python"])
def test_drain_rounds_on_both_cores(kind):
    """drain_wait(seconds, first) sleeps and takes the GIL back; with ``first`` on the C core
    the program's threads hand it over at their next callback until drain_end(). A thread
    making hooked calls while rounds open and close goes on to its end."""
    if kind == "c" and not select.c_core_available():
        pytest.skip("the C core is not built")
    core = select.choose_core(kind)
    with pytest.raises(TypeError):
        core.drain_wait(0.001)  # type: ignore[call-arg]
    engine = Engine(core=core)
    ops = FgraphOps(lambda *a: True, lambda *a: None, filter="programs.calls.leaf")
    engine.register_ftrace_graph(ops)
    done = threading.Event()

    def busy() -> None:
        for _ in range(20000):
            calls.leaf(1)
        done.set()

    try:
        worker = threading.Thread(target=busy)
        worker.start()
        while not done.is_set():
            core.drain_wait(0.0002, True)
            calls.leaf(2)  # (the drain's own thread is not held back by its round)
        core.drain_end()
        worker.join()
    finally:
        engine.unregister_ftrace_graph(ops)
    assert done.is_set()


def test_a_ring_a_quarter_full_wakes_the_drain():
    """Between rounds the recorder's drain waits until a native ring is a quarter full
    (cring.h's wake mark), not a poll's length: the writer wakes it once, and again only
    after a consuming read; drain_wake() (the recorder stopping it) ends a wait too."""
    if not select.c_core_available():
        pytest.skip("the C core is not built")
    from rethook.engine import _ccore

    cring = pytest.importorskip("rethook.buffer._cring")
    ring = cring.Ring(16, 1)  # the wake mark: a record written into 4 unconsumed ones
    code = calls.leaf.__code__

    def write(n: int) -> None:
        for _ in range(n):
            assert ring.write(2, 1, code, None, 0, 0, 0, 0, 0)

    _ccore.drain_wait(0, False)  # (forget a wake another test left)
    write(4)
    assert _ccore.drain_wait(0, False) is False
    write(1)
    assert _ccore.drain_wait(0, False) is True  # the fifth record woke it
    write(4)  # further past the mark, not consumed: no second wake
    assert _ccore.drain_wait(0, False) is False
    ring.consume()
    write(5)
    assert _ccore.drain_wait(0, False) is True

    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(_ccore.drain_wait(600, False)))
    waiter.start()
    ring.consume()
    write(5)  # wakes the waiting thread long before its ten minutes
    waiter.join(JOIN_SECONDS)
    assert woken == [True]

    waiter = threading.Thread(target=lambda: woken.append(_ccore.drain_wait(600, False)))
    waiter.start()
    _ccore.drain_wake()
    waiter.join(JOIN_SECONDS)
    assert woken == [True, True]
    ring.consume()


_RING_OPS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(1, 40)),
    st.tuples(st.just("consume"), st.just(0)),
    st.tuples(st.just("clear"), st.just(0)),
    st.tuples(st.just("resize"), st.integers(1, 40)),
    st.tuples(st.just("wait"), st.just(0)),
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 40), ops=_RING_OPS)
def test_the_wake_mark_against_a_model(capacity, ops):
    """Whatever a ring goes through (writes past its size, consuming reads, clear, resize),
    a record written into a ring holding a quarter of its capacity or more, and less than
    three quarters, wakes the drain once, and again only after a consuming read, a clear or
    a resize (cring.h's marks; the drain's wait says whether it was woken)."""
    if not select.c_core_available():
        pytest.skip("the C core is not built")
    from rethook.engine import _ccore

    cring = pytest.importorskip("rethook.buffer._cring")
    code = calls.leaf.__code__
    ring = cring.Ring(capacity, 1)
    _ccore.drain_wait(0, False)  # (forget a wake another test left)
    held, armed, woken = 0, True, False  # unconsumed records; the wake mark not yet passed
    for op, n in ops:
        if op == "write":
            for _ in range(n):
                wake, high = capacity // 4, capacity - capacity // 4
                if armed and wake <= held < high:
                    woken, armed = True, False
                assert ring.write(2, 1, code, None, 0, 0, 0, 0, 0)
                held = min(held + 1, capacity)  # (a full ring drops its oldest)
        elif op in ("consume", "clear"):
            getattr(ring, op)()
            held, armed = 0, True
        elif op == "resize":
            ring.resize(n)
            capacity, held, armed = n, min(held, n), True
        else:
            assert _ccore.drain_wait(0, False) is woken
            woken = False
    assert _ccore.drain_wait(0, False) is woken


@pytest.mark.parametrize("bad", [-1, -0.001, float("nan"), float("inf"), 4e9])
def test_drain_blocking_refuses_what_the_clock_cannot_hold(bad):
    """How long the program may wait is the command line's to bound (--blocking-timeout,
    rethook/limits.py); the C core refuses only what is no number of seconds its clock
    holds."""
    if not select.c_core_available():
        pytest.skip("the C core is not built")
    from rethook.engine import _ccore

    with pytest.raises(ValueError, match="drain_blocking"):
        _ccore.drain_blocking(bad)
    _ccore.drain_blocking(3 * 3600)  # longer than the command line allows: not the API's to say
    _ccore.drain_end()


def test_a_stop_for_exit_delivers_the_open_calls_and_leaves_the_events():
    """Engine.for_exit (the command line's run is over): the last user's unregister stops
    the engine at once, delivering the calls still open (FLAG_UNFINISHED) and leaving the
    functions' local events set with no callback; a later start clears them."""
    engine = Engine()
    seen = []
    ops = FgraphOps(lambda *a: True, lambda code, *a: seen.append((code.co_name, a[-1])),
                    filter="programs.calls.leaf programs.calls.block")
    engine.register_ftrace_graph(ops)
    tool = engine.tool_id
    entered, release = threading.Event(), threading.Event()

    def blocked() -> None:
        calls.block(entered, release)

    t = threading.Thread(target=blocked)
    t.start()
    try:
        assert entered.wait(JOIN_SECONDS)
        calls.leaf(1)
        engine.for_exit()
        engine.unregister_ftrace_graph(ops)
    finally:
        release.set()
        t.join(JOIN_SECONDS)
    assert not engine.running
    assert ("leaf", 0) in seen and ("block", pycore.FLAG_UNFINISHED) in seen
    assert sys.monitoring.get_local_events(tool, calls.leaf.__code__) != 0
    engine.register_ftrace_graph(ops := FgraphOps(lambda *a: True, lambda *a: None,
                                                  filter="programs.calls.leaf"))
    try:
        if engine.tool_id == tool:  # the same id again: what the stop left is cleared
            assert sys.monitoring.get_local_events(tool, calls.block.__code__) == 0
    finally:
        engine.unregister_ftrace_graph(ops)
    assert sys.monitoring.get_local_events(tool, calls.leaf.__code__) == 0



@needs_c
def test_finished_frames_agrees_with_the_generators():
    """The C core tells which parked frames' generators have finished from the frames alone
    (collect_parked's question, which the pure core answers by walking every object's
    referrers): suspended ones have not; closed, exhausted, collected ones have; generators,
    coroutines and async generators alike."""
    finished_frames = select.CCore.finished_frames

    def gen():
        yield 1
        yield 2

    async def coro():
        await asyncio.sleep(0)

    async def agen():
        yield 1

    def suspended_gen():
        g = gen()
        next(g)
        return g, g.gi_frame

    def suspended_coro():
        c = coro()
        c.send(None)
        return c, c.cr_frame

    def suspended_agen():
        a = agen()
        with pytest.raises(StopIteration):
            a.asend(None).send(None)
        return a, a.ag_frame

    keep = []
    frames, want = [], []
    for make, finish in [(suspended_gen, None), (suspended_gen, "close"),
                         (suspended_gen, "exhaust"), (suspended_gen, "drop"),
                         (suspended_coro, None), (suspended_coro, "close"),
                         (suspended_agen, None)]:
        g, frame = make()
        if finish == "close":
            g.close()
        elif finish == "exhaust":
            list(g)
        if finish != "drop":
            keep.append(g)
        del g
        gc.collect()
        frames.append(frame)
        want.append(finish is not None)
    done = finished_frames(frames)
    assert [any(f is d for d in done) for f in frames] == want
    for g in keep:
        if hasattr(g, "aclose"):
            with pytest.raises(StopIteration):
                g.aclose().send(None)
        else:
            g.close()
    with pytest.raises(TypeError):
        finished_frames([object()])
