"""Tests of the C ring buffer (rethook.buffer._cring) and the ring readers that merge it in."""

from __future__ import annotations

import gc
import io
import sys
import threading
import weakref
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rethook.buffer import native
from rethook.buffer.events import Lost
from rethook.buffer.ring import NATIVE_PIPE_POLL_SECONDS, TraceBuffer
from rethook.buffer.tracefile import write_trace
from rethook.buffer.traceread import TraceReader
from rethook.tracers.formats import builtin_registry

NOT_BUILT = "rethook.buffer._cring is not built (python setup.py build_ext --inplace)"
JOIN_SECONDS = 30


def cring_module():
    return pytest.importorskip("rethook.buffer._cring", reason=NOT_BUILT)


@pytest.fixture
def cring():
    return cring_module()


def f_alpha():
    pass


def f_beta():
    pass


def f_gamma():
    pass


ALPHA, BETA, GAMMA = f_alpha.__code__, f_beta.__code__, f_gamma.__code__
CODES = (ALPHA, BETA, GAMMA)


def names(code):
    return f"mod.{code.co_name}"


def rec(ts, code=ALPHA, parent=None, rtype=2, depth=0, calltime=0, sleep=0, flags=0, overrun=0):
    """A raw record as the ring gives it back (and the arguments of Ring.write)."""
    return (rtype, ts, code, parent, depth, calltime, sleep, flags, overrun)


def write(ring, ts, **kw):
    return ring.write(*rec(ts, **kw))


def tss(records):
    return [r[1] for r in records]


# -- the Ring type ------------------------------------------------------------------------------


def test_module_surface(cring):
    assert cring.RECORD_BYTES == native.RECORD_BYTES == 56
    assert type(cring._C_API).__name__ == "PyCapsule"
    assert "rethook.buffer._cring._C_API" in repr(cring._C_API)
    r = cring.Ring(4, 1234)
    assert (r.capacity, r.tid, r.on, r.overwrite) == (4, 1234, True, True)
    assert r.stats() == (0, 0, 0, 0) and r.events() == []
    assert r.consume() == (0, [], 0)
    for attr, value in (("capacity", 5), ("tid", 1)):
        with pytest.raises(AttributeError):
            setattr(r, attr, value)
    r.on = 0
    r.overwrite = []
    assert (r.on, r.overwrite) == (False, False)
    with pytest.raises(AttributeError):
        del r.on
    assert weakref.ref(r)() is r
    assert "tid=1234" in repr(r) and "capacity=4" in repr(r)


def test_bad_arguments(cring):
    for bad in (0, -1):
        with pytest.raises(ValueError):
            cring.Ring(bad, 1)
    with pytest.raises(TypeError):
        cring.Ring(1.5, 1)
    with pytest.raises(OverflowError):
        cring.Ring(4, -1)
    with pytest.raises((MemoryError, OverflowError)):
        cring.Ring(sys.maxsize, 1)
    r = cring.Ring(2, 1)
    with pytest.raises(TypeError):
        r.write(2, 1, "not code", None, 0, 0, 0, 0, 0)
    with pytest.raises(TypeError):
        r.write(2, 1, ALPHA, "not code", 0, 0, 0, 0, 0)
    with pytest.raises(OverflowError):
        r.write(2, 1 << 64, ALPHA, None, 0, 0, 0, 0, 0)
    with pytest.raises(OverflowError):
        r.write(2, 1, ALPHA, None, 1 << 40, 0, 0, 0, 0)
    for bad in (0, -3):
        with pytest.raises(ValueError):
            r.resize(bad)
    assert r.stats() == (0, 0, 0, 0)  # nothing was written by the failed calls


def test_records_round_trip(cring):
    r = cring.Ring(8, 1)
    records = [
        rec(10, ALPHA, BETA, rtype=1, depth=42),
        rec(11, BETA, rtype=2, depth=3),
        rec(12, BETA, rtype=3, depth=3, calltime=11, sleep=-5, flags=6, overrun=-7),
        rec(-(1 << 63), GAMMA, rtype=4, depth=-(1 << 31)),
        rec((1 << 63) - 1, GAMMA, rtype=5, depth=(1 << 31) - 1),
    ]
    for x in records:
        assert r.write(*x) is True
    assert r.events() == records
    assert r.events() == records  # not consumed


def test_overwrite_accounting(cring):
    r = cring.Ring(4, 1)
    for ts in range(10):
        assert write(r, ts) is True
    assert tss(r.events()) == [6, 7, 8, 9]
    assert r.stats() == (4, 10, 6, 0)
    lost_before, records, lost_after = r.consume()
    assert (lost_before, tss(records), lost_after) == (6, [6, 7, 8, 9], 0)
    assert r.stats() == (0, 10, 6, 4)
    for ts in range(10, 15):
        write(r, ts)
    assert r.stats() == (4, 15, 7, 4)
    lost_before, records, lost_after = r.consume()
    assert (lost_before, tss(records), lost_after) == (1, [11, 12, 13, 14], 0)
    assert r.stats() == (0, 15, 7, 8)
    assert r.consume() == (0, [], 0)


def test_refusing_accounting(cring):
    r = cring.Ring(3, 1)
    r.overwrite = False
    results = [write(r, ts) for ts in range(5)]
    assert results == [True, True, True, False, False]
    assert tss(r.events()) == [0, 1, 2]
    assert r.stats() == (3, 5, 2, 0)
    assert (r.refused, r.refused_unreported) == (2, 2)
    lost_before, records, lost_after = r.consume()
    assert (lost_before, tss(records), lost_after) == (0, [0, 1, 2], 2)
    assert r.stats() == (0, 5, 2, 3)
    assert write(r, 5) is True  # room again after the read
    assert r.consume()[0::2] == (0, 0)
    # refusals only, nothing readable: reported after nothing
    for ts in range(6, 12):
        write(r, ts)
    assert r.consume()[0::2] == (0, 3)
    assert r.consume() == (0, [], 0)
    assert r.stats() == (0, 12, 5, 7)


def test_overwrite_switch_keeps_what_is_held(cring):
    r = cring.Ring(3, 1)
    for ts in range(5):
        write(r, ts)
    r.overwrite = False
    assert write(r, 5) is False
    assert tss(r.events()) == [2, 3, 4]
    assert r.stats() == (3, 6, 3, 0)
    r.overwrite = True
    assert write(r, 6) is True
    assert tss(r.events()) == [3, 4, 6]
    assert r.stats() == (3, 7, 4, 0)
    lost_before, records, lost_after = r.consume()
    assert (lost_before, tss(records), lost_after) == (3, [3, 4, 6], 1)


def test_on_off_gate(cring):
    r = cring.Ring(2, 1)
    write(r, 1)
    r.on = False
    assert write(r, 2) is False
    r.overwrite = False
    write(r, 3), write(r, 4)
    assert r.stats() == (1, 1, 0, 0)  # neither written nor refused
    r.on = True
    assert write(r, 5) is True and write(r, 6) is False
    assert r.stats() == (2, 3, 1, 0)


def test_clear(cring):
    r = cring.Ring(3, 1)
    for ts in range(5):
        write(r, ts)
    r.consume()
    r.overwrite = False
    for ts in range(5, 10):
        write(r, ts)
    r.clear()
    assert r.stats() == (0, 0, 0, 0) and r.events() == []
    assert r.consume() == (0, [], 0)  # nothing lost is reported after a clear
    assert (r.head, r.floor, r.clear_seq, r.read_pos) == (8, 8, 8, 8)
    assert (r.consumed, r.refused, r.refused_unreported) == (0, 0, 0)
    assert write(r, 10) is True  # room after the clear
    assert r.stats() == (1, 1, 0, 0)


def test_resize_shrink_and_grow(cring):
    r = cring.Ring(6, 1)
    for ts in range(5):
        write(r, ts)
    r.resize(2)
    assert (r.capacity, tss(r.events())) == (2, [3, 4])
    assert r.stats() == (2, 5, 3, 0)
    write(r, 5)
    assert tss(r.events()) == [4, 5]
    r.resize(5)  # what was lost stays lost
    assert tss(r.events()) == [4, 5]
    for ts in range(6, 9):
        write(r, ts)
    assert tss(r.events()) == [4, 5, 6, 7, 8]
    assert r.stats() == (5, 9, 4, 0)
    lost_before, records, _ = r.consume()
    assert (lost_before, tss(records)) == (4, [4, 5, 6, 7, 8])
    r.resize(1)
    assert r.events() == [] and r.stats() == (0, 9, 4, 5)
    r.resize(7)  # the wrapped positions are re-laid in the new array
    for ts in range(9, 20):
        write(r, ts)
    assert tss(r.events()) == list(range(13, 20))


def test_refcounts_stay_flat(cring):
    def code_refs():
        return [sys.getrefcount(c) for c in CODES]

    before = code_refs()
    r = cring.Ring(16, 1)
    for i in range(1000):  # wraps many times: overwritten records release their codes
        r.write(1, i, CODES[i % 3], CODES[(i + 1) % 3], 0, 0, 0, 0, 0)
    r.clear()
    assert code_refs() == before
    for i in range(40):
        r.write(2, i, ALPHA, BETA if i % 2 else None, 0, 0, 0, 0, 0)
    events = r.events()
    del events
    assert r.consume()[0] == 24
    assert code_refs() == before
    r.overwrite = False
    for i in range(40):
        r.write(2, i, GAMMA, GAMMA, 0, 0, 0, 0, 0)
    r.resize(5)
    r.resize(9)
    assert code_refs() != before
    r.clear()
    assert code_refs() == before
    for i in range(20):
        r.write(3, i, ALPHA, ALPHA, 0, 0, 0, 0, 0)
    del r
    gc.collect()
    assert code_refs() == before


def test_gc_collects_an_unreachable_ring(cring):
    r = cring.Ring(4, 1)
    write(r, 1)
    ref = weakref.ref(r)
    del r
    assert ref() is None


# -- the model ----------------------------------------------------------------------------------


class RingModel:
    """The ring's semantics stated with counts, independent of sequence numbers."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: deque = deque()
        self.on = True
        self.overwrite = True
        self.written = self.lost = self.read = 0
        self.lost_since_read = 0  # overwritten (or cut by a resize) since the last consume
        self.refused_since_read = 0

    def write(self, record) -> bool:
        if not self.on:
            return False
        self.written += 1
        if len(self.held) >= self.capacity:
            self.lost += 1
            if not self.overwrite:
                self.refused_since_read += 1
                return False
            self.held.popleft()
            self.lost_since_read += 1
        self.held.append(record)
        return True

    def consume(self):
        out = (self.lost_since_read, list(self.held), self.refused_since_read)
        self.read += len(self.held)
        self.held.clear()
        self.lost_since_read = self.refused_since_read = 0
        return out

    def clear(self) -> None:
        self.held.clear()
        self.written = self.lost = self.read = 0
        self.lost_since_read = self.refused_since_read = 0

    def resize(self, capacity: int) -> None:
        while len(self.held) > capacity:
            self.held.popleft()
            self.lost += 1
            self.lost_since_read += 1
        self.capacity = capacity

    def stats(self):
        return (len(self.held), self.written, self.lost, self.read)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 9)),
        st.tuples(st.just("consume")),
        st.tuples(st.just("events")),
        st.tuples(st.just("clear")),
        st.tuples(st.just("resize"), st.integers(1, 7)),
        st.tuples(st.just("overwrite"), st.booleans()),
        st.tuples(st.just("on"), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 6), ops=OPS)
def _ring_matches_model(capacity, ops):
    cring = cring_module()
    ring, model = cring.Ring(capacity, 7), RingModel(capacity)
    serial = 0
    for op in ops:
        if op[0] == "write":
            for _ in range(op[1]):
                serial += 1
                x = rec(serial, CODES[serial % 3], CODES[serial % 2] if serial % 5 else None,
                        rtype=1 + serial % 5, depth=serial % 7, calltime=serial - 3,
                        sleep=serial % 4, flags=serial % 8, overrun=serial % 3)
                assert ring.write(*x) == model.write(x)
        elif op[0] == "consume":
            assert ring.consume() == model.consume()
        elif op[0] == "events":
            assert ring.events() == list(model.held)
        elif op[0] == "clear":
            ring.clear()
            model.clear()
        elif op[0] == "resize":
            ring.resize(op[1])
            model.resize(op[1])
        else:
            setattr(ring, op[0], op[1])
            setattr(model, op[0], op[1])
        assert ring.stats() == model.stats()
        assert ring.events() == list(model.held)
        assert ring.capacity == model.capacity
        assert ring.head - ring.floor <= ring.capacity
        assert ring.floor - ring.read_pos == model.lost_since_read
        assert ring.refused_unreported == model.refused_since_read


def test_ring_matches_model():
    cring_module()
    _ring_matches_model()


@settings(max_examples=150, deadline=None)
@given(size_kb=st.integers(1, 3), ops=st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 30)),
        st.tuples(st.just("consume")),
        st.tuples(st.just("clear")),
        st.tuples(st.just("resize"), st.integers(1, 4)),
        st.tuples(st.just("overwrite"), st.booleans()),
        st.tuples(st.just("on"), st.booleans()),
    ), max_size=40))
def _ring_counts_like_python_buffer(size_kb, ops):
    """A C ring of the Python buffer's capacity counts exactly as the Python buffer does
    (ThreadStats' entries/written/lost/read), and a consuming read takes the same events
    and reports the same number lost (the Python buffer may place a gap mid-batch, the C
    ring reports refusals after its records)."""
    cring = cring_module()
    tb = TraceBuffer(size_kb)
    buf = tb.local()
    ring = cring.Ring(tb.capacity, buf.tid)
    serial = 0
    for op in ops:
        if op[0] == "write":
            for _ in range(op[1]):
                serial += 1
                buf.append((0, serial, buf.tid, serial))
                write(ring, serial)
        elif op[0] == "consume":
            items = buf._consume()
            lost_before, records, lost_after = ring.consume()
            assert [e[1] for e in items if not isinstance(e, Lost)] == tss(records)
            assert sum(e.count for e in items if isinstance(e, Lost)) == lost_before + lost_after
        elif op[0] == "clear":
            tb.clear()
            ring.clear()
        elif op[0] == "resize":
            tb.resize(op[1])
            ring.resize(tb.capacity)
        elif op[0] == "overwrite":
            tb.overwrite = ring.overwrite = op[1]
        else:
            tb.tracing_on = ring.on = op[1]
        s = buf.stats()
        assert (s.entries, s.written, s.lost, s.read) == ring.stats()
        assert [e[1] for e in buf.events()] == tss(ring.events())


def test_ring_counts_like_python_buffer():
    cring_module()
    _ring_counts_like_python_buffer()


# -- through TraceBuffer ------------------------------------------------------------------------


def py_entry(buf, ts, name="py.f", depth=0):
    ev = (2, ts, buf.tid, depth, name, "")
    buf.append(ev)
    return ev


def test_native_local_is_the_threads_buffer(cring):
    tb = TraceBuffer(8)
    assert tb.native_available() is True
    ring = tb.native_local(names)
    assert isinstance(ring, cring.Ring)
    assert tb.native_local(names) is ring
    buf = tb.local()
    assert buf.native is ring and ring.tid == buf.tid
    assert ring.capacity == tb.native_capacity == 8 * 1024 // cring.RECORD_BYTES
    assert tb.buffers() == [buf] and list(tb.threads()) == [buf.tid]
    assert tb.header().endswith("#P:1")
    assert tb._poll_seconds == NATIVE_PIPE_POLL_SECONDS


def test_native_unavailable(monkeypatch):
    monkeypatch.setattr(native, "_cring", None)
    monkeypatch.setattr(native, "NATIVE_AVAILABLE", False)
    tb = TraceBuffer(8)
    assert tb.native_available() is False
    with pytest.raises(ImportError, match="not built"):
        tb.native_local(names)
    with pytest.raises(native.NativeRingUnavailable):
        tb.native_local(names)
    assert tb.local().native is None  # the Python buffer is still there and usable


def test_decoded_shapes(cring):
    tb = TraceBuffer(8)
    ring = tb.native_local(names)
    tid = tb.local().tid
    ring.write(*rec(1, ALPHA, BETA, rtype=1, depth=17))
    ring.write(*rec(2, ALPHA, None, rtype=1, depth=0))
    ring.write(*rec(3, BETA, rtype=2, depth=1))
    ring.write(*rec(4, BETA, rtype=3, depth=1, calltime=3, sleep=5, flags=4, overrun=2))
    ring.write(*rec(5, GAMMA, rtype=4, depth=2))
    ring.write(*rec(6, GAMMA, rtype=5, depth=2))
    ring.write(*rec(7, GAMMA, rtype=99))
    assert tb.snapshot() == [
        (1, 1, tid, "mod.f_alpha", "mod.f_beta", 17),
        (1, 2, tid, "mod.f_alpha", "", 0),
        (2, 3, tid, 1, "mod.f_beta", ""),
        (3, 4, tid, 1, "mod.f_beta", 3, 2, 5, 4, ""),
        (4, 5, tid, 2, "mod.f_gamma"),
        (5, 6, tid, 2, "mod.f_gamma"),
        (7, 7, tid, "rethook: native record of unknown type 99"),
    ]


def test_names_are_cached_during_one_read(cring):
    calls = []

    def counting(code):
        calls.append(code)
        return names(code)

    tb = TraceBuffer(8)
    ring = tb.native_local(counting)
    for ts in range(30):
        write(ring, ts, code=CODES[ts % 2])
    tb.local().events()
    assert sorted(c.co_name for c in calls) == ["f_alpha", "f_beta"]
    tb.native_local(names)  # the last name_of given wins
    assert tb.snapshot()[0][4] == "mod.f_alpha" and len(calls) == 2


def test_events_snapshot_and_header_merge_both_halves(cring):
    tb = TraceBuffer(8)
    buf = tb.local()
    ring = tb.native_local(names)
    py = [py_entry(buf, ts) for ts in (10, 30, 50)]
    for ts in (20, 30, 40):
        write(ring, ts, code=BETA)
    tid = buf.tid
    nat = {ts: (2, ts, tid, 0, "mod.f_beta", "") for ts in (20, 30, 40)}
    expected = [py[0], nat[20], nat[30], py[1], nat[40], py[2]]  # native first at equal ts
    assert buf.events() == expected
    assert tb.snapshot() == expected
    assert list(tb.iter_trace()) == expected
    assert tb.header() == "# entries-in-buffer/entries-written: 6/6   #P:1"
    s = buf.stats()
    assert (s.entries, s.written, s.lost, s.read) == (6, 6, 0, 0)
    assert tb.totals() == (6, 6, 0, 0)


def test_pipe_merges_and_places_lost(cring):
    tb = TraceBuffer(1)  # 18 native records, 6 Python events
    buf = tb.local()
    ring = tb.native_local(names)
    tid = buf.tid
    cap = tb.native_capacity
    assert cap == 1024 // cring.RECORD_BYTES
    a = py_entry(buf, 50)
    b = py_entry(buf, 100 + 5)
    for ts in range(100, 100 + cap + 2):  # the two oldest are overwritten
        write(ring, ts)
    pipe = tb.pipe()
    items = pipe.read(0)
    nat = [(2, ts, tid, 0, "mod.f_alpha", "") for ts in range(102, 100 + cap + 2)]
    assert items == [a, Lost(tid, 2), *nat[:4], b, *nat[4:]]
    assert pipe.read(0) == []
    s = buf.stats()
    assert (s.entries, s.written, s.lost, s.read) == (0, cap + 4, 2, cap + 2)
    # refused native records are reported after the native events of the batch
    tb.overwrite = False
    for ts in range(200, 200 + cap + 3):
        write(ring, ts)
    c = py_entry(buf, 300)
    items = pipe.read(0)
    assert items[-2:] == [c, Lost(tid, 3)] or items[-2:] == [Lost(tid, 3), c]
    assert [i for i in items if isinstance(i, Lost)] == [Lost(tid, 3)]
    assert [i[1] for i in items if not isinstance(i, Lost)] == [*range(200, 200 + cap), 300]
    assert tb.totals() == (0, 2 * cap + 8, 5, 2 * cap + 3)


def test_threads_counted_once_and_a_second_threads_ring(cring):
    tb = TraceBuffer(8)
    main = tb.local()
    main_ring = tb.native_local(names)
    write(main_ring, 1)
    py_entry(main, 2)
    seen = {}

    def work():
        ring = tb.native_local(names)
        buf = tb.local()
        seen.update(ring=ring, buf=buf, tid=threading.get_native_id())
        write(ring, 3, code=GAMMA)
        py_entry(buf, 4, "py.worker")

    t = threading.Thread(target=work, name="worker")
    t.start()
    t.join(JOIN_SECONDS)
    assert not t.is_alive()
    ring, buf, tid = seen["ring"], seen["buf"], seen["tid"]
    assert ring is not main_ring and ring.tid == buf.tid == tid
    # any thread holding the GIL may write into a thread's ring: the events are that thread's
    write(ring, 5, code=BETA)
    assert tb.threads() == {main.tid: "MainThread", tid: "worker"}
    assert tb.header() == "# entries-in-buffer/entries-written: 5/5   #P:2"
    assert [(e[1], e[2], e[4]) for e in tb.snapshot()] == [
        (1, main.tid, "mod.f_alpha"), (2, main.tid, "py.f"), (3, tid, "mod.f_gamma"),
        (4, tid, "py.worker"), (5, tid, "mod.f_beta")]
    by_tid = {s.tid: s for s in tb.stats()}
    assert (by_tid[tid].entries, by_tid[tid].written) == (3, 3)
    assert (by_tid[main.tid].entries, by_tid[main.tid].written) == (2, 2)
    items = tb.pipe().read(0)
    assert [i[1] for i in items] == [1, 2, 3, 4, 5]
    tb.clear()  # forgets the ended thread, ring included
    assert tb.threads() == {main.tid: "MainThread"}


def test_configuration_reaches_the_rings(cring):
    tb = TraceBuffer(4)
    ring = tb.native_local(names)
    tb.tracing_on = False
    assert ring.on is False and write(ring, 1) is False
    tb.tracing_on = True
    tb.overwrite = False
    assert ring.on is True and ring.overwrite is False
    for ts in range(ring.capacity + 2):
        write(ring, ts)
    assert buf_stats(tb) == (ring.capacity, ring.capacity + 2, 2, 0)
    big = ring.capacity
    tb.resize(1)  # keeps the newest that fit; the rest are lost
    small = ring.capacity
    assert small == tb.native_capacity == 1024 // cring.RECORD_BYTES
    assert [e[1] for e in tb.snapshot()] == list(range(big - small, big))
    assert buf_stats(tb) == (small, big + 2, big + 2 - small, 0)
    tb.resize(4)
    assert ring.capacity == big and buf_stats(tb) == (small, big + 2, big + 2 - small, 0)
    tb.clear()
    assert ring.stats() == (0, 0, 0, 0) and buf_stats(tb) == (0, 0, 0, 0)

    # a ring made while tracing is off, in a non-overwriting buffer, starts that way
    tb.tracing_on = False
    made = {}
    t = threading.Thread(target=lambda: made.update(ring=tb.native_local(names)))
    t.start()
    t.join(JOIN_SECONDS)
    assert (made["ring"].on, made["ring"].overwrite) == (False, False)
    assert made["ring"].capacity == tb.native_capacity


def buf_stats(tb):
    s = tb.local().stats()
    return (s.entries, s.written, s.lost, s.read)


def test_trace_file_holds_native_events(cring):
    tb = TraceBuffer(8)
    buf = tb.local()
    ring = tb.native_local(names)
    py_entry(buf, 5)
    write(ring, 1, rtype=2, depth=0)
    write(ring, 3, code=BETA, parent=ALPHA, rtype=1, depth=12)
    write(ring, 9, rtype=3, depth=0, calltime=1, sleep=2, flags=0, overrun=0)
    out = io.BytesIO()
    count = write_trace(out, tb, builtin_registry())
    assert count == 4
    reader = TraceReader(io.BytesIO(out.getvalue()))
    assert list(reader.events()) == tb.snapshot()
    assert [e[1] for e in tb.snapshot()] == [1, 3, 5, 9]
    assert reader.stats[buf.tid]["written"] == 4


def test_tracefs_views_and_recorder_include_native_events(engine, tmp_path, cring):
    from programs import shapes
    from rethook.control import Tracefs
    from rethook.runner.observers import Recorder

    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "programs.shapes.slow")  # never called here
        fs.write("current_tracer", "function_graph")
        rec_path = tmp_path / "trace.dat"
        recorder = Recorder(str(rec_path), {"tracer": "function_graph"})
        ring = fs.ctx.buffer.native_local(fs.ctx.registry.name)
        mid, leaf = shapes.middle.__code__, shapes.leaf.__code__
        ring.write(2, 1000, mid, None, 0, 0, 0, 0, 0)
        ring.write(2, 2000, leaf, None, 1, 0, 0, 0, 0)
        ring.write(3, 3000, leaf, None, 1, 2000, 0, 0, 0)
        ring.write(3, 9000, mid, None, 0, 1000, 0, 0, 0)
        text = fs.read("trace")  # (before the recorder's drain takes them out of the ring)
        recorder.start(fs)
        recorder.stop(fs)
        fs.write("tracing_on", "0")
        recorder.finish(fs)
    finally:
        fs.close()
    assert text.splitlines()[4:] == [
        " 0)               |  programs.shapes.middle() {",
        " 0)   1.000 us    |    programs.shapes.leaf();",
        " 0)   8.000 us    |  }",
    ]
    with TraceReader(str(rec_path)) as reader:
        events = list(reader.events())
    assert [(e[0], e[1], e[4]) for e in events] == [
        (2, 1000, "programs.shapes.middle"), (2, 2000, "programs.shapes.leaf"),
        (3, 3000, "programs.shapes.leaf"), (3, 9000, "programs.shapes.middle")]
    assert recorder.events == 4 and recorder.lost == 0


def test_a_threads_first_buffer_while_every_function_is_traced():
    """A thread that asks for its buffer itself (``local()``), not from a handler, while
    every function is traced: what making the buffer runs in Python (the thread's name,
    ``weakref.finalize``) is not traced, so no user comes back for the buffer while its lock
    is held (it hung there). In a process of its own: a hang fails it by the timeout."""
    import subprocess

    script = (
        "from rethook.control import Tracefs\n"
        "fs = Tracefs()\n"
        "fs.write('current_tracer', 'function_graph')\n"  # (every function, tracing on)
        "buf = fs.ctx.buffer.local()\n"
        "assert fs.ctx.buffer.local() is buf\n"
        "fs.close()\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr


def test_a_recorder_starts_with_the_program_threads_ring(engine, tmp_path, cring):
    """A recording whose tracer is native makes the starting thread's ring (the program's)
    before its drain's first wait, and that wait comes before start() returns: the drain
    pages the ring's first part in while the program starts, where the request would
    otherwise wait for the drain's first turn at the GIL (a switch interval, by which time a
    short program has written it, a fault a page)."""
    from rethook.control import Tracefs
    from rethook.runner.observers import Recorder

    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "programs.shapes.slow")  # never called here
        fs.write("current_tracer", "function_graph")
        if getattr(fs.tracer.ops, "native", None) is None:
            pytest.skip("the tracer's user is not native here")
        assert fs.ctx.buffer.local().native is None
        recorder = Recorder(str(tmp_path / "trace.dat"), {"tracer": "function_graph"})
        recorder.start(fs)
        try:
            assert fs.ctx.buffer.local().native is not None
            assert recorder._thread is not None and recorder._thread.alive
        finally:
            recorder.stop(fs)
            fs.write("tracing_on", "0")
            recorder.finish(fs)
    finally:
        fs.close()
    assert recorder.error is None and recorder.lost == 0


def test_c_decoding_equals_the_python_reference(cring):
    """Readers decode in C (Ring.events/consume with tid and name_of); native.decode is the
    reference: the same tuples for every record type, non-consuming and consuming."""
    ring = cring.Ring(64, 5)
    ring.write(*rec(1, ALPHA, BETA, rtype=1, depth=17))
    ring.write(*rec(2, ALPHA, None, rtype=1, depth=0))
    ring.write(*rec(3, BETA, rtype=2, depth=1))
    ring.write(*rec(4, BETA, rtype=3, depth=1, calltime=3, sleep=5, flags=4, overrun=2))
    ring.write(*rec(5, GAMMA, rtype=4, depth=2))
    ring.write(*rec(6, GAMMA, rtype=5, depth=-3))
    ring.write(*rec(7, GAMMA, rtype=99))
    want = native.decode(ring.events(), 42, names)
    assert len(want) == 7
    assert ring.events(42, names) == want
    lost_before, got, lost_after = ring.consume(42, names)
    assert (lost_before, got, lost_after) == (0, want, 0)
    assert ring.events(42, names) == [] and ring.stats() == (0, 7, 0, 7)
    with pytest.raises(TypeError, match="both tid and name_of"):
        ring.events(42)

    def failing(code):
        raise LookupError("no name")

    ring.write(*rec(8, ALPHA, rtype=2))
    with pytest.raises(LookupError):
        ring.events(1, failing)
    assert ring.stats()[0] == 1  # a failed non-consuming read leaves the record in place


# -- paging ahead of the writers -------------------------------------------------------------------


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def test_a_new_rings_first_quarter_is_paged_in_by_the_drains_wait(cring):
    """A ring made while a drain can be woken asks the drain to page its first quarter in
    (drainround.h's page_ahead); the drain does in its wait, without the GIL. Writing those
    records then meets (almost) no fresh page: counted in page faults, not timed. A kernel
    without MADV_POPULATE_WRITE (before Linux 5.14) skips the paging: nothing to check."""
    _ccore = pytest.importorskip("rethook.engine._ccore")
    import os
    import re

    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if sys.platform != "linux" or release is None or tuple(map(int, release.groups())) < (5, 14):
        pytest.skip("no MADV_POPULATE_WRITE here")
    capacity = 1 << 17  # 7 MB of records: a mapped array
    _ccore.drain_end()  # (requests left by earlier rings: dropped)
    ring = cring.Ring(capacity, 1)
    quarter = capacity // 4
    pages = quarter * native.RECORD_BYTES // 4096
    _ccore.drain_wait(0.001, False)  # the drain's wait: pages the request in (a poll would not)
    before = _minor_faults()
    for i in range(quarter - 8):
        write(ring, i + 1)
    assert _minor_faults() - before < pages // 10, pages
    # the next quarter was not asked for: its pages are met as they are written
    before = _minor_faults()
    for i in range(quarter):
        write(ring, quarter + i)
    assert _minor_faults() - before > pages // 2


def test_paging_asked_for_an_ended_drain_is_dropped(cring):
    """drain_end() forgets the requests (the next recording's drain does not page memory of
    rings that may be gone), and a poll (the last rounds of a recording) pages nothing."""
    _ccore = pytest.importorskip("rethook.engine._ccore")
    capacity = 1 << 17
    _ccore.drain_end()
    ring = cring.Ring(capacity, 1)
    _ccore.drain_wait(0.0, False)  # a poll: nothing paged
    _ccore.drain_end()  # the request dropped
    _ccore.drain_wait(0.001, False)
    quarter = capacity // 4
    pages = quarter * native.RECORD_BYTES // 4096
    before = _minor_faults()
    for i in range(quarter):
        write(ring, i + 1)
    assert _minor_faults() - before > pages // 2
