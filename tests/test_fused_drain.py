"""The fused drain: a native ring's records written into the trace file's event chunks in C
(``TraceWriter.write_native``, ``TracePipe.read_or_feed``, ``rethook record``), held to the
tuple path (``Ring.consume(tid, name_of)`` then ``write_events``), which stays the reference.

In-process, two rings (or two TraceBuffers) get the same writes in lockstep; one is drained
through the fused path, the other through the tuple path, and the files must be the same
bytes and the rings must count the same. Through the command line, real programs are
recorded both ways (``RETHOOK_FUSED_DRAIN=0`` forces the tuple path) and must read back to
the same events.
"""

from __future__ import annotations

import gc
import io
import os
import re
import subprocess
import sys
import threading
import weakref
import zlib
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rethook.buffer import native, schema, tracefile
from rethook.buffer.events import EventFormat, Lost
from rethook.buffer.ring import TraceBuffer
from rethook.buffer.tracefile import TraceWriter
from rethook.buffer.traceread import TraceReader
from rethook.tracers.formats import BUILTIN, FUNCGRAPH_ENTRY, builtin_registry

cring = pytest.importorskip("rethook.buffer._cring",
                            reason="rethook.buffer._cring is not built")
if tracefile._tfenc is None or not hasattr(tracefile._tfenc, "encode_ring"):
    pytest.skip("rethook.buffer._tfenc (with encode_ring) is not built", allow_module_level=True)
_tfenc = tracefile._tfenc

TID = 4242


def f_alpha():
    pass


def f_beta():
    pass


def f_gamma():
    pass


def f_delta():
    pass


CODES = (f_alpha.__code__, f_beta.__code__, f_gamma.__code__, f_delta.__code__)


def names(code):
    return f"mod.{code.co_name}"


def clashing(code):
    """Two codes, one name: the string table must hold it once."""
    return "mod.same" if code.co_name in ("f_gamma", "f_delta") else names(code)


# -- helpers -----------------------------------------------------------------------------------


def new_writer(batch: int = tracefile.DEFAULT_BATCH_EVENTS, strings: tuple = ()) -> TraceWriter:
    w = TraceWriter(io.BytesIO(), {"test": True}, formats=builtin_registry(), batch_events=batch)
    if strings:  # a table that already holds some names (written by Python-side events)
        w.write_events([(FUNCGRAPH_ENTRY.id, i, TID, 0, s, "") for i, s in enumerate(strings)])
    return w


def fused(writer, ring, name_of=names, tid=TID):
    return writer.write_native(ring, tid, name_of)


def tuple_path(writer, ring, name_of=names, tid=TID):
    return writer.write_events(native.consumed_items(ring.consume(tid, name_of), tid))


def ring_state(ring):
    return (ring.stats(), ring.head, ring.floor, ring.read_pos, ring.consumed, ring.refused,
            ring.refused_unreported)


def finish(writer) -> bytes:
    writer.close()
    return writer._file.getvalue()


def read_back(data: bytes) -> list:
    return list(TraceReader(io.BytesIO(data)).events(lost=True))


def per_thread(data: bytes) -> dict[int, list]:
    """A file's events and losses, in file order, by thread."""
    out: dict[int, list] = {}
    for item in read_back(data):
        tid = item.tid if isinstance(item, Lost) else item[2]
        out.setdefault(tid, []).append(item)
    return out


def chunk_tags(data: bytes) -> list[bytes]:
    return [tag for _, tag, _ in TraceReader(io.BytesIO(data))._chunks()]


RECORD = st.tuples(
    st.sampled_from([1, 2, 2, 3, 3, 4, 5]),  # record types, graph ones more often
    st.integers(0, 3),  # code
    st.one_of(st.none(), st.integers(0, 3)),  # parent (function records)
    st.integers(-3, 40),  # depth (a function record's caller line)
    st.integers(0, 5000),  # ts step
    st.integers(0, 1 << 40),  # calltime
    st.integers(-2, 1000),  # sleep
    st.one_of(st.integers(0, 7), st.just(schema.CALLER_OFFSET)),  # flags (function records:
    # with CALLER_OFFSET the depth is an offset into the parent's code, read as its line)
    st.integers(0, 2),  # overrun
)


def write_records(rings, records, ts0=0, unknown_every=0):
    """Write the same records into each ring (Ring.write, as a native user would)."""
    ts = ts0
    for k, (rtype, code, parent, depth, step, calltime, sleep, flags, overrun) in enumerate(
            records):
        ts += step
        if unknown_every and k % unknown_every == unknown_every - 1:
            rtype = 42  # becomes a PRINT event: the tuple path takes the round
        args = (rtype, ts, CODES[code], CODES[parent] if parent is not None else None,
                depth, calltime, sleep, flags, overrun)
        for ring in rings:
            ring.write(*args)
    return ts


# -- write_native against the tuple path ----------------------------------------------------------


_STEADY = [(2 + k % 2, k % 4, None, k % 5, 3, k, 0, 0, 0) for k in range(30)]
_FUNCTIONS = [(1, k % 4, (k * 3) % 4 if k % 3 else None, k, 2, 0, 0, 0, 0) for k in range(30)]


@settings(max_examples=250, deadline=None)
@given(rounds=st.lists(st.lists(RECORD, max_size=80), min_size=1, max_size=4),
       capacity=st.integers(1, 40), overwrite=st.booleans(), batch=st.integers(1, 30),
       name_of=st.sampled_from([names, clashing]),
       strings=st.sampled_from([(), ("mod.f_beta",), ("", "mod.same", "x")]),
       unknown_every=st.sampled_from([0, 0, 0, 7]))
# overflowing rings with a Lost before the records and batches smaller than the records
@example(rounds=[_STEADY, _STEADY[:7]], capacity=12, overwrite=True, batch=5, name_of=names,
         strings=(), unknown_every=0)
@example(rounds=[_STEADY, _STEADY[:7]], capacity=12, overwrite=False, batch=1, name_of=names,
         strings=(), unknown_every=0)
@example(rounds=[_FUNCTIONS, _FUNCTIONS], capacity=25, overwrite=True, batch=4,
         name_of=clashing, strings=("", "mod.same", "x"), unknown_every=0)
@example(rounds=[_STEADY], capacity=40, overwrite=True, batch=8, name_of=names, strings=(),
         unknown_every=7)
def test_same_bytes_and_accounting_as_the_tuple_path(rounds, capacity, overwrite, batch,
                                                     name_of, strings, unknown_every):
    a, b = cring.Ring(capacity, TID), cring.Ring(capacity, TID)
    a.overwrite = b.overwrite = overwrite
    wa, wb = new_writer(batch, strings), new_writer(batch, strings)
    ts = 0
    for records in rounds:
        ts = write_records((a, b), records, ts, unknown_every)
        assert fused(wa, a, name_of) == tuple_path(wb, b, name_of)
        assert ring_state(a) == ring_state(b)
        assert wa._strings == wb._strings
    assert finish(wa) == finish(wb)


def test_lost_markers_where_the_tuple_path_puts_them():
    # overwrite: the overwritten ones before the records
    ring = cring.Ring(4, TID)
    for ts in range(10):
        ring.write(2, ts, CODES[0], None, 0, 0, 0, 0, 0)
    w = new_writer()
    assert fused(w, ring) == 4
    items = read_back(finish(w))
    assert items[0] == Lost(TID, 6)
    assert [e[1] for e in items[1:]] == [6, 7, 8, 9]
    assert ring.stats() == (0, 10, 6, 4)
    # refusing: the refused ones after the records
    ring = cring.Ring(3, TID)
    ring.overwrite = False
    for ts in range(5):
        ring.write(3, ts, CODES[1], None, 1, ts - 1, 0, 0, 0)
    w = new_writer()
    assert fused(w, ring) == 3
    assert fused(w, ring) == 0  # nothing more to report
    items = read_back(finish(w))
    assert [e[1] for e in items[:3]] == [0, 1, 2]
    assert items[3:] == [Lost(TID, 2)]
    assert ring.stats() == (0, 5, 2, 3)
    # loss alone (the records were cut by a resize): a Lost marker, no events chunk
    ring = cring.Ring(4, TID)
    for ts in range(3):
        ring.write(2, ts, CODES[2], None, 0, 0, 0, 0, 0)
    ring.resize(1)
    ring.on = False
    ring.resize(2)
    w = new_writer()
    assert fused(w, ring) == 1
    ring.on = True
    data = finish(w)
    assert read_back(data)[0] == Lost(TID, 2)


@settings(max_examples=150, deadline=None)
@given(types=st.lists(st.sampled_from([1, 2, 3, 4, 5]), min_size=1, max_size=60),
       sleep=st.sampled_from([0, -2, 7, None]), overrun=st.sampled_from([0, 2, None]),
       flags=st.sampled_from([0, 5, None]), code=st.sampled_from([0, 3, None]),
       start=st.integers(0, 40), capacity=st.integers(8, 40), batch=st.integers(1, 30),
       strings=st.sampled_from([(), ("",), ("", "mod.f_alpha"), ("mod.f_delta",)]))
def test_columns_of_one_value_in_wrapping_rings(types, sleep, overrun, flags, code, start,
                                                capacity, batch, strings):
    """The encoder's short cuts against the tuple path: a column holding one value in a batch
    (written as a constant without a scan: a negative one too, a name's index), or all but
    one; the tid and "" columns (never stored); the order column (the types as noted);
    records wrapping around the ring's end mid-batch, a type first met after the wrap; names
    the string table lacks in several groups at once (each column named again)."""
    a, b = cring.Ring(capacity, TID), cring.Ring(capacity, TID)
    a.overwrite = b.overwrite = True
    wa, wb = new_writer(batch, strings), new_writer(batch, strings)
    # the rings' write position moved on, so that the records below wrap where it says
    ts = write_records((a, b), [(2, 1, None, 0, 1, 0, 0, 0, 0)] * start)
    assert fused(wa, a) == tuple_path(wb, b)

    def pick(value, k, spread):
        return value if value is not None else k % spread - 1

    records = [(t, pick(code, k, 4) + (code is None), (k * 3) % 4 if k % 3 else None, k % 5,
                3, k, pick(sleep, k, 3), pick(flags, k, 4) + 1, pick(overrun, k, 2) + 1)
               for k, t in enumerate(types)]
    write_records((a, b), records, ts)
    assert fused(wa, a) == tuple_path(wb, b)
    assert ring_state(a) == ring_state(b)
    assert wa._strings == wb._strings
    assert finish(wa) == finish(wb)


@pytest.mark.parametrize("batch", [1, 2, 3, 7])
def test_batches_split_as_write_events_splits(batch):
    """A Lost before the records takes the first batch's first place (write_events slices
    its items, Lost markers included): the chunks are the tuple path's chunks."""
    a, b = cring.Ring(5, TID), cring.Ring(5, TID)
    for ts in range(12):
        for ring in (a, b):
            ring.write(2 + ts % 2, ts, CODES[ts % 3], None, ts % 4, ts, 0, 0, 0)
    wa, wb = new_writer(batch), new_writer(batch)
    fused(wa, a)
    tuple_path(wb, b)
    da, db = finish(wa), finish(wb)
    assert da == db
    # 5 records after a Lost: batch - 1 of them in the first chunk, then batch a chunk
    sizes = {1: [1] * 5, 2: [1, 2, 2], 3: [2, 3], 7: [5]}[batch]
    tags = chunk_tags(da)
    assert tags.count(tracefile.TAG_EVENTS) == len(sizes)
    assert tags.index(tracefile.TAG_LOST) < tags.index(tracefile.TAG_EVENTS)


def test_the_fused_path_makes_no_event_tuples():
    """encode_ring returns chunks, not events, for records of the five native types."""
    ring = cring.Ring(64, TID)
    write_records((ring,), [(2, 0, None, 1, 5, 0, 0, 0, 0), (3, 0, None, 1, 5, 9, 0, 0, 0)] * 8)
    new_strings: list[str] = []
    lost_before, lost_after, batches, events = _tfenc.encode_ring(
        ring, TID, names, {}, new_strings, 6)
    assert (lost_before, lost_after, events) == (0, 0, None)
    assert [len(b) for b in batches] == [4, 4, 4]
    assert new_strings == ["mod.f_alpha", ""]
    assert [b[3] for b in batches] == [2, 0, 0]  # the strings each batch defines
    for payload, crc, fids, _ in batches:
        head = tracefile._CHUNK_HEAD.pack(tracefile.TAG_EVENTS, len(payload))
        assert crc == zlib.crc32(payload, zlib.crc32(head))
        assert fids == (2, 3)


def test_unknown_record_types_go_the_tuple_path():
    a, b = cring.Ring(16, TID), cring.Ring(16, TID)
    write_records((a, b), [(2, 0, None, 0, 1, 0, 0, 0, 0)] * 5, unknown_every=3)
    wa, wb = new_writer(), new_writer()
    assert fused(wa, a) == tuple_path(wb, b) == 5
    data = finish(wa)
    assert data == finish(wb)
    assert [e[3] for e in read_back(data) if e[0] == 7] == [
        "rethook: native record of unknown type 42"]


def test_names_that_are_not_str_go_the_tuple_path():
    class Name(str):
        pass

    def odd(code):
        return Name(names(code)) if code is CODES[1] else names(code)

    a, b = cring.Ring(16, TID), cring.Ring(16, TID)
    write_records((a, b), [(2, k % 2, None, 0, 1, 0, 0, 0, 0) for k in range(6)])
    wa, wb = new_writer(), new_writer()
    assert fused(wa, a, odd) == tuple_path(wb, b, odd) == 6
    assert finish(wa) == finish(wb)


def test_a_failing_name_of_counts_the_records_lost_like_consume():
    def failing(code):
        if code is CODES[2]:
            raise RuntimeError("no name")
        return names(code)

    a, b = cring.Ring(16, TID), cring.Ring(16, TID)
    write_records((a, b), [(2, k % 3, None, 0, 1, 0, 0, 0, 0) for k in range(9)])
    wa, wb = new_writer(), new_writer()
    with pytest.raises(RuntimeError, match="no name"):
        fused(wa, a, failing)
    with pytest.raises(RuntimeError, match="no name"):
        tuple_path(wb, b, failing)
    assert ring_state(a) == ring_state(b)
    assert a.stats() == (0, 9, 9, 0)
    assert wa._strings == wb._strings
    write_records((a, b), [(2, 0, None, 0, 1, 0, 0, 0, 0)] * 2)
    assert fused(wa, a) == tuple_path(wb, b) == 2  # the next read reports the gap after
    assert finish(wa) == finish(wb)


def test_without_the_c_encoder_it_is_the_tuple_path(monkeypatch):
    a, b = cring.Ring(8, TID), cring.Ring(8, TID)
    write_records((a, b), [(3, k % 2, None, 1, 3, 2, 0, 4, 0) for k in range(12)])
    wb = new_writer()
    tuple_path(wb, b)
    monkeypatch.setattr(tracefile, "_tfenc", None)
    wa = new_writer()
    assert fused(wa, a) == 8
    assert finish(wa) == finish(wb)
    assert ring_state(a) == ring_state(b)


def test_other_layouts_for_the_native_ids_go_the_tuple_path():
    formats = [f for f in BUILTIN if f.id != 2]
    formats.append(EventFormat(2, "funcgraph_entry", (("depth", "s64"), ("func", "str"),
                                                        ("args", "str"), ("more", "u64"))))
    writer = TraceWriter(io.BytesIO(), formats=formats)
    assert writer._native_encodable() is False
    assert new_writer()._native_encodable() is True
    ring = cring.Ring(4, TID)
    write_records((ring,), [(3, 0, None, 1, 3, 2, 0, 4, 0)])
    assert fused(writer, ring) == 1  # through write_events, with the writer's formats


def test_references_are_released():
    """The records' references go with the read; the writer's NameCache holds one reference
    to each code it names, dropped with another name_of and when the writer closes."""
    def refs():
        return [sys.getrefcount(c) for c in CODES]

    before = refs()
    held = [n + 1 for n in before]
    ring = cring.Ring(32, TID)
    w = new_writer(5)
    for _ in range(3):
        write_records((ring,), [(1 + k % 5, k % 4, (k + 1) % 4, k, 3, 0, 0, 0, 0)
                                for k in range(50)])
        fused(w, ring)
        assert refs() == held and len(w._names) == 4
    write_records((ring,), [(2, 0, None, 0, 1, 0, 0, 0, 0), (9, 1, None, 0, 1, 0, 0, 0, 0)])
    fused(w, ring)  # the tuple path, for the unknown type
    assert refs() == held
    write_records((ring,), [(2, 0, None, 0, 1, 0, 0, 0, 0)] * 3)
    with pytest.raises(ZeroDivisionError):
        fused(w, ring, lambda code: 1 / 0)  # another name_of: the names are dropped first
    assert refs() == before and len(w._names) == 0
    write_records((ring,), [(2, 1, None, 0, 1, 0, 0, 0, 0)] * 3)
    fused(w, ring)
    assert refs() == [before[0], held[1], *before[2:]]
    w.close()
    assert refs() == before and w._names is None
    # a table of the call's own (no NameCache) keeps nothing
    write_records((ring,), [(1 + k % 5, k % 4, (k + 1) % 4, k, 3, 0, 0, 0, 0)
                            for k in range(20)])
    _tfenc.encode_ring(ring, TID, names, {}, [], 5)
    assert refs() == before


def test_a_code_whose_last_reference_is_a_record_is_freed_after_the_read():
    """Freeing a code runs Python code (weakref callbacks): only once every record is out
    of the ring. A callback that writes into the ring lands in the next read. A table of
    the call's own frees it at the end of the read; the writer's NameCache keeps it until
    it drops its names -- here at the start of a call with another name_of, before the
    records are named, so that the callback's record is in that call's read."""
    ring = cring.Ring(16, TID)
    ns: dict = {}
    exec("def ephemeral():\n    pass\n", ns)
    code = ns.pop("ephemeral").__code__
    fired = []

    def gone(_ref):
        fired.append(ring.head)
        ring.write(2, 99, CODES[0], None, 0, 0, 0, 0, 0)

    ref = weakref.ref(code, gone)
    ring.write(2, 1, code, None, 0, 0, 0, 0, 0)
    ring.write(3, 2, code, None, 0, 1, 0, 0, 0)
    twin = cring.Ring(16, TID)
    twin.write(2, 1, code, None, 0, 0, 0, 0, 0)
    twin.write(3, 2, code, None, 0, 1, 0, 0, 0)
    new_strings: list[str] = []
    _tfenc.encode_ring(twin, TID, names, {}, new_strings, 8)  # its own table
    assert new_strings == ["mod.ephemeral", ""]
    del code
    gc.collect()
    assert ref() is not None and not fired  # the ring keeps it
    w = new_writer()
    assert fused(w, ring) == 2
    assert ref() is not None and not fired and len(w._names) == 1  # the NameCache keeps it
    assert ring.stats() == (0, 2, 0, 2)
    assert fused(w, ring, clashing) == 1  # another name_of: the names are dropped first
    assert ref() is None and fired == [2]
    assert ring.stats() == (0, 3, 0, 3)
    events = read_back(finish(w))
    assert [(e[0], e[1], e[4]) for e in events] == [
        (2, 1, "mod.ephemeral"), (3, 2, "mod.ephemeral"), (2, 99, "mod.f_alpha")]


def test_name_of_writing_the_ring_meanwhile():
    """name_of runs Python code, during which the program may write the ring: what it
    writes before the records are taken is in this read (the tuple path, which names after
    taking, has it in the next one); the file holds the same events in the same order."""
    state = {"left": 1}

    def make_writing(ring):
        def name_of(code):
            if state["left"]:
                state["left"] -= 1
                for ts in (1000, 1001):
                    ring.write(2, ts, CODES[3], None, 5, 0, 0, 0, 0)
            return names(code)
        return name_of

    files = []
    for path in (fused, tuple_path):
        state["left"] = 1
        ring = cring.Ring(64, TID)
        write_records((ring,), [(2, k % 3, None, 0, 1, 0, 0, 0, 0) for k in range(5)])
        w = new_writer()
        total = path(w, ring, make_writing(ring)) + path(w, ring, make_writing(ring))
        assert total == 7 and ring.stats() == (0, 7, 0, 7)
        files.append(read_back(finish(w)))
    assert files[0] == files[1]
    assert [e[1] for e in files[0]] == [1, 2, 3, 4, 5, 1000, 1001]


@pytest.mark.parametrize("action", ["overwrite", "clear", "resize", "consume"])
def test_name_of_changing_the_ring_meanwhile(action, detached=False):
    """name_of runs Python code, which may write, clear, resize or consume the ring. Read in
    place, the records are named before they are taken: the call names what the ring holds
    once nothing runs any more. Detached (a call that lets the GIL go, test_drain_gil.py),
    the records are taken first: what name_of does changes the ring they left, and what it
    writes is the next call's."""
    ring = cring.Ring(8, TID)
    state = {"done": False}

    def name_of(code):
        if not state["done"]:
            state["done"] = True
            if action == "overwrite":
                for ts in range(100, 106):
                    ring.write(3, ts, CODES[1], None, 2, 99, 0, 0, 0)
            elif action == "clear":
                ring.clear()
                ring.write(2, 200, CODES[2], None, 0, 0, 0, 0, 0)
            elif action == "resize":
                ring.resize(3)
            else:
                ring.consume()
        return names(code)

    write_records((ring,), [(2, 0, None, 0, 1, 0, 0, 0, 0)] * 6)
    w = new_writer()
    written = fused(w, ring, name_of)
    if detached:
        written += fused(w, ring, name_of)
    entries, total, lost, read = ring.stats()
    assert entries == 0 and total == read + lost
    events = read_back(finish(w))
    got = [e for e in events if not isinstance(e, Lost)]
    assert len(got) == written
    assert [e[1] for e in got] == sorted(e[1] for e in got)
    if detached:
        expected = [1, 2, 3, 4, 5, 6] + {"overwrite": [100, 101, 102, 103, 104, 105],
                                         "clear": [200], "resize": [], "consume": []}[action]
        assert lost == 0
    else:
        expected = {"overwrite": [5, 6, 100, 101, 102, 103, 104, 105], "clear": [200],
                    "resize": [4, 5, 6], "consume": []}[action]
    assert [e[1] for e in got] == expected
    if action in ("overwrite", "resize"):
        assert sum(e.count for e in events if isinstance(e, Lost)) == lost


def test_reentrant_calls():
    """name_of may drain another ring (Python code): the inner call has its own scratch."""
    inner, inner_twin = cring.Ring(16, 7), cring.Ring(16, 7)
    write_records((inner, inner_twin), [(3, 1, None, 1, 2, 1, 0, 0, 0)] * 10)
    w_inner = new_writer()

    def name_of(code):
        if inner.head != inner.floor:
            fused(w_inner, inner, names, 7)
        return names(code)

    a, b = cring.Ring(16, TID), cring.Ring(16, TID)
    write_records((a, b), [(2, 2, None, 0, 2, 0, 0, 0, 0)] * 10)
    wa, wb, wt = new_writer(), new_writer(), new_writer()
    fused(wa, a, name_of)
    tuple_path(wb, b)
    tuple_path(wt, inner_twin, names, 7)
    assert finish(wa) == finish(wb)
    assert finish(w_inner) == finish(wt)


# -- the names table kept between calls (NameCache) ---------------------------------------------


def test_the_writer_names_each_code_once():
    """write_native keeps its names between calls (a NameCache): name_of runs once per
    distinct code over all the rounds -- not once per code per round, as with a table of
    the call's own -- and the file is the tuple path's, byte for byte."""
    calls = []

    class Registry:
        def name(self, code):
            calls.append(code)
            return names(code)

    reg = Registry()
    a, b = cring.Ring(64, TID), cring.Ring(64, TID)
    wa, wb = new_writer(7), new_writer(7)
    rounds = [[(1 + k % 5, (k + r) % 3, k % 4 if k % 2 else None, k, 3, k, 0, 0, 0)
               for k in range(30)] for r in range(6)]
    ts = 0
    for records in rounds:
        ts = write_records((a, b), records, ts)
        # reg.name is a new bound method each time: the same name_of all the same
        assert fused(wa, a, reg.name) == tuple_path(wb, b) == 30
    assert len(calls) == 4 and set(calls) == set(CODES)
    assert len(wa._names) == 4
    assert wa._strings == wb._strings
    assert finish(wa) == finish(wb)
    # the 6-argument form: a table for the call alone, name_of once per code per call
    calls.clear()
    ring = cring.Ring(64, TID)
    for records in rounds:
        write_records((ring,), records)
        _tfenc.encode_ring(ring, TID, reg.name, {}, [], 7)
    assert len(calls) == 6 * 4


def test_a_name_cache_follows_the_string_table():
    """Called with another string table, a NameCache forgets its indices and looks its names
    up in that one: the payloads are a table of the call's own's."""
    cache = _tfenc.NameCache()
    a, b = cring.Ring(32, TID), cring.Ring(32, TID)

    def both(ta, tb, name_of=names, first=0):
        records = [(2 + k % 2, (first + k) % 4, None, 1, 2, k, 0, 0, 0) for k in range(12)]
        write_records((a, b), records)
        na: list[str] = []
        nb: list[str] = []
        got = _tfenc.encode_ring(a, TID, name_of, ta, na, 5, cache)
        assert got == _tfenc.encode_ring(b, TID, name_of, tb, nb, 5)
        assert na == nb and ta == tb
        return got, na

    table_a, twin_a = {}, {}
    _, added = both(table_a, twin_a)
    assert added == ["mod.f_alpha", "mod.f_gamma", "", "mod.f_beta", "mod.f_delta"]
    assert len(cache) == 4
    table_b = {"x": 0, "mod.f_gamma": 1, "": 2}
    twin_b = dict(table_b)
    _, added = both(table_b, twin_b, first=1)  # B's indices, not A's
    assert added == ["mod.f_beta", "mod.f_delta", "mod.f_alpha"]
    assert table_b == {"x": 0, "mod.f_gamma": 1, "": 2, "mod.f_beta": 3, "mod.f_delta": 4,
                       "mod.f_alpha": 5}
    _, added = both(table_a, twin_a, first=2)  # back to A
    assert added == []
    table_a["y"] = 5  # a table may grow between the calls (the writer's tuple path)
    twin_a["y"] = 5
    both(table_a, twin_a, first=3)
    # a table holding something else than the ints it stores: the tuple path, as without
    odd = {"mod.f_beta": "one"}
    (_, _, batches, events), added = both(odd, dict(odd), first=1)
    assert batches is None and len(events) == 12 and added == [] and odd == {"mod.f_beta": "one"}
    assert len(cache) == 4


def test_a_name_cache_drops_the_names_of_another_name_of():
    """Names are name_of's: with another one, the codes are named again."""
    cache = _tfenc.NameCache()
    ring = cring.Ring(32, TID)
    calls = []

    def counting(name_of):
        def counted(code):
            calls.append(name_of)
            return name_of(code)
        return counted

    by_names, by_clashing = counting(names), counting(clashing)
    for name_of, named in ((by_names, 4), (by_clashing, 4), (by_clashing, 0), (by_names, 4)):
        calls.clear()
        write_records((ring,), [(2, k % 4, None, 0, 1, k, 0, 0, 0) for k in range(8)])
        table: dict = {}
        _tfenc.encode_ring(ring, TID, name_of, table, [], 8, cache)
        assert len(calls) == named and len(cache) == 4
        assert list(table) == [*dict.fromkeys(map(name_of, CODES)), ""]


def test_a_failed_write_forgets_the_strings_in_the_name_cache():
    """write_native deletes the strings no chunk defined when writing fails (as _write_batch
    does): the NameCache forgets their indices, and later rounds, whose names get other
    indices, are written as the tuple path writes them."""
    a, b = cring.Ring(64, TID), cring.Ring(64, TID)
    wa, wb = new_writer(4), new_writer(4)
    write_records((a, b), [(2, 0, None, 0, 1, 0, 0, 0, 0)] * 3)
    assert fused(wa, a) == tuple_path(wb, b) == 3

    def failing(*args):
        raise OSError("no space left")

    write_records((a, b), [(2 + k % 2, 1 + k % 2, None, 0, 1, k, 0, 0, 0) for k in range(6)])
    wa._write_strings = failing
    with pytest.raises(OSError, match="no space"):
        fused(wa, a)
    del wa._write_strings
    b.consume()  # the twin skips the round
    assert wa._strings == wb._strings == {"mod.f_alpha": 0, "": 1}
    assert len(wa._names) == 3  # the names stay; the indices of beta and gamma are gone
    # delta first: beta and gamma get other indices than the failed round gave them
    write_records((a, b), [(2 + k % 2, 3 - k % 4, None, 0, 1, k, 0, 0, 0) for k in range(12)])
    assert fused(wa, a) == tuple_path(wb, b) == 12
    assert wa._strings == wb._strings
    assert wa._strings["mod.f_delta"] == 2
    got = read_back(finish(wa))
    assert got == read_back(finish(wb))
    assert [e[4] for e in got][-4:] == ["mod.f_delta", "mod.f_gamma", "mod.f_beta",
                                        "mod.f_alpha"]


def test_a_failed_batch_forgets_the_strings_in_the_name_cache():
    """_write_batch (the tuple path of a round write_native declines) deletes its new strings
    when encoding fails, and tells the NameCache (which can hold no index of them: they
    were new to the table); later rounds are written right."""
    a, b = cring.Ring(64, TID), cring.Ring(64, TID)
    wa, wb = new_writer(4), new_writer(4)
    write_records((a, b), [(2, 0, None, 0, 1, 0, 0, 0, 0)] * 3)
    fused(wa, a)
    tuple_path(wb, b)
    for w in (wa, wb):
        with pytest.raises(TypeError):  # a str column holding an int: nothing written
            w.write_events([(FUNCGRAPH_ENTRY.id, 1, TID, 0, "py.new", ""),
                            (FUNCGRAPH_ENTRY.id, 2, TID, 0, 7, "")])
    assert wa._strings == wb._strings == {"mod.f_alpha": 0, "": 1}
    write_records((a, b), [(2 + k % 2, k % 4, None, 0, 1, k, 0, 0, 0) for k in range(12)])
    assert fused(wa, a) == tuple_path(wb, b) == 12
    assert finish(wa) == finish(wb)


def test_a_name_cache_after_running_out_of_memory():
    """Allocations failing one after another inside encode_ring: whatever the call leaves
    (an error, the strings it added deleted), the NameCache then encodes what a table of
    the call's own encodes, and no reference is leaked."""
    testcapi = pytest.importorskip("_testcapi")
    if not hasattr(testcapi, "set_nomemory"):
        pytest.skip("_testcapi.set_nomemory is missing")

    def refs():
        return [sys.getrefcount(c) for c in CODES]

    before = refs()
    failed = 0
    for start in range(120):
        cache = _tfenc.NameCache()
        ring = cring.Ring(32, TID)
        table: dict = {}
        write_records((ring,), [(2, 0, None, 0, 1, 0, 0, 0, 0)] * 3)
        _tfenc.encode_ring(ring, TID, names, table, [], 4, cache)
        write_records((ring,), [(2 + k % 2, 1 + k % 3, None, 0, 1, k, 0, 0, 0)
                                for k in range(9)])
        added: list[str] = []
        testcapi.set_nomemory(start)
        try:
            try:
                _tfenc.encode_ring(ring, TID, names, table, added, 4, cache)
            finally:
                testcapi.remove_mem_hooks()
        except MemoryError:
            failed += 1
            assert table == {"mod.f_alpha": 0, "": 1} and added == []
        c, d = cring.Ring(32, TID), cring.Ring(32, TID)
        write_records((c, d), [(2 + k % 2, 3 - k % 4, None, 0, 1, k, 0, 0, 0)
                               for k in range(12)])
        twin = dict(table)
        nc: list[str] = []
        nd: list[str] = []
        assert _tfenc.encode_ring(c, TID, names, table, nc, 4, cache) == _tfenc.encode_ring(
            d, TID, names, twin, nd, 4)
        assert nc == nd and table == twin
        del cache, ring, c, d
        assert refs() == before
    assert failed > 5


@settings(max_examples=200, deadline=None)
@given(rounds=st.lists(st.tuples(st.lists(RECORD, max_size=40),
                                 st.sampled_from(["same", "same", "other", "forget"]),
                                 st.sampled_from([names, names, clashing])),
                       min_size=1, max_size=6),
       capacity=st.integers(1, 40), batch=st.integers(1, 30),
       unknown_every=st.sampled_from([0, 0, 0, 7]))
def test_a_name_cache_encodes_what_a_table_of_the_call_encodes(rounds, capacity, batch,
                                                               unknown_every):
    """Rounds through one NameCache, switching string tables, deleting a table's newest
    strings (forget_strings, as the writer does), changing name_of: every call returns and
    adds what the 6-argument form (a table of the call's own) returns and adds."""
    cache = _tfenc.NameCache()
    a, b = cring.Ring(capacity, TID), cring.Ring(capacity, TID)
    tables = [({}, {}), ({"x": 0, "mod.f_beta": 1}, {"x": 0, "mod.f_beta": 1})]
    current = 0
    ts = 0
    for k, (records, op, name_of) in enumerate(rounds):
        if op == "other":
            current = 1 - current
        ta, tb = tables[current]
        if op == "forget" and ta:
            keep = len(ta) - 1 - k % 2
            for table in (ta, tb):
                for s in list(table)[max(keep, 0):]:
                    del table[s]
            cache.forget_strings(len(ta))
        ts = write_records((a, b), records, ts, unknown_every)
        na: list[str] = []
        nb: list[str] = []
        got = _tfenc.encode_ring(a, TID, name_of, ta, na, batch, cache)
        assert got == _tfenc.encode_ring(b, TID, name_of, tb, nb, batch)
        assert na == nb and ta == tb
        assert ring_state(a) == ring_state(b)


def test_reentrant_calls_into_the_same_writer():
    """name_of drains another thread's ring into the same writer (Python code may): the
    inner call finds the writer's NameCache in use and has a table of its own; the file is
    the tuple path's."""
    inner = {"fused": cring.Ring(16, 7), "tuple": cring.Ring(16, 7)}
    write_records(tuple(inner.values()), [(3, 1, None, 1, 2, 1, 0, 0, 0)] * 10)
    writers = {"fused": new_writer(), "tuple": new_writer()}

    def make_name_of(path):
        def name_of(code):
            ring = inner[path]
            if ring.head != ring.floor:
                (fused if path == "fused" else tuple_path)(writers[path], ring, names, 7)
            return names(code)
        return name_of

    a, b = cring.Ring(16, TID), cring.Ring(16, TID)
    write_records((a, b), [(2, k % 3, None, 0, 2, 0, 0, 0, 0) for k in range(10)])
    name_of = make_name_of("fused")
    fused(writers["fused"], a, name_of)
    tuple_path(writers["tuple"], b, make_name_of("tuple"))
    assert len(writers["fused"]._names) == 3  # the outer call's names
    write_records((a, b), [(2, k % 4, None, 0, 2, 0, 0, 0, 0) for k in range(10)])
    fused(writers["fused"], a, name_of)
    tuple_path(writers["tuple"], b)
    assert finish(writers["fused"]) == finish(writers["tuple"])


def test_name_cache_api():
    cache = _tfenc.NameCache()
    assert len(cache) == 0 and "codes" in _tfenc.NameCache.__doc__
    with pytest.raises(TypeError):
        _tfenc.NameCache(1)
    with pytest.raises(ValueError):
        cache.forget_strings(-1)
    with pytest.raises(TypeError):
        cache.forget_strings("0")
    ring = cring.Ring(16, TID)
    with pytest.raises(TypeError, match="NameCache"):
        _tfenc.encode_ring(ring, TID, names, {}, [], 4, {})
    with pytest.raises(TypeError):
        _tfenc.encode_ring(ring, TID, names, {}, [], 4, cache, None)
    write_records((ring,), [(2, k % 2, None, 0, 1, 0, 0, 0, 0) for k in range(4)])
    assert _tfenc.encode_ring(ring, TID, names, {}, [], 4, None)[0:2] == (0, 0)  # None: own
    assert len(cache) == 0

    # clear() while a call uses it (from name_of): done when that call ends
    def clearing(code):
        cache.clear()
        assert len(cache) == 0 or code is CODES[1]
        return names(code)

    write_records((ring,), [(2, k % 2, None, 0, 1, 0, 0, 0, 0) for k in range(4)])
    table: dict = {}
    _, _, batches, _ = _tfenc.encode_ring(ring, TID, clearing, table, [], 4, cache)
    assert len(batches) == 1 and len(table) == 3
    assert len(cache) == 0
    write_records((ring,), [(2, k % 2, None, 0, 1, 0, 0, 0, 0) for k in range(4)])
    _tfenc.encode_ring(ring, TID, names, table, [], 4, cache)
    assert len(cache) == 2
    cache.clear()
    assert len(cache) == 0
    cache.clear()


def test_prepared_writer_writes_the_same():
    a, b = cring.Ring(128, TID), cring.Ring(128, TID)
    write_records((a, b), [(2 + k % 2, k % 4, None, k % 9, 7, k, 0, 0, 0) for k in range(100)])
    wa, wb = new_writer(16), new_writer(16)
    wa.prepare_native(128)
    assert len(wa._out) >= 128 * tracefile._OUT_BYTES_PER_RECORD  # not an unbuffered file
    fused(wa, a)
    tuple_path(wb, b)
    assert finish(wa) == finish(wb)


def _unbuffered_pair(tmp_path):
    """Two rings holding the same 80 records, and two writers to unbuffered files: for the
    fused path and the tuple path, whose files must be the same bytes."""
    a, b = cring.Ring(64, TID), cring.Ring(64, TID)
    write_records((a, b), [(2 + k % 2, k % 3, None, k % 6, 5, k, 0, 0, 0) for k in range(80)])
    paths = (tmp_path / "fused.dat", tmp_path / "tuple.dat")
    writers = [TraceWriter(open(p, "wb", buffering=0), formats=builtin_registry(),
                           batch_events=20) for p in paths]
    return (a, writers[0]), (b, writers[1]), paths


@pytest.mark.parametrize("short_writes", [False, True])
def test_unbuffered_files_get_one_writev(tmp_path, monkeypatch, short_writes):
    """To an unbuffered file that is not a regular one (a pipe) the chunks of a call go in
    one os.writev, uncopied; a short write is carried on where it stopped."""
    calls = []
    real = os.writev

    def writev(fd, parts):
        calls.append(len(parts))
        if not short_writes:
            return real(fd, parts)
        return os.write(fd, b"".join(parts)[:7])  # at most 7 bytes a call

    (a, wa), (b, wb), paths = _unbuffered_pair(tmp_path)
    assert wa._writev and wa._held  # (a regular file: see the next test)
    wa._held = False
    monkeypatch.setattr(tracefile.os, "writev", writev)
    fused(wa, a)
    monkeypatch.undo()
    tuple_path(wb, b)
    for w in (wa, wb):
        w.close()
        w._file.close()
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert len(calls) == 1 if not short_writes else len(calls) > 10


def test_regular_files_are_written_with_the_gil_held(tmp_path):
    """To a regular file the chunks of a call are written by _tfenc.write_held, which keeps
    the GIL (a drain round that let it go waited for it again): the same bytes."""
    (a, wa), (b, wb), paths = _unbuffered_pair(tmp_path)
    assert wa._held
    fused(wa, a)
    tuple_path(wb, b)
    for w in (wa, wb):
        w.close()
        w._file.close()
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_write_held_writes_every_part_in_order(tmp_path):
    """write_held: many parts, empty ones, more than one writev takes, into a pipe read by
    another process (the GIL is held: a thread of ours could not read it)."""
    import subprocess

    parts = [bytes([k % 251]) * (k * 37 % 5000) for k in range(300)]
    out = tmp_path / "out"
    with open(out, "wb") as sink:
        reader = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=sink)
        assert reader.stdin is not None
        assert tracefile._tfenc.write_held(reader.stdin.fileno(), list(parts)) == \
            sum(map(len, parts))
        reader.stdin.close()
        assert reader.wait() == 0
    assert out.read_bytes() == b"".join(parts)
    r, w = os.pipe()
    os.close(w)
    os.close(r)
    with pytest.raises(OSError):  # a closed descriptor
        tracefile._tfenc.write_held(w, [b"x"])
    with pytest.raises(TypeError):
        tracefile._tfenc.write_held(1, (b"x",))


def test_read_held_reads_as_os_read():
    """read_held (the drain's read of the signal wakeup pipe, the GIL kept): what os.read
    gives from a non-blocking pipe, BlockingIOError when it is empty, OSError when closed."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        with pytest.raises(BlockingIOError):
            tracefile.read_held(r, 256)
        os.write(w, bytes(range(10)) * 40)
        assert tracefile.read_held(r, 256) == (bytes(range(10)) * 40)[:256]
        assert tracefile.read_held(r, 0) == b""
        assert tracefile.read_held(r, 1000) == (bytes(range(10)) * 40)[256:]
        if tracefile._tfenc is not None:
            with pytest.raises(ValueError, match="read_held"):
                tracefile._tfenc.read_held(r, -1)
    finally:
        os.close(r)
        os.close(w)
    with pytest.raises(OSError):
        tracefile.read_held(r, 1)


@given(data=st.binary(max_size=3000), value=st.integers(0, (1 << 32) - 1))
def test_crc32_is_zlibs(data, value):
    assert _tfenc.crc32(data) == zlib.crc32(data)
    assert _tfenc.crc32(data, value) == zlib.crc32(data, value)
    assert _tfenc.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


@pytest.mark.parametrize("clmul", [True, False])
@given(data=st.binary(min_size=60, max_size=600), value=st.integers(0, (1 << 32) - 1),
       start=st.integers(0, 15))
def test_crc32_folding_and_tables_are_zlibs(clmul, data, value, start):
    """Both ways of computing the CRC (PCLMULQDQ folding where the CPU has it, the tables),
    at every length around the folding's 64-byte blocks and 16-byte steps and any alignment."""
    saved = _tfenc._crc_clmul(clmul)
    try:
        assert _tfenc.crc32(memoryview(data)[start:], value) == zlib.crc32(data[start:], value)
    finally:
        _tfenc._crc_clmul(saved)


def test_bad_arguments():
    ring = cring.Ring(4, TID)
    with pytest.raises(TypeError):
        _tfenc.encode_ring(ring, TID, names, {}, [])
    with pytest.raises(TypeError):
        _tfenc.encode_ring(object(), TID, names, {}, [], 4)
    with pytest.raises(TypeError):
        _tfenc.encode_ring(ring, TID, names, [], [], 4)
    with pytest.raises(ValueError):
        _tfenc.encode_ring(ring, TID, names, {}, [], 0)
    with pytest.raises(ValueError):
        _tfenc.reserve(-1, 4)
    assert _tfenc.encode_ring(ring, TID, names, {}, [], 4) == (0, 0, [], None)


# -- rounds through the pipe -------------------------------------------------------------------


class Twins:
    """Two TraceBuffers getting the same writes: one drained with read_or_feed into a writer
    (the fused path where a round allows it), the other with read + write_events."""

    def __init__(self, size_kb: int, overwrite: bool) -> None:
        self.bufs = (TraceBuffer(size_kb, overwrite), TraceBuffer(size_kb, overwrite))
        self.writers = (new_writer(7), new_writer(7))
        self.pipes = tuple(tb.pipe() for tb in self.bufs)
        self.fed = 0
        self.main = tuple(tb.native_local(names) for tb in self.bufs)
        self.other = self._rings_of_another_thread()
        self.ts = 0

    def _rings_of_another_thread(self):
        out = []
        t = threading.Thread(target=lambda: out.extend(tb.native_local(names)
                                                        for tb in self.bufs))
        t.start()
        t.join()
        return tuple(out)

    def native(self, records, other: bool = False) -> None:
        self.ts = write_records(self.other if other else self.main, records, self.ts)

    def python(self, count: int) -> None:
        for _ in range(count):
            self.ts += 3
            for tb in self.bufs:
                buf = tb.local()
                buf.append((2, self.ts, buf.tid, 0, "py.func", ""))

    def round(self) -> None:
        def feed(ring, tid, name_of):
            self.fed += 1
            self.writers[0].write_native(ring, tid, name_of)

        items = self.pipes[0].read_or_feed(0, feed)
        if items:
            self.writers[0].write_events(items)
        self.writers[1].write_events(self.pipes[1].read(0))

    def check(self) -> None:
        """Same statistics, and each thread's events and gaps in the same order (a fed
        thread's records are written as a block, not merged by time with the others')."""
        assert self.bufs[0].stats() == self.bufs[1].stats()
        assert per_thread(finish(self.writers[0])) == per_thread(finish(self.writers[1]))


OPS = st.lists(st.one_of(
    st.tuples(st.just("native"), st.lists(RECORD, max_size=40)),
    st.tuples(st.just("other"), st.lists(RECORD, max_size=20)),
    st.tuples(st.just("python"), st.integers(1, 5)),
    st.tuples(st.just("round")),
), max_size=14)


@settings(max_examples=120, deadline=None)
@given(ops=OPS, size_kb=st.integers(1, 3), overwrite=st.booleans())
def test_pipe_rounds_write_what_the_tuple_path_writes(ops, size_kb, overwrite):
    twins = Twins(size_kb, overwrite)
    for op in ops:
        if op[0] in ("native", "other"):
            twins.native(op[1], other=op[0] == "other")
        elif op[0] == "python":
            twins.python(op[1])
        else:
            twins.round()
    twins.round()
    twins.check()


def test_which_rounds_are_fused():
    twins = Twins(4, True)
    record = (2, 0, None, 1, 3, 0, 0, 0, 0)
    twins.native([record] * 5)
    twins.round()  # one thread's native records only
    assert twins.fed == 1
    twins.native([record] * 5)
    twins.python(2)
    twins.round()  # Python events too: the tuple path, merged by time
    assert twins.fed == 1
    twins.native([record] * 3)
    twins.native([record] * 3, other=True)
    twins.round()  # two threads, native records only: each fed
    assert twins.fed == 3
    twins.native([record] * 3, other=True)
    twins.round()  # the other thread alone
    assert twins.fed == 4
    twins.native([record] * 2)
    twins.native([record] * 2, other=True)
    twins.python(1)
    twins.round()  # this thread has Python events (tuple path), the other is fed
    assert twins.fed == 5
    twins.round()  # nothing
    assert twins.fed == 5
    twins.check()


# -- rethook record ----------------------------------------------------------------------------

PROGRAMS = Path(__file__).parent / "cli_programs"

# Counts the fused rounds of a recording (write_native calls), then runs the CLI. Nothing of
# it is in __main__ (the recording's default filter) and it reports after main() returns.
_RECORD = """
import sys
ns = {"__name__": "_fused_count"}
exec('''
from rethook.buffer import tracefile
calls = []
real = tracefile.TraceWriter.write_native
def counting(self, *args):
    calls.append(1)
    return real(self, *args)
tracefile.TraceWriter.write_native = counting
''', ns)
from rethook.cli.main import main
sys.argv = ["rethook", *sys.argv[1:]]
try:
    main()
finally:
    sys.stderr.write(f"fused rounds: {len(ns['calls'])}\\n")
"""

SUMMARY = re.compile(r"^rethook: ([\d,]+) events \(([\d,]+) lost\)", re.M)


def _cli_skip() -> None:
    from rethook.tracers import native as native_users

    if native_users._native is None:
        pytest.skip("the native users are not built")
    if os.environ.get("RETHOOK_ENGINE") == "python":
        pytest.skip("native users run on the C core only")


def _env(fused_drain: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONWARNINGS")}
    env["RETHOOK_FUSED_DRAIN"] = "1" if fused_drain else "0"
    return env


def record(tmp_path: Path, program: str, *flags: str, fused_drain: bool, name: str = "t.dat",
           cwd: Path = PROGRAMS):
    out = tmp_path / name
    r = subprocess.run([sys.executable, "-c", _RECORD, "record", "-o", str(out), *flags,
                        program], cwd=cwd, env=_env(fused_drain), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    events, lost = (int(n.replace(",", "")) for n in SUMMARY.search(r.stderr).groups())
    rounds = int(re.search(r"fused rounds: (\d+)", r.stderr).group(1))
    with TraceReader(out) as reader:
        items = list(reader.events(lost=True))
        stats = reader.stats
        threads = reader.threads
    return items, events, lost, rounds, stats, threads


def shape(item) -> tuple:
    """An event without what differs between two runs: timestamps, thread ids, durations."""
    if isinstance(item, Lost):
        return ("lost", item.count)
    fid = item[0]
    if fid == 3:  # funcgraph_exit: depth, func, overrun, flags, retval
        return (fid, item[3], item[4], item[6], item[8], item[9])
    return (fid, *item[3:])


FIB = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n\nprint(fib({n}))\n"


def test_record_fused_and_tuple_paths_read_back_alike(tmp_path):
    _cli_skip()
    prog = tmp_path / "fibprog.py"
    prog.write_text(FIB.format(n=18))  # 8361 calls: the default buffer holds them all
    runs = {}
    for fused_drain in (True, False):
        runs[fused_drain] = record(tmp_path, str(prog), fused_drain=fused_drain,
                                   name=f"{fused_drain}.dat")
    (fa, ea, la, ra, sa, _), (fb, eb, lb, rb, sb, _) = runs[True], runs[False]
    assert ra >= 1 and rb == 0  # the switch picks the path
    assert la == lb == 0 and ea == eb == 2 * 8361
    assert [shape(i) for i in fa] == [shape(i) for i in fb]
    assert [e[1] for e in fa] == sorted(e[1] for e in fa)
    (tid_a, counts_a), = sa.items()
    (tid_b, counts_b), = sb.items()
    assert counts_a == counts_b == {"entries": 0, "written": 2 * 8361, "lost": 0,
                                    "read": 2 * 8361}


@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "nooverwrite"])
def test_record_overflow_is_counted_and_marked(tmp_path, overwrite):
    """A tiny ring overflows: where depends on timing, so each path is held to the
    accounting -- every event is in the file or counted lost, the file's Lost markers add up
    to the count -- rather than to the other."""
    _cli_skip()
    prog = tmp_path / "many.py"
    prog.write_text("def work(i):\n    return i\n\n\nfor i in range(30000):\n    work(i)\n")
    flags = ("-b", "8", "--blocking-timeout", "0")  # (blocking would keep every event)
    if not overwrite:
        flags += ("-O", "nooverwrite")
    for fused_drain in (True, False):
        items, events, lost, rounds, stats, _ = record(tmp_path, str(prog), *flags,
                                                       fused_drain=fused_drain)
        assert events + lost == 60000
        assert lost > 0  # 8 KB: ~146 records, while the drain sleeps between rounds
        assert sum(i.count for i in items if isinstance(i, Lost)) == lost
        assert sum(1 for i in items if not isinstance(i, Lost)) == events
        (counts,) = stats.values()
        assert counts["written"] == 60000 and counts["lost"] == lost
        assert counts["read"] == events
        assert (rounds >= 1) == fused_drain


def test_record_fib25_accounting(tmp_path):
    """The example of the fused drain's design: fib(25) under the default buffer. Whether
    anything is lost depends on the machine's load, so what is held is the accounting."""
    _cli_skip()
    prog = tmp_path / "fibprog.py"
    prog.write_text(FIB.format(n=25))
    items, events, lost, rounds, stats, _ = record(tmp_path, str(prog), fused_drain=True)
    assert rounds >= 1
    assert events + lost == 2 * 242785
    assert sum(i.count for i in items if isinstance(i, Lost)) == lost
    (counts,) = stats.values()
    assert counts == {"entries": 0, "written": 2 * 242785, "lost": lost, "read": events}


@pytest.mark.parametrize("flags", [
    (),
    ("-e", "p:cli/inc helper.inc x", "-l", "helper.*", "-l", "__main__.*"),
    ("-O", "funcgraph-retval"),
    ("-p", "function"),
], ids=["graph", "probe", "retval-python-user", "function"])
def test_record_mixed_programs_alike(tmp_path, flags):
    """Python-side events (a probe, the Python user of funcgraph-retval) and function
    records: rounds with Python events go the tuple path, the file is the same either way."""
    _cli_skip()
    got = {}
    for fused_drain in (True, False):
        items, events, lost, rounds, _, _ = record(tmp_path, "golden.py", *flags,
                                                   fused_drain=fused_drain,
                                                   name=f"{fused_drain}.dat")
        assert lost == 0 and events == len(items)
        got[fused_drain] = [shape(i) for i in items]
    assert got[True] == got[False]
    assert len(got[True]) > 10


def test_record_threads_alike(tmp_path):
    _cli_skip()
    got = {}
    for fused_drain in (True, False):
        items, events, lost, _, stats, threads = record(
            tmp_path, "threads_prog.py", "-l", "square", "-l", "worker",
            fused_drain=fused_drain, name=f"{fused_drain}.dat")
        assert lost == 0 and events == len(items) == 2 * 13
        for tid in {e[2] for e in items}:  # each thread's events in order
            ts = [e[1] for e in items if e[2] == tid]
            assert ts == sorted(ts)
        got[fused_drain] = sorted(map(shape, items))  # which pool thread ran what varies
        assert len(threads) >= 3 and sum(s["read"] for s in stats.values()) == events
    assert got[True] == got[False]


def test_record_definitions_alike(tmp_path):
    """The file format is unchanged: the same formats, string table and META keys as the
    tuple path writes."""
    _cli_skip()
    prog = tmp_path / "fibprog.py"
    prog.write_text(FIB.format(n=12))
    got = []
    for fused_drain in (True, False):
        record(tmp_path, str(prog), fused_drain=fused_drain, name=f"{fused_drain}.dat")
        with TraceReader(tmp_path / f"{fused_drain}.dat") as reader:
            assert reader.damage is None
            got.append((reader.version, sorted(reader.all_meta), list(reader.formats),
                        reader._done.strings, [tag for _, tag, _ in reader._chunks()][:4]))
    assert got[0] == got[1]
    assert got[0][3] == ["__main__.fib", ""]


def test_a_writer_closed_as_the_process_ends_writes_the_same_file_and_leaves_memory_usable():
    """close(release_memory=False) (a recording's end with the process's: its memory goes with
    it) writes the same file as close(); the encoder's memory it keeps is what the next
    writer encodes with."""
    records = [(2, 0, None, 1, 10, 0, 0, 0, 0), (3, 0, None, 1, 10, 5, 0, 0, 0)] * 300
    files = []
    for release in (True, False, True, False):
        ring = cring.Ring(1024, TID)
        write_records([ring], records)
        writer = new_writer(batch=64)
        writer.prepare_native(1024)
        assert fused(writer, ring) == len(records)
        writer.close(release_memory=release)
        files.append(writer._file.getvalue())
    assert len(read_back(files[0])) == len(records)
    assert files[1:] == files[:1] * 3
