"""Tests of the per-thread trace ring buffer (rethook.buffer.ring)."""

from __future__ import annotations

import gc
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rethook.buffer.events import Lost
from rethook.buffer.ring import (
    DEFAULT_SIZE_KB,
    NOMINAL_EVENT_BYTES,
    TraceBuffer,
    buffer_geometry,
)

# a thread joined in a test should not take longer than this to finish (a safety net
# against hangs, not a performance threshold)
JOIN_SECONDS = 30


def fill(tb: TraceBuffer, n: int, start: int = 0, fmt: int = 0) -> list[tuple]:
    """Append n events from the calling thread; the timestamp doubles as a serial."""
    buf = tb.local()
    append = buf.append
    events = [(fmt, start + i, buf.tid, start + i) for i in range(n)]
    for ev in events:
        append(ev)
    return events


def run_threads(target, count: int) -> None:
    threads = [threading.Thread(target=target, args=(i,), name=f"w{i}") for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_SECONDS)
        assert not t.is_alive()


def by_tid(tb: TraceBuffer) -> dict[int, object]:
    return {s.tid: s for s in tb.stats()}


# -- geometry ---------------------------------------------------------------------------


def test_geometry_fits_the_byte_budget():
    for size_kb in (1, 2, 7, 64, DEFAULT_SIZE_KB, 10_000):
        capacity, page = buffer_geometry(size_kb)
        budget = size_kb * 1024 // NOMINAL_EVENT_BYTES
        assert capacity >= 1 and page >= 1
        assert capacity + page + min(64, page) <= max(budget, 3)
    tb = TraceBuffer()
    assert (tb.capacity, tb.page_events) == buffer_geometry(DEFAULT_SIZE_KB)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            buffer_geometry(bad)


def test_local_is_per_thread_and_stable():
    tb = TraceBuffer(8)
    mine = tb.local()
    assert tb.local() is mine
    assert mine.tid == threading.get_native_id()
    assert mine.name == threading.current_thread().name
    seen = {}

    def work(i):
        seen[i] = (tb.local(), threading.get_native_id())

    run_threads(work, 3)
    bufs = [b for b, _ in seen.values()]
    assert len({id(b) for b in bufs}) == 3 and mine not in bufs
    assert all(b.tid == tid for b, tid in seen.values())
    assert len(tb.buffers()) == 4


# -- overwrite / drop-newest, one thread ----------------------------------------------------


@pytest.mark.parametrize("size_kb", [1, 4, 16, 64])
def test_overwrite_keeps_newest(size_kb):
    tb = TraceBuffer(size_kb, overwrite=True)
    cap = tb.capacity
    events = fill(tb, 5 * cap + 3)
    assert tb.snapshot() == events[-cap:]
    s = tb.local().stats()
    assert (s.entries, s.written, s.lost, s.read) == (cap, len(events), len(events) - cap, 0)


@pytest.mark.parametrize("size_kb", [1, 4, 16, 64])
def test_no_overwrite_keeps_oldest(size_kb):
    tb = TraceBuffer(size_kb, overwrite=False)
    cap = tb.capacity
    events = fill(tb, 5 * cap + 3)
    assert tb.snapshot() == events[:cap]
    s = tb.local().stats()
    assert (s.entries, s.written, s.lost) == (cap, len(events), len(events) - cap)


def test_under_capacity_nothing_lost():
    for overwrite in (True, False):
        tb = TraceBuffer(64, overwrite=overwrite)
        events = fill(tb, tb.capacity)
        assert tb.snapshot() == events
        assert tb.totals().lost == 0


# -- several real threads -----------------------------------------------------------------


@pytest.mark.parametrize("overwrite", [True, False])
def test_exact_counts_with_threads(overwrite):
    tb = TraceBuffer(16, overwrite=overwrite)
    cap = tb.capacity
    counts = [cap // 2, cap, 3 * cap + 1, 10 * cap + 7]
    made: dict[int, list] = {}
    start = threading.Barrier(len(counts))

    def work(i):
        start.wait()
        made[threading.get_native_id()] = fill(tb, counts[i], start=i * 10**6)

    run_threads(work, len(counts))
    stats = by_tid(tb)
    held = {b.tid: b.events() for b in tb.buffers()}
    for tid, events in made.items():
        n = len(events)
        kept = min(n, cap)
        s = stats[tid]
        assert (s.entries, s.written, s.lost, s.read) == (kept, n, n - kept, 0)
        assert held[tid] == (events[-kept:] if overwrite else events[:kept])
        assert s.finished
    total = tb.totals()
    assert total.written == sum(counts)
    assert total.lost == sum(n - min(n, cap) for n in counts)
    assert tb.header() == (
        f"# entries-in-buffer/entries-written: {total.entries}/{total.written}   #P:{len(counts)}"
    )


def test_snapshot_merges_threads_by_timestamp():
    tb = TraceBuffer(64)

    def work(i):
        buf = tb.local()
        for k in range(100):
            buf.append((0, k * 4 + i, buf.tid, k))  # interleaved timestamps

    run_threads(work, 4)
    snap = tb.snapshot()
    assert [ev[1] for ev in snap] == list(range(400))
    assert list(tb.iter_trace()) == snap


@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("size_kb", [1, 8, 64])
def test_memory_bounded_while_writing(overwrite, size_kb):
    """A watcher thread checks the bounds while writers run past capacity many times."""
    tb = TraceBuffer(size_kb, overwrite=overwrite)
    bound = tb.capacity + tb.page_events + min(64, tb.page_events)
    done = threading.Event()
    violations = []

    def watch():
        while not done.is_set():
            for buf in tb.buffers():
                s = buf.stats()
                if s.entries > tb.capacity or buf.held_events > bound:
                    violations.append((s, buf.held_events))

    watcher = threading.Thread(target=watch)
    watcher.start()
    run_threads(lambda i: fill(tb, 20 * tb.capacity), 3)
    done.set()
    watcher.join(JOIN_SECONDS)
    assert not violations
    for buf in tb.buffers():
        assert buf.held_events <= bound
        assert buf.stats().entries == tb.capacity


# -- pipe -----------------------------------------------------------------------------------


def test_pipe_blocks_until_events_arrive():
    tb = TraceBuffer(64)
    pipe = tb.pipe()
    result = []
    waiting = threading.Event()

    def reader():
        waiting.set()
        result.extend(pipe.read())  # no timeout: returns only once something came

    t = threading.Thread(target=reader)
    t.start()
    waiting.wait()
    events = fill(tb, 5)
    t.join(JOIN_SECONDS)
    assert not t.is_alive()
    assert result  # it returned, so it waited until something came
    assert result + pipe.read(0) == events  # the rest, if any, is still there
    assert tb.totals().entries == 0
    assert tb.totals().read == 5


def test_pipe_consumes_and_reports_lost_overwrite():
    tb = TraceBuffer(4, overwrite=True)
    cap = tb.capacity
    events = fill(tb, 3 * cap)
    items = tb.pipe().read(0)
    assert items == [Lost(tb.local().tid, 2 * cap), *events[-cap:]]
    assert tb.snapshot() == []
    s = tb.local().stats()
    assert (s.entries, s.written, s.lost, s.read) == (0, 3 * cap, 2 * cap, cap)
    more = fill(tb, 2, start=10**6)
    assert tb.pipe().read(0) == more  # no gap: nothing lost since the last read


def test_pipe_reports_lost_no_overwrite():
    tb = TraceBuffer(4, overwrite=False)
    cap = tb.capacity
    tid = tb.local().tid
    first = fill(tb, cap + 10)
    pipe = tb.pipe()
    assert pipe.read(0) == [*first[:cap], Lost(tid, 10)]  # the refused ones, reported last
    second = fill(tb, 3, start=10**6)  # room again: accepted, and no new gap
    assert pipe.read(0) == second
    third = fill(tb, cap + 2, start=2 * 10**6)
    assert pipe.read(0) == [*third[:cap], Lost(tid, 2)]
    s = tb.local().stats()
    assert (s.entries, s.written, s.lost, s.read) == (0, 2 * cap + 15, 12, 2 * cap + 3)


def test_pipe_iteration_ends_on_timeout_and_close():
    tb = TraceBuffer(16)
    events = fill(tb, 3)
    assert list(tb.pipe(timeout=0)) == events
    assert list(tb.pipe(timeout=0)) == []
    pipe = tb.pipe()  # would block forever...
    closer = threading.Timer(0.01, pipe.close)  # ...until closed from another thread
    closer.start()
    assert list(pipe) == []
    closer.join()


def test_pipe_with_concurrent_writers_sees_everything_once():
    tb = TraceBuffer(8, overwrite=False)
    per_thread = 20 * tb.capacity
    got: dict[int, list] = {}
    lost: dict[int, int] = {}
    writers_done = threading.Event()

    def read():
        pipe = tb.pipe()
        while True:
            items = pipe.read(0.01)
            for item in items:
                if isinstance(item, Lost):
                    lost[item.tid] = lost.get(item.tid, 0) + item.count
                else:
                    got.setdefault(item[2], []).append(item)
            if not items and writers_done.is_set():
                return

    reader = threading.Thread(target=read)
    reader.start()
    run_threads(lambda i: fill(tb, per_thread, start=i * 10**6), 3)
    writers_done.set()
    reader.join(JOIN_SECONDS)
    assert not reader.is_alive()
    stats = by_tid(tb)
    assert len(got) == 3
    for tid, events in got.items():
        s = stats[tid]
        serials = [ev[3] for ev in events]
        assert serials == sorted(serials)  # per-thread order kept
        assert len(events) == s.read and s.entries == 0
        assert lost.get(tid, 0) == s.lost
        assert s.read + s.lost == s.written == per_thread


# -- resize / clear / gate / overwrite switch --------------------------------------------------


@pytest.mark.parametrize("overwrite", [True, False])
def test_resize(overwrite):
    tb = TraceBuffer(16, overwrite=overwrite)
    big = tb.capacity
    events = fill(tb, big)
    tb.resize(4)
    small = tb.capacity
    assert small < big
    assert tb.snapshot() == events[-small:]  # shrinking keeps the newest
    assert tb.totals().lost == big - small
    tb.resize(16)
    more = fill(tb, big - small, start=10**6)
    assert tb.snapshot() == events[-small:] + more
    s = tb.local().stats()
    assert (s.entries, s.written, s.lost) == (big, 2 * big - small, big - small)


def test_clear_resets_and_forgets_ended_threads():
    tb = TraceBuffer(8)
    fill(tb, 10)
    run_threads(lambda i: fill(tb, 5), 2)
    assert len(tb.buffers()) == 3
    assert tb.totals().entries == 20  # ended threads stay readable
    tb.clear()
    assert [b.tid for b in tb.buffers()] == [tb.local().tid]
    assert tb.totals() == (0, 0, 0, 0)
    assert tb.snapshot() == []
    events = fill(tb, 3, start=100)
    assert tb.snapshot() == events
    s = tb.local().stats()
    assert (s.entries, s.written, s.lost) == (3, 3, 0)


def test_clear_of_full_no_overwrite_buffer_accepts_again():
    tb = TraceBuffer(4, overwrite=False)
    fill(tb, tb.capacity + 5)
    tb.clear()
    events = fill(tb, 2, start=1000)
    assert tb.snapshot() == events
    assert tb.local().stats()[2:5] == (2, 2, 0)


def test_tracing_off_makes_no_writes():
    tb = TraceBuffer(8)
    buf = tb.local()
    append = buf.append  # cached before the gate closes: must still obey it
    append((0, 1, buf.tid, 1))
    tb.tracing_on = False
    assert not tb.tracing_on
    for i in range(1000):
        append((0, 2 + i, buf.tid, 0))
    new = TraceBuffer(8)
    new.tracing_on = False
    new.local().append((0, 1, 1, 1))
    assert new.totals() == (0, 0, 0, 0)
    tb.tracing_on = True
    append((0, 5000, buf.tid, 2))
    assert [ev[3] for ev in tb.snapshot()] == [1, 2]
    assert buf.stats()[2:5] == (2, 2, 0)


def test_tracing_off_while_full_no_overwrite():
    tb = TraceBuffer(4, overwrite=False)
    cap = tb.capacity
    fill(tb, cap + 3)
    tb.tracing_on = False
    fill(tb, 10)
    tb.tracing_on = True
    fill(tb, 2)
    s = tb.local().stats()
    assert (s.entries, s.written, s.lost) == (cap, cap + 5, 5)


def test_switch_overwrite_mode():
    tb = TraceBuffer(4, overwrite=True)
    cap = tb.capacity
    events = fill(tb, 2 * cap)
    tb.overwrite = False
    assert not tb.overwrite
    fill(tb, 5, start=10**6)  # full: refused
    assert tb.snapshot() == events[-cap:]
    tb.overwrite = True
    newer = fill(tb, 2, start=2 * 10**6)
    assert tb.snapshot() == events[-cap + 2 :] + newer
    s = tb.local().stats()
    assert (s.entries, s.written, s.lost) == (cap, 2 * cap + 7, cap + 7)


def test_finished_thread_buffer_is_marked_and_readable():
    tb = TraceBuffer(8)
    run_threads(lambda i: fill(tb, 4), 1)
    gc.collect()
    (buf,) = tb.buffers()
    assert buf.finished
    assert buf.name == "w0"
    assert len(buf.events()) == 4
    assert tb.threads() == {buf.tid: "w0"}


def test_thread_rename_is_seen():
    tb = TraceBuffer(8)
    me = threading.current_thread()
    old = me.name
    buf = tb.local()
    try:
        me.name = "renamed"
        assert tb.threads()[buf.tid] == "renamed"
    finally:
        me.name = old


# -- model-based: every operation sequence agrees with a simple reference model ------------------


class Model:
    """The buffer's documented semantics, for one thread, written the obvious way."""

    def __init__(self, capacity: int, overwrite: bool) -> None:
        self.capacity, self.overwrite, self.on = capacity, overwrite, True
        self.next_seq = self.clear_seq = self.read_pos = self.consumed = 0
        self.held: list[tuple[int, tuple]] = []

    def append(self, ev):
        if not self.on:
            return
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        if self.overwrite:
            self.held = [*self.held, (seq, ev)][-self.capacity :]
        elif len(self.held) < self.capacity:
            self.held.append((seq, ev))

    def read(self, tid):
        out, pos = [], self.read_pos
        for seq, ev in self.held:
            if seq > pos:
                out.append(Lost(tid, seq - pos))
            out.append(ev)
            pos = seq + 1
        if self.next_seq > pos:  # refused events after the last one held
            out.append(Lost(tid, self.next_seq - pos))
            pos = self.next_seq
        self.read_pos, self.consumed, self.held = pos, self.consumed + len(self.held), []
        return out

    def clear(self):
        self.clear_seq = self.read_pos = self.next_seq
        self.consumed, self.held = 0, []

    def resize(self, capacity):
        self.capacity = capacity
        self.held = self.held[-capacity:]

    def stats(self):
        written = self.next_seq - self.clear_seq
        entries = len(self.held)
        return entries, written, written - entries - self.consumed, self.consumed


OPS = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 200)),
    st.tuples(st.just("read"), st.none()),
    st.tuples(st.just("clear"), st.none()),
    st.tuples(st.just("resize"), st.sampled_from([1, 2, 4, 8, 16])),
    st.tuples(st.just("overwrite"), st.booleans()),
    st.tuples(st.just("gate"), st.booleans()),
)


@settings(max_examples=int(__import__("os").environ.get("RING_EXAMPLES", 300)), deadline=None)
@given(
    size_kb=st.sampled_from([1, 2, 4, 8, 16]),
    overwrite=st.booleans(),
    ops=st.lists(OPS, max_size=30),
)
def test_matches_reference_model(size_kb, overwrite, ops):
    tb = TraceBuffer(size_kb, overwrite=overwrite)
    buf = tb.local()
    append = buf.append
    model = Model(tb.capacity, overwrite)
    serial = 0
    for op, arg in ops:
        if op == "append":
            for _ in range(arg):
                ev = (0, serial, buf.tid, serial)
                serial += 1
                append(ev)
                model.append(ev)
        elif op == "read":
            assert tb.pipe().read(0) == model.read(buf.tid)
        elif op == "clear":
            tb.clear()
            model.clear()
        elif op == "resize":
            tb.resize(arg)
            model.resize(tb.capacity)
        elif op == "overwrite":
            tb.overwrite = model.overwrite = arg
        else:
            tb.tracing_on = model.on = arg
        assert tb.snapshot() == [ev for _, ev in model.held]
        assert tuple(buf.stats())[2:6] == model.stats()
        if op == "append" and model.on:  # a shrinking resize frees memory on the next event
            assert buf.held_events <= tb.capacity + tb.page_events + min(64, tb.page_events)


@pytest.mark.parametrize("seed", range(4))
def test_accounting_survives_concurrent_reconfiguration(seed):
    """Writers, a pipe reader and a thread resizing / switching modes / gating, all at
    once: afterwards every event made is either read or reported lost, in order."""
    rng = random.Random(seed)
    tb = TraceBuffer(rng.choice([1, 4, 16]), overwrite=bool(seed % 2))
    writers_done = threading.Event()
    got: dict[int, list[int]] = {}
    lost: dict[int, int] = {}

    def take(items):
        for item in items:
            if isinstance(item, Lost):
                lost[item.tid] = lost.get(item.tid, 0) + item.count
            else:
                got.setdefault(item[2], []).append(item[3])

    def read():
        pipe = tb.pipe()
        while not writers_done.is_set():
            take(pipe.read(0.001))
            tb.snapshot()

    def reconfigure():
        r = random.Random(seed + 100)
        for _ in range(300):
            op = r.randrange(3)
            if op == 0:
                tb.resize(r.choice([1, 2, 4, 16]))
            elif op == 1:
                tb.overwrite = r.random() < 0.5
            else:
                tb.tracing_on = r.random() < 0.7
        tb.tracing_on = True

    helpers = [threading.Thread(target=read), threading.Thread(target=reconfigure)]
    for t in helpers:
        t.start()
    run_threads(lambda i: fill(tb, 30_000), 3)
    writers_done.set()
    for t in helpers:
        t.join(JOIN_SECONDS)
        assert not t.is_alive()
    take(tb.pipe().read(0))
    for s in tb.stats():
        serials = got.get(s.tid, [])
        assert serials == sorted(set(serials))
        assert (s.entries, s.read, s.lost) == (0, len(serials), lost.get(s.tid, 0))
        assert s.read + s.lost == s.written <= 30_000

