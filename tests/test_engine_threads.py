"""Threads and processes: one shadow stack per thread, live changes under load, fork."""

import os
import threading

import pytest

from programs import calls
from recorder import Recorder
from rethook.engine.core import FLAG_UNFINISHED
from rethook.engine.engine import FgraphOps


def fib_calls(n):
    return 1 if n < 2 else 1 + fib_calls(n - 1) + fib_calls(n - 2)


def test_each_thread_has_its_own_stack(engine):
    rec = Recorder("fib")
    engine.register_ftrace_graph(rec)
    results = {}
    all_alive = threading.Barrier(4)  # thread ids are reused once a thread ends

    def work(i):
        results[i] = calls.fib(10 + i)
        all_alive.wait()

    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        engine.unregister_ftrace_graph(rec)
    assert results == {i: calls.fib(10 + i) for i in range(4)}
    rec.assert_exactly_once()
    per_thread = {}
    for _name, depth, tid in rec.entries.values():
        per_thread.setdefault(tid, []).append(depth)
    assert sorted(len(d) for d in per_thread.values()) == [fib_calls(10 + i) for i in range(4)]
    for depths in per_thread.values():  # each thread's depths start at 0: no sharing
        assert min(depths) == 0


def test_register_and_unregister_while_threads_run(engine):
    stop = threading.Event()
    errors = []

    def spin():
        try:
            while not stop.is_set():
                assert calls.fib(8) == 21
                assert calls.deep(30) == 30
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    keeper = FgraphOps(filter="leaf")  # keeps the engine running between rounds
    engine.register_ftrace_graph(keeper)
    threads = [threading.Thread(target=spin) for _ in range(3)]
    for t in threads:
        t.start()
    users = []
    try:
        for round_ in range(30):
            u = Recorder("fib deep" if round_ % 2 else "fib", name=f"r{round_}")
            engine.register_ftrace_graph(u)
            users.append(u)
            calls.fib(6)
            if round_ % 3 == 0:
                u.set_filter("deep")
            engine.unregister_ftrace_graph(u)
    finally:
        stop.set()
        for t in threads:
            t.join()
        engine.unregister_ftrace_graph(keeper)
    assert not errors
    for u in users:
        u.assert_exactly_once()
        for data in u.returned():
            assert data in u.entries
    assert engine.stats()["open_calls"] == 0


def test_unregister_while_another_thread_is_inside_a_call(engine):
    rec = Recorder("block")
    engine.register_ftrace_graph(rec)
    started, release = threading.Event(), threading.Event()
    result = []
    t = threading.Thread(target=lambda: result.append(calls.block(started, release)))
    t.start()
    started.wait()
    engine.unregister_ftrace_graph(rec)  # the call is open in the other thread
    assert [r[4] for r in rec.returns] == [FLAG_UNFINISHED]
    release.set()
    t.join()
    assert result == ["released"]
    assert len(rec.returns) == 1  # its real return later is not delivered again
    rec.assert_exactly_once()


def test_thread_end_flushes_calls_left_open(engine):
    # A generator started in a thread that ends while it is suspended is simply parked; a
    # thread ending with calls on its stack gets them delivered as unfinished.
    rec = Recorder("deep")
    engine.register_ftrace_graph(rec)
    done = threading.Event()

    def work():
        calls.deep(3)
        done.set()

    try:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    finally:
        engine.unregister_ftrace_graph(rec)
    assert done.is_set()
    rec.assert_exactly_once()
    assert all(r[4] == 0 for r in rec.returns)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_fork_child_returns_through_the_forking_threads_calls(engine):
    import programs.forking as forking

    rec = Recorder("*:mod:programs.forking")
    engine.register_ftrace_graph(rec)
    other_started = threading.Event()
    release = threading.Event()

    def other():  # an open call in another thread: the child must not inherit it
        forking.wait_in_thread(other_started, release)

    t = threading.Thread(target=other)
    t.start()
    other_started.wait()
    try:
        r, w = os.pipe()
        before = len(rec.returns)
        pid = forking.fork_inside()
        if pid == 0:  # pragma: no cover - the child reports and leaves at once
            got = ",".join(f"{x[1]}:{x[4]}" for x in rec.returns[before:])
            threads = engine.stats()["threads"]
            os.write(w, f"{got};threads={threads}".encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            child_report = f.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        t.join()
        engine.unregister_ftrace_graph(rec)
    # In the child, the forking thread's open calls (fork_inside, then outer_call) returned
    # normally through the engine; nothing of the other thread was delivered.
    assert child_report == "outer_call:0,fork_inside:0;threads=1"
    rec.assert_exactly_once()
