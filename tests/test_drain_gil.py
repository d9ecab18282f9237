"""The fused drain with the GIL released (``_tfenc.encode_ring``, _tfenc.c "Encoding with the
GIL released" and "The detached drain"): a large call takes the ring's array out with its
records (the ring goes on in a spare one), then names and encodes them without the GIL, so
the program's threads run meanwhile.

What is held: other threads do run during such a call; it lets the GIL go once, and only when
the policy says so; the file is the tuple path's, byte for byte, whatever is released (the
fused drain's tests are run again with every call releasing); what other threads do
meanwhile (clear, forget_strings, free_scratch, close, fork) leaves everything consistent.
"""

from __future__ import annotations

import gc
import io
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable

import pytest

import test_fused_drain as fd
from rethook.buffer import native, tracefile, traceread
from rethook.buffer.tracefile import TraceWriter
from rethook.tracers.formats import builtin_registry
from test_fused_drain import CODES, TID, cring, finish, fused, names, tuple_path, write_records

_tfenc = tracefile._tfenc
if not hasattr(_tfenc, "_nogil"):
    pytest.skip("rethook.buffer._tfenc is older than this test (no _nogil)",
                allow_module_level=True)

HOLD, POLICY, RELEASE = 0, 1, 2


@pytest.fixture
def gil_mode():
    """Set encode_ring's GIL mode for a test; the policy back after it."""
    def set_mode(mode: int) -> int:
        return _tfenc._nogil(mode)[1]

    yield set_mode
    _tfenc._nogil(POLICY)


def releases() -> int:
    return _tfenc._nogil()[1]


def storm(rings, count: int, codes=CODES) -> None:
    """count records (entries and exits of nested calls) into each ring, fast."""
    ts = 0
    for k in range(count // 2):
        code = codes[k % len(codes)]
        for ring in rings:
            ring.write(2, ts, code, None, k % 7, 0, 0, 0, 0)
            ring.write(3, ts + 40, code, None, k % 7, ts, 0, k % 2, 0)
        ts += 100


class Spinner:
    """A Python thread that notes the time as often as it runs, once let go. The switch
    interval is long (0.2 s): a thread waiting for the GIL gets it within a shorter call
    only if the call lets it go."""

    def __init__(self) -> None:
        self.stamps: list[int] = []
        self.stop = False
        self.go = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        stamps, now = self.stamps, time.perf_counter_ns
        self.go.wait()
        while not self.stop:
            stamps.append(now())

    def __enter__(self) -> Spinner:
        self.interval = sys.getswitchinterval()
        sys.setswitchinterval(0.2)
        self.thread.start()
        self.go.set()  # (it waits for the GIL from now on)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop = True
        self.thread.join()
        sys.setswitchinterval(self.interval)

    def ran_within(self, t0: int, t1: int) -> bool:
        return any(t0 < s < t1 for s in self.stamps)


@pytest.mark.parametrize("mode", [RELEASE, HOLD])
def test_other_threads_run_while_a_large_call_encodes(mode, gil_mode):
    """With the GIL released another Python thread runs during encode_ring; held, it cannot
    (the control); the call releases it once, not once per batch; the payloads are the
    same."""
    count = 300_000
    a, b = cring.Ring(count, TID), cring.Ring(count, TID)
    cache = _tfenc.NameCache()
    table: dict = {}
    twin: dict = {}
    storm((a, b), count)
    gil_mode(HOLD)
    _tfenc.encode_ring(a, TID, names, table, [], 50_000, cache)  # (names the codes)
    _tfenc.encode_ring(b, TID, names, twin, [], 50_000)
    storm((a, b), count)
    gil_mode(mode)
    before = releases()
    gc.collect()
    gc.disable()  # (a collection in the call could run finalizers: Python code, a switch)
    try:
        with Spinner() as spinner:
            t0 = time.perf_counter_ns()
            got = _tfenc.encode_ring(a, TID, names, table, [], 50_000, cache)
            t1 = time.perf_counter_ns()
    finally:
        gc.enable()
    assert releases() == before + (mode == RELEASE)
    assert spinner.ran_within(t0, t1) == (mode == RELEASE)
    gil_mode(HOLD)
    assert got == _tfenc.encode_ring(b, TID, names, twin, [], 50_000)
    assert len(got[2]) == 6 and table == twin


def test_a_thread_writes_its_ring_while_the_drain_encodes_it(gil_mode):
    """The program's thread goes on writing its ring while the drain encodes what it took:
    into the array the ring got in place of the detached one. Every record reaches the file
    once, in order; one refused by a full ring is counted and reported where the tuple path
    reports it; the spare array goes and comes back between the calls, and free_scratch()
    drops it without harm to the next call."""
    gil_mode(RELEASE)
    ring = cring.Ring(5000, TID)
    ring.overwrite = False  # (a record the drain could not keep up with is refused: counted)
    w = fd.new_writer()
    accepted: list[int] = []
    stop = threading.Event()
    interval = sys.getswitchinterval()

    def writer() -> None:
        ts = 0
        while not stop.is_set() and ts < 400_000:
            for _ in range(50):
                ts += 1
                if ring.write(2, ts, CODES[ts % len(CODES)], None, 1, 0, 0, 0, 0):
                    accepted.append(ts)
            time.sleep(0)

    sys.setswitchinterval(1e-5)  # (the two threads take turns often)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        got = 0
        for k in range(200):
            got += fused(w, ring)
            if k == 100:
                _tfenc.free_scratch()
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    got += fused(w, ring)
    entries, total, lost, read = ring.stats()
    assert entries == 0 and read == got == len(accepted) and total == read + lost
    items = fd.read_back(finish(w))
    assert [e[1] for e in items if not isinstance(e, fd.Lost)] == accepted
    assert sum(e.count for e in items if isinstance(e, fd.Lost)) == lost


def test_rings_resized_between_detached_calls(gil_mode):
    """The spare follows the rings' size: a ring resized between calls (buffer_size_kb)
    is detached into an array of its new capacity, and every record still comes out once."""
    gil_mode(RELEASE)
    a, b = cring.Ring(40, TID), cring.Ring(40, TID)
    wa, wb = fd.new_writer(), fd.new_writer()
    ts = 0
    for capacity in (40, 25, 25, 60, 40):
        for ring in (a, b):
            ring.resize(capacity)
        ts = write_records((a, b), [(2 + k % 2, k % 4, None, k % 5, 3, k, 0, 0, 0)
                                    for k in range(capacity - 3)], ts)
        assert fused(wa, a) == tuple_path(wb, b) == capacity - 3
        assert a.stats() == b.stats()
    assert finish(wa) == finish(wb)


def test_the_policy(gil_mode):
    """The GIL goes for 4096 records or more from a ring at most half full, while no drain
    round is open (several threads write: the round is the drain's). With blocking on (the
    program's threads wait for the drain at three quarters full) there are no rounds, and a
    ring more than half full is encoded without the GIL too."""
    gil_mode(POLICY)
    w = fd.new_writer()

    def released(capacity: int, count: int) -> bool:
        ring = cring.Ring(capacity, TID)
        storm((ring,), count)
        before = releases()
        fused(w, ring)
        return releases() - before == 1

    ccore = pytest.importorskip("rethook.engine._ccore", reason="the C core is not built")
    ccore.drain_end()  # no drain runs: blocking off
    assert released(10_000, 4096)
    assert not released(10_000, 4094)  # too few to be worth a handoff
    assert not released(8000, 4096 + 2)  # more than half full: the drain is behind
    ccore.drain_wait(0, True)  # a round: the drain has the GIL first
    try:
        assert not released(10_000, 4096)
    finally:
        ccore.drain_end()
    assert released(10_000, 4096)
    ccore.drain_blocking(1.0)  # a drain runs with blocking on
    try:
        assert released(8000, 4096 + 2)
        ccore.drain_wait(0, True)  # opens no round
        assert released(10_000, 4096)
        assert not released(10_000, 4094)
    finally:
        ccore.drain_end()


# -- the fused drain's tests, every call releasing the GIL -------------------------------------

RERUN = [
    "test_same_bytes_and_accounting_as_the_tuple_path",
    "test_columns_of_one_value_in_wrapping_rings",
    "test_lost_markers_where_the_tuple_path_puts_them",
    "test_the_fused_path_makes_no_event_tuples",
    "test_unknown_record_types_go_the_tuple_path",
    "test_names_that_are_not_str_go_the_tuple_path",
    "test_a_failing_name_of_counts_the_records_lost_like_consume",
    "test_references_are_released",
    "test_a_code_whose_last_reference_is_a_record_is_freed_after_the_read",
    "test_name_of_writing_the_ring_meanwhile",
    "test_reentrant_calls",
    "test_the_writer_names_each_code_once",
    "test_a_name_cache_follows_the_string_table",
    "test_a_name_cache_drops_the_names_of_another_name_of",
    "test_a_failed_write_forgets_the_strings_in_the_name_cache",
    "test_a_failed_batch_forgets_the_strings_in_the_name_cache",
    "test_a_name_cache_after_running_out_of_memory",
    "test_a_name_cache_encodes_what_a_table_of_the_call_encodes",
    "test_reentrant_calls_into_the_same_writer",
    "test_name_cache_api",
    "test_prepared_writer_writes_the_same",
    "test_pipe_rounds_write_what_the_tuple_path_writes",
    "test_which_rounds_are_fused",
]


@pytest.mark.parametrize("name", RERUN)
def test_fused_drain_tests_with_the_gil_released(name, gil_mode):
    gil_mode(RELEASE)
    before = releases()
    getattr(fd, name)()
    assert releases() > before or name in ("test_unknown_record_types_go_the_tuple_path",
                                          "test_names_that_are_not_str_go_the_tuple_path",
                                          "test_a_failing_name_of_counts_the_records_lost_"
                                          "like_consume")


@pytest.mark.parametrize("batch", [1, 2, 3, 7])
def test_batches_split_with_the_gil_released(batch, gil_mode):
    gil_mode(RELEASE)
    fd.test_batches_split_as_write_events_splits(batch)


@pytest.mark.parametrize("action", ["overwrite", "clear", "resize", "consume"])
def test_name_of_changing_the_ring_with_the_gil_released(action, gil_mode):
    gil_mode(RELEASE)
    fd.test_name_of_changing_the_ring_meanwhile(action, detached=True)


def test_new_strings_between_released_batches(gil_mode):
    """Batches naming strings the table lacks are encoded after the others, with the GIL:
    the strings still go into the table in the tuple path's order, each STR chunk before
    the first batch using it, over rounds that bring new codes now and then."""
    gil_mode(RELEASE)
    codes = [compile(f"def f{i}(): pass", "gen", "exec").co_consts[0] for i in range(40)]
    a, b = cring.Ring(600, TID), cring.Ring(600, TID)
    wa, wb = fd.new_writer(37), fd.new_writer(37)
    ts = 0
    for r in range(8):
        # mostly codes met before, a few new ones late in the round
        known = codes[: 5 + 4 * r]
        for k in range(500):
            new = codes[min(39, 6 + 4 * r + k // 90)]
            code = known[(k * 7) % len(known)] if k % 90 != 89 else new
            ts += 10
            for ring in (a, b):
                ring.write(2 + k % 2, ts, code, None, k % 5, ts - 5, 0, 0, 0)
        assert fused(wa, a) == tuple_path(wb, b) == 500
        assert wa._strings == wb._strings
    assert finish(wa) == finish(wb)


def held() -> int:
    """Records the released calls named or encoded with the GIL held all the same."""
    return _tfenc._nogil()[2]


@pytest.mark.parametrize("every", [5_000, 40_000])
def test_new_codes_take_the_gil_for_themselves_only(every, gil_mode):
    """A large call whose records meet codes never named (a program's first rounds): only a
    record of each new code is named with the GIL held (name_of is Python code), and the
    batches naming strings the table lacks are encoded without it, the strings added in the
    held path's order: the file is the tuple path's, byte for byte."""
    gil_mode(RELEASE)
    count = 200_000
    codes = [compile(f"def g{i}(): pass", "gen", "exec").co_consts[0]
             for i in range(count // every)]
    a, b = cring.Ring(count, TID), cring.Ring(count, TID)
    wa, wb = fd.new_writer(20_000), fd.new_writer(20_000)
    storm((a, b), 100)  # (the writers name CODES first)
    assert fused(wa, a) == tuple_path(wb, b) == 100
    ts = 10**6
    for k in range(count // 2):  # a new code every `every` records, the known ones between
        code = codes[2 * k // every] if k % 3 == 0 else CODES[k % len(CODES)]
        for ring in (a, b):
            ring.write(2, ts, code, None, k % 7, 0, 0, 0, 0)
            ring.write(3, ts + 40, code, None, k % 7, ts, 0, 0, 0)
        ts += 100
    before = held()
    assert fused(wa, a) == tuple_path(wb, b) == count
    assert held() - before == len(codes)  # one record per new code
    assert wa._strings == wb._strings
    assert finish(wa) == finish(wb)


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _skip_without_populate() -> None:
    import re

    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if sys.platform != "linux" or release is None or tuple(map(int, release.groups())) < (5, 14):
        pytest.skip("no MADV_POPULATE_WRITE here")


def test_a_fresh_ring_faults_once_a_page():
    """A writer does not read the slot it fills below the ring's capacity (empty by the
    ring's invariant): a read of a page nobody has touched maps the zero page, and the write
    then faults a second time. Counted, not timed."""
    if sys.platform != "linux":
        pytest.skip("per-thread fault counts are Linux's")
    count = 40_000
    pages = count * native.RECORD_BYTES // 4096
    ring = cring.Ring(1 << 17, TID)  # (mapped on its own: fresh pages)
    before = _minor_faults()
    storm((ring,), count)
    faults = _minor_faults() - before
    assert faults < pages * 1.2, (faults, pages)  # (782 when the slot was read first)


_FIRST_ROUND = 1 << 17  # (the ring's capacity: a first round drains a quarter of it)


def _first_round_faults(before_round: Callable[[], object]) -> int:
    """Faults of a first round's encoding of a quarter ring, after prepare_native asked the
    drain to page in what it writes of the encoder's memory and ``before_round`` ran."""
    _tfenc.free_scratch()
    w, ring = fd.new_writer(), cring.Ring(_FIRST_ROUND, TID)
    storm((ring,), _FIRST_ROUND // 4)
    w.prepare_native(_FIRST_ROUND)
    before_round()
    before = _minor_faults()
    assert fused(w, ring) == _FIRST_ROUND // 4
    return _minor_faults() - before


def test_reserve_has_the_drain_page_in_a_first_round():
    """TraceWriter.prepare_native asks the drain to page in what a first round of a quarter
    ring writes of the encoder's memory (served in its next wait, without the GIL): the
    round then meets far fewer fresh pages than when the request is dropped."""
    _skip_without_populate()
    ccore = pytest.importorskip("rethook.engine._ccore", reason="the C core is not built")
    faults = {False: _first_round_faults(ccore.drain_end),  # (drops the requests)
              True: _first_round_faults(lambda: ccore.drain_wait(0.001, False))}  # (serves)
    _tfenc.free_scratch()
    assert faults[True] < faults[False] * 0.8, faults  # (~1,500 against ~2,400)


def test_drain_wake_cuts_the_paging_short():
    """The drain pages the writers' memory in steps (engine/_ccore.c, PAGE_STEP), and
    drain_wake(), which the thread stopping the drain calls, ends the paging at the next
    step: a program that ends as it starts does not wait for the ~11 MB asked as it began.
    Seen in the first round's faults: as many as with nothing paged in, not timed."""
    _skip_without_populate()
    ccore = pytest.importorskip("rethook.engine._ccore", reason="the C core is not built")

    def wait(cut: bool) -> None:
        if cut:
            ccore.drain_wake()  # (as Recorder._join: before the drain's wait serves them)
        ccore.drain_wait(0.001, False)
        ccore.drain_end()  # (drops what is left, and lets the next drain page again)

    faults = {cut: _first_round_faults(lambda cut=cut: wait(cut)) for cut in (False, True)}
    _tfenc.free_scratch()
    assert faults[True] > faults[False] * 1.25, faults  # (as test_reserve_has_the_drain...)


def test_a_ring_that_is_off_is_not_paged_ahead(gil_mode):
    """A released call pages in where the ring's writers go next (ahead_of), unless the ring
    is off (tracing_on 0: a recording's last drain), where nothing will write it again. Seen
    in the page faults of writing there afterwards (the ring turned on again), not timed."""
    _skip_without_populate()
    gil_mode(RELEASE)
    count = 40_000
    pages = count * native.RECORD_BYTES // 4096
    faults = {}
    for on in (True, False):
        ring, w = cring.Ring(1 << 17, TID), fd.new_writer()
        storm((ring,), 100)
        assert fused(w, ring) == 100  # (names the codes, sizes the scratch memory)
        storm((ring,), count)
        ring.on = on
        assert fused(w, ring) == count  # (its array taken out: the ring goes on in another)
        ring.on = True
        before = _minor_faults()
        storm((ring,), count)  # where the writers go next
        faults[on] = _minor_faults() - before
    assert faults[True] < pages // 10 and faults[False] > pages // 2, (faults, pages)


# -- other threads while the GIL is released -----------------------------------------------------


def _writer_and_full_ring(count: int = 200_000):
    """A writer that has named the ring's codes (a first, small call), and the ring then
    filled with ``count`` records: the next call encodes them with the GIL released."""
    ring = cring.Ring(count, TID)
    storm((ring,), 100)
    w = fd.new_writer()
    fused(w, ring)
    storm((ring,), count)
    return w, ring


def _while_released(action) -> threading.Thread:
    """Run action() in another thread as soon as a call has released the GIL."""
    start = releases()

    def waiter():
        while releases() == start:
            time.sleep(0)
        action()

    t = threading.Thread(target=waiter)
    t.start()
    return t


@pytest.mark.parametrize("what", ["clear", "forget", "free_scratch"])
def test_the_names_and_memory_while_released(what, gil_mode):
    """NameCache.clear(), forget_strings() and free_scratch() from another thread while a
    call encodes without the GIL: done when it can be (the call's end, or once the GIL is
    back), and the files are still the tuple path's."""
    gil_mode(RELEASE)
    count = 200_000
    a, b = cring.Ring(count, TID), cring.Ring(count, TID)
    wa, wb = fd.new_writer(30_000), fd.new_writer(30_000)
    for _ in range(2):
        storm((a, b), count)
        actions = {
            "clear": wa._names.clear if wa._names is not None else lambda: None,
            "forget": (lambda: wa._names.forget_strings(0)) if wa._names is not None
            else lambda: None,
            "free_scratch": _tfenc.free_scratch,
        }
        t = _while_released(actions[what])
        assert fused(wa, a) == tuple_path(wb, b) == count
        t.join()
        assert wa._strings == wb._strings
    if what == "clear":
        assert len(wa._names) == 0
    assert finish(wa) == finish(wb)


def test_the_writer_closed_while_released(gil_mode):
    """close() from another thread while write_native encodes without the GIL waits for the
    call: its events are in the file, before the END chunk."""
    gil_mode(RELEASE)
    w, ring = _writer_and_full_ring()
    before = w.events_written
    t = _while_released(w.close)
    got = fused(w, ring)
    t.join()
    data = w._file.getvalue()
    assert fd.chunk_tags(data)[-1] == tracefile.TAG_END
    assert ring.stats()[0] == 0 and w.events_written == before + got > before
    assert sum(1 for _ in traceread.TraceReader(io.BytesIO(data)).events()) == before + got


def _file_writer(path, batch: int = 30_000) -> TraceWriter:
    return TraceWriter(open(path, "wb", buffering=0), {"test": True},
                       formats=builtin_registry(), batch_events=batch)


@pytest.mark.parametrize("mode", [POLICY, RELEASE])
def test_a_released_call_writes_its_chunks_to_a_regular_file(gil_mode, tmp_path, monkeypatch,
                                                            mode):
    """To a regular file, a call that encodes without the GIL also writes its chunks itself
    (no write_held, no payloads handed back) once the file defines what they use: the
    file is the tuple path's, byte for byte."""
    gil_mode(mode)
    held = []
    real = _tfenc.write_held
    monkeypatch.setattr(_tfenc, "write_held", lambda f, parts: held.append(1) or real(f, parts))
    count = 100_000
    a, b = cring.Ring(2 * count, TID), cring.Ring(2 * count, TID)  # (at most half full)
    wa, wb = _file_writer(tmp_path / "a.dat"), _file_writer(tmp_path / "b.dat")
    for w in (wa, wb):
        w.set_thread_name(TID, "main")
    storm((a, b), 100)
    assert fused(wa, a) == tuple_path(wb, b) == 100  # (defines the formats and strings)
    calls = len(held)
    for _ in range(3):
        storm((a, b), count)
        assert fused(wa, a) == tuple_path(wb, b) == count
    assert len(held) == calls  # every later call wrote its own chunks
    for w in (wa, wb):
        w.close()
        w._file.close()
    assert (tmp_path / "a.dat").read_bytes() == (tmp_path / "b.dat").read_bytes()


@pytest.mark.parametrize("odd", ["", "\u00e9t\u00e9 \U0001f600", "lone \udc80"])
def test_a_released_call_writes_the_strings_it_adds(gil_mode, tmp_path, monkeypatch, odd):
    """A call meeting codes never named (a program's first rounds) writes the STR chunks of
    the names it adds too, before the EVTS chunk that uses them, still without the GIL, from
    each name's UTF-8; a name without one (a lone surrogate, which the writer encodes with
    surrogatepass) leaves the call's chunks to the writer. Either way the file is the tuple
    path's, byte for byte, and every name reads back."""
    gil_mode(RELEASE)
    held = []
    real = _tfenc.write_held
    monkeypatch.setattr(_tfenc, "write_held", lambda f, parts: held.append(1) or real(f, parts))
    per_call, calls = 20_000, 3
    codes = [compile(f"def g{i}(): pass", "gen", "exec").co_consts[0] for i in range(300)]

    def name_of(code):
        return f"mod.{code.co_name}{odd if code.co_name == 'g7' else ''}"

    a, b = cring.Ring(2 * per_call, TID), cring.Ring(2 * per_call, TID)
    wa, wb = _file_writer(tmp_path / "a.dat", 4_000), _file_writer(tmp_path / "b.dat", 4_000)
    for w in (wa, wb):
        w.set_thread_name(TID, "main")
    storm((a, b), 100)
    assert fused(wa, a, name_of) == tuple_path(wb, b, name_of) == 100
    before = len(held)
    for c in range(calls):  # each call meets 100 new codes, spread over its batches
        storm((a, b), per_call, codes[100 * c: 100 * (c + 1)])
        assert fused(wa, a, name_of) == tuple_path(wb, b, name_of) == per_call
    surrogate = "\udc80" in odd
    assert len(held) - before == (1 if surrogate else 0)  # (g7 is met in the first call)
    for w in (wa, wb):
        w.close()
        w._file.close()
    data = (tmp_path / "a.dat").read_bytes()
    assert data == (tmp_path / "b.dat").read_bytes()
    assert fd.chunk_tags(data).count(tracefile.TAG_STRINGS) > calls
    events = list(traceread.TraceReader(io.BytesIO(data)).events())
    assert len(events) == 100 + calls * per_call
    seen = {value for event in events for value in event if isinstance(value, str)}
    assert {name_of(code) for code in codes} <= seen


def test_a_released_call_waits_for_definitions_and_loss(gil_mode, tmp_path, monkeypatch):
    """A definition the writer has not written yet (a thread's new name), or loss to report
    before the events, keeps the call from writing its chunks itself: the writer writes
    them after what comes first, and the file is the tuple path's."""
    gil_mode(RELEASE)
    count = 50_000
    a, b = cring.Ring(count, TID), cring.Ring(count, TID)
    wa, wb = _file_writer(tmp_path / "a.dat"), _file_writer(tmp_path / "b.dat")
    storm((a, b), 100)
    assert fused(wa, a) == tuple_path(wb, b)
    for w in (wa, wb):
        w.set_thread_name(TID, "renamed")  # a THRD chunk pending
    storm((a, b), count)
    assert fused(wa, a) == tuple_path(wb, b) == count
    storm((a, b), count + 1000)  # the ring overwrites: loss before the events
    assert fused(wa, a) == tuple_path(wb, b) == count
    for w in (wa, wb):
        w.close()
        w._file.close()
    data = (tmp_path / "a.dat").read_bytes()
    assert data == (tmp_path / "b.dat").read_bytes()
    assert tracefile.TAG_LOST in fd.chunk_tags(data)


def test_a_failed_write_of_a_released_call(gil_mode, tmp_path):
    """The write a released call makes fails (its file descriptor made read-only
    underneath): an OSError, and its records are counted lost, as for any failed call."""
    gil_mode(RELEASE)
    ring = cring.Ring(10_000, TID)
    w = _file_writer(tmp_path / "a.dat")
    storm((ring,), 100)
    fused(w, ring)
    storm((ring,), 10_000)
    read_only = os.open(tmp_path / "a.dat", os.O_RDONLY)
    os.dup2(read_only, w._file.fileno())
    os.close(read_only)
    with pytest.raises(OSError):
        fused(w, ring)
    entries, written, lost, read = ring.stats()
    assert entries == 0 and lost == 10_000
    w._closed = True  # (its file cannot be finished)
    w._file.close()


def test_close_from_name_of_ends_with_the_call(gil_mode, tmp_path):
    """name_of closes the writer (Python code may): the file closes once the call has
    written its chunks, after them."""
    gil_mode(RELEASE)
    ring = cring.Ring(10_000, TID)
    w = _file_writer(tmp_path / "a.dat")
    seen = []

    def closing(code):
        if not seen:
            w.close()
        seen.append(code)
        return names(code)

    storm((ring,), 10_000)
    assert fused(w, ring, closing) == 10_000
    assert w._closed
    w._file.close()
    data = (tmp_path / "a.dat").read_bytes()
    assert fd.chunk_tags(data)[-1] == tracefile.TAG_END
    assert sum(1 for _ in traceread.TraceReader(io.BytesIO(data)).events()) == 10_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_fork_while_released(gil_mode):
    """A fork while the drain thread encodes without the GIL: in the child that call never
    ends, and what it was using (the writer's NameCache, the module's memory) is usable."""
    gil_mode(RELEASE)
    w, ring = _writer_and_full_ring()
    pids = []

    def fork():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: the same NameCache, and the module's scratch memory
            status = 1
            try:
                a, b = cring.Ring(64, TID), cring.Ring(64, TID)
                write_records((a, b), [(2 + k % 2, k % 4, None, 0, 1, k, 0, 0, 0)
                                       for k in range(40)])
                cache = w._names
                ta: dict = {}
                tb: dict = {}
                got = _tfenc.encode_ring(a, TID, names, ta, [], 16, cache)
                status = 0 if got == _tfenc.encode_ring(b, TID, names, tb, [], 16) else 2
                _tfenc.reserve(1000, 100)
                _tfenc.free_scratch()
            finally:
                os._exit(status)
        pids.append(pid)

    t = _while_released(fork)
    fused(w, ring)
    t.join()
    _, status = os.waitpid(pids[0], 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_reserve(gil_mode):
    """reserve() allocates at once (MemoryError there); the next call pages the memory in,
    with the GIL released (not counted as a release to encode), and encodes as before."""
    gil_mode(POLICY)
    with pytest.raises(MemoryError):
        _tfenc.reserve(1 << 44, 65536)
    for _ in range(3):
        _tfenc.reserve(200_000, 65536)
        _tfenc.free_scratch()
    _tfenc.reserve(1000, 64)
    a, b = cring.Ring(1000, TID), cring.Ring(1000, TID)
    storm((a, b), 1000)
    wa, wb = fd.new_writer(64), fd.new_writer(64)
    before = releases()
    fused(wa, a)
    assert releases() == before  # (1000 records: the GIL held to encode them)
    tuple_path(wb, b)
    assert finish(wa) == finish(wb)
    w = TraceWriter(io.BytesIO(), formats=builtin_registry())
    with pytest.raises(MemoryError):
        w.prepare_native(1 << 44)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_reserve_makes_no_thread():
    """A recording's start-up makes no thread of the encoder's: a program that forks at once
    must not be warned that it is multi-threaded."""
    before = len(os.listdir("/proc/self/task"))
    _tfenc.reserve(150_000, 65536)
    assert len(os.listdir("/proc/self/task")) == before
    _tfenc.free_scratch()


def test_call_sites_lines_learnt_then_read_without_the_gil(gil_mode):
    """Function records leave their caller's line as an instruction offset (CALLER_OFFSET). A
    detached call turns the offsets it has not met into lines with the GIL and learns each
    call site; the next calls read the sites they know without it. Call after call, with
    sites old and new, the file is the tuple path's, and the lines are the callers' own."""
    import dis

    from rethook.buffer import schema

    gil_mode(2)  # every call detached
    sites = {c: [(i.offset, i.positions.lineno) for i in dis.get_instructions(c)
                 if i.positions is not None and i.positions.lineno is not None]
             for c in CODES}
    a, b = cring.Ring(4096, TID), cring.Ring(4096, TID)
    wa, wb = fd.new_writer(), fd.new_writer()
    ts = 0
    want = []
    for call in range(4):
        records = []
        for k in range(300):
            parent = (k + call) % len(CODES)
            offsets = sites[CODES[parent]]
            offset, line = offsets[(k * 7 + call * (len(offsets) // 2)) % len(offsets)]
            records.append((1, k % len(CODES), parent, offset, 1, 0, 0, schema.CALLER_OFFSET, 0))
            want.append(line)
        ts = write_records((a, b), records, ts)
        fused(wa, a)
        tuple_path(wb, b)
    data = finish(wa)
    assert data == finish(wb)
    assert [ev[5] for ev in fd.read_back(data) if isinstance(ev, tuple)] == want
