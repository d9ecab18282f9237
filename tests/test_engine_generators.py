"""Generators and coroutines: parking on suspension, resumption, close, throw, collection."""

import asyncio
import gc
import sys
import threading

import pytest

from programs import gens
from recorder import Recorder
from rethook.engine.core import FLAG_CLOSED, FLAG_UNFINISHED
from rethook.engine.engine import FgraphOps


def run(engine, user, fn):
    engine.register_ftrace_graph(user)
    try:
        return fn()
    finally:
        engine.unregister_ftrace_graph(user)


def test_fully_consumed_generator_returns_its_value(engine):
    rec = Recorder("count")
    assert run(engine, rec, lambda: list(gens.count(4))) == [0, 1, 2, 3]
    ((_, name, retval, exc, flags, sleep, t0, t1),) = rec.returns
    assert (name, retval, exc, flags) == ("count", "counted", None, 0)
    assert 0 <= sleep <= t1 - t0  # suspended time is part of the wall duration


def test_partially_consumed_generator_is_unfinished_at_teardown(engine):
    rec = Recorder("count")
    g = gens.count(10)

    def partly():
        assert [next(g), next(g)] == [0, 1]
        assert engine.stats()["parked_calls"] == 1

    run(engine, rec, partly)
    ((_, _, retval, exc, flags, *_),) = rec.returns
    assert (retval, exc, flags) == (None, None, FLAG_UNFINISHED)
    assert engine.stats()["parked_calls"] == 0
    assert list(g) == list(range(2, 10))  # the program is unaffected


def test_closed_generator_gets_exactly_one_return(engine):
    rec = Recorder("count guarded")
    log = []

    def close_both():
        a, b = gens.count(5), gens.guarded(5, log)
        next(a)
        next(b)
        a.close()  # no try around its yield: 3.13 fires no event (CPython issue 140373)
        b.close()  # a finally around its yield: every version fires PY_THROW + PY_UNWIND
        engine.collect_parked()

    run(engine, rec, close_both)
    rec.assert_exactly_once()
    assert log == ["guarded-finally"]
    by_name = {r[1]: r for r in rec.returns}
    assert isinstance(by_name["guarded"][3], GeneratorExit) and by_name["guarded"][4] == 0
    count_exc, count_flags = by_name["count"][3], by_name["count"][4]
    assert isinstance(count_exc, GeneratorExit)
    assert count_flags == (FLAG_CLOSED if sys.version_info >= (3, 13) else 0)


def test_collected_suspended_generator_does_not_leak(engine):
    rec = Recorder("count")

    def drop():
        for _ in range(50):
            g = gens.count(3)
            next(g)
            del g
        gc.collect()
        engine.collect_parked()
        assert engine.stats()["parked_calls"] == 0

    run(engine, rec, drop)
    rec.assert_exactly_once()
    assert len(rec.returns) == 50
    assert all(isinstance(r[3], GeneratorExit) for r in rec.returns)


@pytest.mark.skipif(sys.version_info < (3, 13), reason="3.12 closes them with events")
def test_an_interrupt_from_a_closed_return_ends_that_collection(engine):
    """A return handler raises KeyboardInterrupt while collect_parked delivers closed calls:
    the call's own return is done, the interrupt comes out of collect_parked, and the calls
    not reached yet stay parked, to be closed by the next collection. Each closed return is
    timed at its generator's last suspension."""

    class Interrupting(Recorder):
        raised = False

        def retfunc(self, code, frame, depth, data, retval, exc, t0, t1, sleep, flags):
            super().retfunc(code, frame, depth, data, retval, exc, t0, t1, sleep, flags)
            if not self.raised:
                self.raised = True
                raise KeyboardInterrupt

    rec = Interrupting("count")

    def close_three():
        gs = [gens.count(5) for _ in range(3)]
        for g in gs:
            next(g)
        suspended = engine.stats()["closed_returns"]
        for g in gs:
            g.close()  # no event on 3.13: parked until collected
        with pytest.raises(KeyboardInterrupt):
            engine.collect_parked()
        assert len(rec.returns) == 1 and engine.stats()["parked_calls"] == 2
        assert engine.collect_parked() == 2
        assert engine.stats()["parked_calls"] == 0
        assert engine.stats()["closed_returns"] - suspended == 3

    run(engine, rec, close_three)
    rec.assert_exactly_once()
    for _, _, _, exc, flags, sleep, t0, t1 in rec.returns:
        assert isinstance(exc, GeneratorExit) and flags == FLAG_CLOSED
        assert t0 <= t1 and sleep == 0  # (t1: when it was suspended, never resumed)


def test_parked_high_water_mark_collects_without_being_asked(engine):
    from rethook.engine import engine as engine_module

    rec = Recorder("count")

    def many():
        for _ in range(engine_module.PARKED_HIGH_WATER + 10):
            g = gens.count(3)
            next(g)
            g.close()
        return engine.stats()["parked_calls"]

    left = run(engine, rec, many)
    assert left < engine_module.PARKED_HIGH_WATER
    rec.assert_exactly_once()


def test_throw_caught_inside_and_uncaught(engine):
    rec = Recorder("catcher count")

    def throw():
        c = gens.catcher()
        assert next(c) == "ready"
        assert c.throw(ValueError("x")) == "caught x"
        g = gens.count(3)
        next(g)
        err = KeyError("k")
        with pytest.raises(KeyError) as info:
            g.throw(err)
        assert info.value is err
        c.close()
        return err

    err = run(engine, rec, throw)
    rec.assert_exactly_once()
    by_name = {r[1]: r for r in rec.returns}
    assert by_name["count"][3] is err
    assert isinstance(by_name["catcher"][3], GeneratorExit)


def test_yield_from_pairs_inner_and_outer(engine):
    rec = Recorder("delegate count")
    out = []

    def consume():
        g = gens.delegate(3)
        try:
            while True:
                out.append(next(g))
        except StopIteration as stop:
            return stop.value

    assert run(engine, rec, consume) == "delegated counted"
    assert out == [0, 1, 2]
    assert [(r[1], r[2]) for r in rec.returns] == [("count", "counted"),
                                                  ("delegate", "delegated counted")]
    rec.assert_exactly_once()


def test_async_generator_and_coroutines(engine):
    rec = Recorder("agen consume_agen")
    assert run(engine, rec, lambda: asyncio.run(gens.consume_agen(3))) == [0, 1, 2]
    rec.assert_exactly_once()
    by_name = {r[1]: r for r in rec.returns}
    assert by_name["consume_agen"][2] == [0, 1, 2]
    # the async generator ends by StopAsyncIteration, raised out of its frame
    assert by_name["agen"][4] == 0


def test_gather_reports_wall_and_sleep_time(engine):
    rec = Recorder("nap gather_naps")
    assert run(engine, rec, lambda: asyncio.run(gens.gather_naps())) == ["a", "b", "c"]
    rec.assert_exactly_once()
    naps = sorted((r[2], r[5], r[7] - r[6]) for r in rec.returns if r[1] == "nap")
    assert [v for v, _, _ in naps] == ["a", "b", "c"]
    for value, sleep, wall in naps:
        assert 0 <= sleep <= wall
        if value != "c":  # awaited a real sleep: it was suspended
            assert sleep > 0


def test_cancellation_and_timeouts(engine):
    rec = Recorder("forever cancel_one time_out")

    def both():
        return asyncio.run(gens.cancel_one()), asyncio.run(gens.time_out())

    assert run(engine, rec, both) == ("cancelled", "timed out")
    rec.assert_exactly_once()
    forevers = [r for r in rec.returns if r[1] == "forever"]
    assert len(forevers) == 2
    assert all(isinstance(r[3], asyncio.CancelledError) for r in forevers)


def test_generator_resumed_in_another_thread(engine):
    rec = Recorder("count")
    got = []

    def hop():
        g = gens.count(4)
        got.append(next(g))
        t = threading.Thread(target=lambda: got.extend(g))
        t.start()
        t.join()

    run(engine, rec, hop)
    assert got == [0, 1, 2, 3]
    ((_, _, retval, exc, flags, *_),) = rec.returns
    assert (retval, exc, flags) == ("counted", None, 0)


def test_suspend_and_resume_handlers_see_the_await_points(engine):
    events = []

    class Awaits(FgraphOps):
        def entryfunc(self, code, frame, depth, t):
            return code.co_name

        def suspendfunc(self, code, frame, depth, data, t):
            events.append(("suspend", data))

        def resumefunc(self, code, frame, depth, data, t):
            events.append(("resume", data))

        def retfunc(self, code, frame, depth, data, *rest):
            events.append(("return", data))

    run(engine, Awaits(filter="nap"), lambda: asyncio.run(gens.nap(0, "v")))
    assert events == [("suspend", "nap"), ("resume", "nap"), ("return", "nap")]


def test_a_discarded_entry_is_not_counted_as_a_closed_return(engine):
    # B unregisters itself from its own entry handler (its entry is discarded); the generator
    # is then closed while suspended. Only A's return is delivered, and counted.
    got = []
    a = FgraphOps(lambda *_: "a", lambda *r: got.append(("A", r[9])), filter="count", name="A")

    def b_entry(*_):
        engine.unregister_ftrace_graph(b)
        return "b"

    b = FgraphOps(b_entry, lambda *r: got.append(("B", r[9])), filter="count", name="B")
    engine.register_ftrace_graph(a)
    engine.register_ftrace_graph(b)
    before = engine.stats()
    g = gens.count(3)
    next(g)
    g.close()
    engine.unregister_ftrace_graph(a)
    after = engine.stats()
    counted = (after["closed_returns"] - before["closed_returns"]
               + after["unfinished_returns"] - before["unfinished_returns"])
    flag = FLAG_CLOSED if sys.version_info >= (3, 13) else 0
    assert got == [("A", flag)]
    assert counted == (1 if flag else 0)
