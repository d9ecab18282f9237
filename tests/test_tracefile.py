"""Tests of the binary trace file (rethook.buffer.tracefile)."""

from __future__ import annotations

import io
import math
import struct
import warnings
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rethook.buffer.events import EventFormat, Field, FormatRegistry, Lost
from rethook.buffer.ring import TraceBuffer
from rethook.buffer.tracefile import (
    CHUNK_OVERHEAD,
    HEADER_SIZE,
    TraceFileError,
    TraceFileWarning,
    TraceWriter,
    write_trace,
)
from rethook.buffer.traceread import TraceReader

ALL_TYPES = FormatRegistry()
EVERY = ALL_TYPES.register(
    "every", ["u:u64", "s:s64", "f:f64", "text:str", "flag:bool"]
)  # one field of each type
ENTRY = ALL_TYPES.register("funcgraph_entry", ["depth:u64", "func:str"])
EXIT = ALL_TYPES.register(
    "funcgraph_exit",
    ["depth:u64", "func:str", "calltime:u64", "overrun:u64", "flags:u64", "retval:str"],
)

HUGE = [2**64, 2**64 - 1, -(2**63) - 1, 2**63, 10**40, -(10**40), 2**1000]
TEXTS = ["", "plain", "héllo wörld", "✓ 🐍 日本語", "nul\x00in", "lone \ud800", "x" * 5000]
FLOATS = [0.0, -0.0, 1.5, -2.25e-300, 1e308, math.inf, -math.inf, math.nan]


def same(a, b) -> bool:
    """Equality that tells -0.0 from 0.0 and lets NaN equal NaN (bit for bit)."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def same_events(a, b) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))


def write(path, events, formats=ALL_TYPES, meta=None, **kw) -> Path:
    with TraceWriter(path, meta or {"tracer": "test"}, formats=formats, **kw) as w:
        w.write_events(events)
    return Path(path)


def read_all(path, **kw):
    with TraceReader(path, **kw) as r:
        return list(r.events())


def every_type_events() -> list[tuple]:
    events = []
    for i in range(60):
        events.append(
            (
                EVERY.id,
                1000 + i,
                7,
                [0, 1, 255, 2**16, 2**32, 2**64 - 1, *HUGE][i % 13],
                [-1, 0, 2**63 - 1, -(2**63), *HUGE][i % 11],
                FLOATS[i % len(FLOATS)],
                TEXTS[i % len(TEXTS)],
                bool(i % 3),
            )
        )
    return events


# -- round trips ----------------------------------------------------------------------------


def test_every_field_type_round_trips(tmp_path):
    events = every_type_events()
    back = read_all(write(tmp_path / "t", events))
    assert same_events(back, events)


@pytest.mark.parametrize("batch", [1, 2, 7, 1000])
def test_round_trip_any_batch_size(tmp_path, batch):
    events = every_type_events()
    assert same_events(read_all(write(tmp_path / "t", events, batch_events=batch)), events)


@pytest.mark.parametrize(
    "column",
    [
        [5] * 10,  # constant
        [2**70] * 10,  # constant beyond 64 bits
        [0, 2**64 - 1] * 5,  # full unsigned range
        [-(2**63), 2**63 - 1] * 5,  # full signed range
        [1, 2, 2**64] * 3,  # one value beyond: big-integer escape
        [-(2**64)] + [1] * 9,
        [10**18 + i * 1000 for i in range(10)],  # wide, monotonic: delta
        [10**18 - i * 7 for i in range(10)],  # wide, decreasing: delta
        [10**18, -(10**18), 10**18, 0],  # wide, wild: plain
        [2**63 - 1, -(2**63)],  # the difference would not fit 64 bits
        [-(2**63) + 3, -(2**63) + 1, -(2**63)] * 4,  # near the edge: delta, checked
        [2**63 - 2, 2**63 - 1, 2**63, 2**63 + 1],  # a delta run would leave i64: plain u64
        [True, False, True],  # bools in an int field come back as ints
    ],
)
def test_int_column_encodings(tmp_path, column):
    fmt = EventFormat(0, "ints", (Field("v", "s64"),))
    events = [(0, i, 1, v) for i, v in enumerate(column)]
    back = read_all(write(tmp_path / "t", events, formats=[fmt]))
    assert back == [(0, i, 1, int(v)) for i, v in enumerate(column)]
    assert all(type(ev[3]) is int for ev in back)


def test_huge_timestamps_and_tids(tmp_path):
    fmt = EventFormat(3, "e", ())
    events = [
        (
            3,
            2**80 + i,
            -(2**70),
        )
        for i in range(5)
    ] + [(3, -5, 0)]
    assert read_all(write(tmp_path / "t", events, formats=[fmt])) == events


def test_mixed_formats_keep_their_order(tmp_path):
    events = []
    for i in range(300):
        if i % 3 == 0:
            events.append((ENTRY.id, i, 1 + i % 4, i % 9, f"f{i % 17}"))
        elif i % 3 == 1:
            events.append((EXIT.id, i, 1 + i % 4, i % 9, f"f{i % 17}", i - 1, 0, 0, "None"))
        else:
            events.append((EVERY.id, i, 2, i, -i, i / 3, "ß" * (i % 5), i % 2 == 0))
    assert same_events(read_all(write(tmp_path / "t", events, batch_events=64)), events)


def test_empty_trace(tmp_path):
    path = write(tmp_path / "t", [], meta={"k": [1, 2]})
    with TraceReader(path) as r:
        assert list(r.events()) == []
        assert r.meta == {"k": [1, 2]}
        assert r.stats == {} and r.threads == {}


def test_file_objects(tmp_path):
    events = every_type_events()
    buf = io.BytesIO()
    w = TraceWriter(buf, {"x": 1}, formats=ALL_TYPES)
    w.write_events(iter(events))  # an iterator, not a list
    w.close()
    assert not buf.closed  # ours to close
    buf.seek(0)
    assert same_events(list(TraceReader(buf).events()), events)


def test_formats_added_mid_stream(tmp_path):
    reg = FormatRegistry()
    first = reg.register("first", ["a:u64"])
    path = tmp_path / "t"
    with TraceWriter(path, {}, formats=reg) as w:
        w.write_events([(first.id, 1, 1, 10)])
        later = reg.register("later", ["name:str", "ok:bool"])  # while "tracing"
        w.write_events([(later.id, 2, 1, "x", True), (first.id, 3, 1, 11)])
        explicit = EventFormat(99, "explicit", (Field("v", "f64"),))
        w.add_format(explicit)
        w.write_events([(99, 4, 2, 0.5)])
    with TraceReader(path) as r:
        assert list(r.events()) == [
            (first.id, 1, 1, 10),
            (later.id, 2, 1, "x", True),
            (first.id, 3, 1, 11),
            (99, 4, 2, 0.5),
        ]
        assert [f.name for f in r.formats] == ["first", "later", "explicit"]
        assert r.formats[later.id] == later


def test_meta_threads_stats_and_lost(tmp_path):
    path = tmp_path / "t"
    with TraceWriter(path, {"tracer": "function_graph", "argv": ["a", "ü"]}) as w:
        w.add_format(ENTRY)
        w.set_thread_name(11, "main")
        w.write_events([(ENTRY.id, 1, 11, 0, "f")])
        w.set_thread_name(11, "renamed")  # the last name wins
        w.set_thread_name(-3, "")
        w.set_meta("end", 123)
        w.write_events([Lost(11, 5), (ENTRY.id, 2, 11, 1, "g"), Lost(12, 1)])
        w.write_stats({11: {"written": 7, "lost": 5}})
    with TraceReader(path) as r:
        assert list(r.events()) == [(ENTRY.id, 1, 11, 0, "f"), (ENTRY.id, 2, 11, 1, "g")]
        assert list(r.events(lost=True)) == [
            (ENTRY.id, 1, 11, 0, "f"),
            Lost(11, 5),
            (ENTRY.id, 2, 11, 1, "g"),
            Lost(12, 1),
        ]
        assert r.meta == {"tracer": "function_graph", "argv": ["a", "ü"], "end": 123}
        assert r.threads == {11: "renamed", -3: ""}
        assert r.stats == {11: {"written": 7, "lost": 5}}
        assert r.version == (2, 0)


def test_properties_do_not_disturb_a_running_pass(tmp_path):
    events = [(ENTRY.id, i, 1, 0, str(i)) for i in range(100)]
    path = write(tmp_path / "t", events, batch_events=10)
    with TraceReader(path) as r:
        it = r.events()
        head = [next(it) for _ in range(15)]
        r.scan()
        assert r.formats[ENTRY.id] == ENTRY
        assert head + list(it) == events


def test_write_trace_from_ring_buffer(tmp_path):
    reg = FormatRegistry()
    fmt = reg.register("ev", ["n:u64"])
    tb = TraceBuffer(4, overwrite=True)
    buf = tb.local()
    for i in range(tb.capacity + 10):
        buf.append((fmt.id, i, buf.tid, i))
    path = tmp_path / "t"
    assert write_trace(path, tb, reg, {"tracer": "nop"}) == tb.capacity
    with TraceReader(path) as r:
        assert list(r.events()) == tb.snapshot()
        assert r.threads == tb.threads()
        assert r.stats[buf.tid]["lost"] == 10
        assert r.stats[buf.tid]["written"] == tb.capacity + 10


def test_pipe_output_with_lost_markers_to_file(tmp_path):
    reg = FormatRegistry()
    fmt = reg.register("ev", ["n:u64"])
    tb = TraceBuffer(4, overwrite=True)
    buf = tb.local()
    for i in range(tb.capacity * 3):
        buf.append((fmt.id, i, buf.tid, i))
    items = tb.pipe().read(0)
    assert isinstance(items[0], Lost)
    path = tmp_path / "t"
    with TraceWriter(path, {}, formats=reg) as w:
        assert w.write_events(items) == tb.capacity
    with TraceReader(path) as r:
        assert list(r.events(lost=True)) == items


# -- writer errors --------------------------------------------------------------------------


def test_writer_rejects_bad_events_and_stays_usable(tmp_path):
    path = tmp_path / "t"
    with TraceWriter(path, {}, formats=[ENTRY]) as w:
        with pytest.raises(ValueError, match="format id 42"):
            w.write_events([(42, 1, 1)])
        with pytest.raises(ValueError, match="items of format"):
            w.write_events([(ENTRY.id, 1, 1, 0)])
        with pytest.raises(ValueError, match="items of format"):
            w.write_events([(ENTRY.id, 1, 1, 0, "f", "extra")])
        with pytest.raises(TypeError, match="func"):
            w.write_events([(ENTRY.id, 1, 1, 0, "new string"), (ENTRY.id, 1, 1, 0, None)])
        with pytest.raises(TypeError, match="depth"):
            w.write_events([(ENTRY.id, 1, 1, 1.5, "f")])
        with pytest.raises(TypeError):
            w.write_events([object()])
        w.write_events([(ENTRY.id, 5, 1, 0, "new string")])  # its string was not half-written
    assert read_all(path) == [(ENTRY.id, 5, 1, 0, "new string")]
    with pytest.raises(ValueError, match="closed"):
        w.write_events([])


# -- damage ---------------------------------------------------------------------------------


def small_file(tmp_path) -> tuple[bytes, list[tuple]]:
    events = [
        (ENTRY.id, 10, 1, 0, "outer"),
        (ENTRY.id, 20, 1, 1, "ïnner"),
        (EXIT.id, 30, 1, 1, "ïnner", 20, 0, 0, "None"),
        (EXIT.id, 40, 1, 0, "outer", 10, 0, 0, "42"),
    ]
    path = tmp_path / "small"
    with TraceWriter(path, {"tracer": "function_graph"}, formats=ALL_TYPES, batch_events=2) as w:
        w.set_thread_name(1, "main")
        w.write_events(events)
        w.write_stats({1: {"written": 4, "lost": 0}})
    return path.read_bytes(), events


def chunk_spans(data: bytes) -> list[tuple[int, int, bytes, int]]:
    """(start, end, tag, events in it) of each chunk, parsed independently of the reader."""
    spans, pos = [], HEADER_SIZE
    while pos < len(data):
        tag, length = struct.unpack_from("<4sI", data, pos)
        count = struct.unpack_from("<I", data, pos + 8)[0] if tag == b"EVTS" else 0
        spans.append((pos, pos + length + CHUNK_OVERHEAD, tag, count))
        pos += length + CHUNK_OVERHEAD
    assert pos == len(data)
    return spans


def read_until_error(path, **kw):
    """Events read before the error, and the error (None if the file read cleanly)."""
    got = []
    try:
        with TraceReader(path, **kw) as r:
            for ev in r.events():
                got.append(ev)
    except TraceFileError as exc:
        return got, exc
    return got, None


def test_truncation_at_every_offset(tmp_path):
    data, events = small_file(tmp_path)
    spans = chunk_spans(data)
    assert spans[-1][2] == b"END "
    cut_path = tmp_path / "cut"
    for cut in range(len(data) + 1):
        cut_path.write_bytes(data[:cut])
        got, err = read_until_error(cut_path)
        if cut == len(data):
            assert err is None and got == events
            continue
        assert err is not None, cut
        if cut < HEADER_SIZE:
            expected_offset = 0
        else:  # the first chunk the cut leaves incomplete (or, on a boundary, missing)
            expected_offset = next(start for start, end, _, _ in spans if end > cut)
        assert err.offset == expected_offset, cut
        assert str(cut_path) in str(err) and f"byte offset {err.offset}" in str(err)
        complete = sum(n for s, e, _, n in spans if e <= cut)
        assert got == events[:complete], cut


def test_every_bit_flip_is_detected(tmp_path):
    data, events = small_file(tmp_path)
    path = tmp_path / "flipped"
    for byte in range(len(data)):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[byte] ^= 1 << bit
            path.write_bytes(bytes(damaged))
            got, err = read_until_error(path)
            assert err is not None, (byte, bit)
            assert err.offset <= byte, (byte, bit)
            assert got == events[: len(got)]  # whatever came out is what was written


def test_non_strict_reader_warns_and_stops(tmp_path):
    data, events = small_file(tmp_path)
    spans = chunk_spans(data)
    second_events_chunk = [s for s in spans if s[2] == b"EVTS"][1]
    damaged = bytearray(data)
    damaged[second_events_chunk[0] + 12] ^= 0xFF  # inside its payload
    path = tmp_path / "bad"
    path.write_bytes(bytes(damaged))
    with pytest.warns(TraceFileWarning, match=f"byte offset {second_events_chunk[0]}"):
        with TraceReader(path, strict=False) as r:
            got = list(r.events())
    assert got == events[:2]
    assert r.damage is not None and r.damage.offset == second_events_chunk[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceFileWarning)
        with TraceReader(path, strict=False) as r:
            assert r.threads == {1: "main"}  # what came before the damage
            assert r.stats == {}  # the STAT chunk lies beyond it
    with TraceReader(path) as r, pytest.raises(TraceFileError):
        r.stats  # noqa: B018 - strict: a property that cannot be complete raises


def test_not_a_trace_file(tmp_path):
    path = tmp_path / "junk"
    for content in (b"", b"hello world, this is not a trace file at all"):
        path.write_bytes(content)
        with pytest.raises(TraceFileError, match="byte offset 0"):
            TraceReader(path)


def test_trailing_garbage_and_wrong_version(tmp_path):
    data, _ = small_file(tmp_path)
    path = tmp_path / "t"
    path.write_bytes(data + b"\x00")
    got, err = read_until_error(path)
    assert err is not None and err.offset == len(data)
    bumped = bytearray(data)
    bumped[12] = 3  # major version 3, with a CRC that matches it
    bumped[16:20] = struct.pack("<I", zlib.crc32(bytes(bumped[:16])))
    path.write_bytes(bytes(bumped))
    with pytest.raises(TraceFileError, match="version 3"):
        TraceReader(path)


# -- property-based round trip --------------------------------------------------------------

INTS = st.one_of(st.integers(-(2**63), 2**64 - 1), st.integers(), st.sampled_from(HUGE))
VALUES = {
    "u64": st.one_of(st.integers(0, 2**64 - 1), INTS),
    "s64": INTS,
    "f64": st.floats(allow_nan=True, allow_infinity=True),
    "str": st.text(st.characters(codec="utf-8") | st.sampled_from(["\ud800", "\udfff"])),
    "bool": st.booleans(),
}


@st.composite
def traces(draw):
    nformats = draw(st.integers(1, 4))
    formats = []
    for fid in range(nformats):
        types = draw(st.lists(st.sampled_from(list(VALUES)), max_size=6))
        fields = tuple(Field(f"f{i}", t) for i, t in enumerate(types))
        formats.append(EventFormat(fid * 7, f"fmt{fid}", fields))
    events = []
    for _ in range(draw(st.integers(0, 60))):
        fmt = draw(st.sampled_from(formats))
        ts = draw(st.integers(0, 2**64 - 1) | st.integers())
        tid = draw(st.integers(-(2**31), 2**31) | st.integers())
        values = tuple(draw(VALUES[f.type]) for f in fmt.fields)
        events.append((fmt.id, ts, tid, *values))
    return formats, events


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), batch=st.integers(1, 70))
def test_random_traces_round_trip(trace, batch):
    formats, events = trace
    out = io.BytesIO()
    with TraceWriter(out, {"n": len(events)}, formats=formats, batch_events=batch) as w:
        w.write_events(events)
    out.seek(0)
    reader = TraceReader(out)
    assert same_events(list(reader.events()), events)
    assert list(reader.formats) == formats


# -- the specification (docs/trace-format.md) ------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "trace-format.md"


def doc_example_bytes() -> bytes:
    text = DOC.read_text(encoding="utf-8")
    block = text.split("## 6. Example", 1)[1].split("```", 2)[1].split("\n", 1)[1]  # after "text"
    data = bytearray()
    for line in block.strip().splitlines():
        offset, rest = line.split(None, 1)
        assert int(offset, 16) == len(data), line
        data += bytes.fromhex(rest.split("|", 1)[0])
    return bytes(data)


def test_doc_example_is_what_the_writer_writes():
    reg = FormatRegistry()
    reg.register("funcgraph_entry", ["depth:u64", "func:str"])
    out = io.BytesIO()
    with TraceWriter(out, {"tracer": "function_graph"}, formats=reg) as w:
        w.set_thread_name(7, "main")
        w.write_events([(0, 1000, 7, 0, "main"), (0, 1250, 7, 1, "work")])
    assert out.getvalue() == doc_example_bytes()


def spec_decode(data: bytes) -> list[tuple]:
    """A decoder written from docs/trace-format.md alone (no code shared with the reader),
    to check that the document says enough. Handles the 1.0 chunk types."""
    assert data[:12] == b"\x89rethook\r\n\x1a\n" and zlib.crc32(data[:16]) == int.from_bytes(
        data[16:20], "little"
    )
    formats, strings, events, pos = {}, [], [], 20

    def u(n, at):
        return int.from_bytes(data[at : at + n], "little"), at + n

    def ints(at, c):
        enc = data[at]
        at += 1
        if enc in (0, 1):
            first = None
            if enc == 1:
                first = int.from_bytes(data[at : at + 8], "little", signed=True)
                at += 8
            code = data[at]
            size, signed = code & 0x0F, bool(code & 0x80)
            at += 1
            count = c if enc == 0 else c - 1
            vals = [
                int.from_bytes(data[at + i * size : at + (i + 1) * size], "little", signed=signed)
                for i in range(count)
            ]
            at += count * size
            if enc == 1:
                out = [first]
                for d in vals:
                    out.append(out[-1] + d)
                vals = out
            return vals, at
        if enc == 2:
            n, at = u(4, at)
            return [int.from_bytes(data[at : at + n], "little", signed=True)] * c, at + n
        vals = []
        for _ in range(c):
            n, at = u(4, at)
            vals.append(int.from_bytes(data[at : at + n], "little", signed=True))
            at += n
        return vals, at

    while True:
        tag, length = data[pos : pos + 4], u(4, pos + 4)[0]
        body = pos + 8
        assert zlib.crc32(data[pos : body + length]) == u(4, body + length)[0]
        if tag == b"FMT ":
            count, at = u(4, body)
            for _ in range(count):
                fid, at = u(4, at)
                n, at = u(4, at)
                at += n
                nfields, at = u(2, at)
                types = []
                for _ in range(nfields):
                    n, at = u(4, at)
                    types.append(data[at + n])
                    at += n + 1
                formats[fid] = types
        elif tag == b"STR ":
            first, at = u(4, body)
            count, at = u(4, at)
            assert first == len(strings)
            lengths = [u(4, at + 4 * i)[0] for i in range(count)]
            at += 4 * count
            for n in lengths:
                strings.append(data[at : at + n].decode("utf-8", "surrogatepass"))
                at += n
        elif tag == b"EVTS":
            n, at = u(4, body)
            k, at = u(2, at)
            table = []
            for _ in range(k):
                fid, at = u(4, at)
                count, at = u(4, at)
                table.append((fid, count))
            order = None
            if k > 1:
                order, at = ints(at, n)
            rows = {}
            for fid, count in table:
                cols = []
                for t in [0, 1, *formats[fid]]:
                    if t == 2:
                        cols.append(list(struct.unpack_from(f"<{count}d", data, at)))
                        at += 8 * count
                        continue
                    vals, at = ints(at, count)
                    cols.append(
                        [strings[v] for v in vals]
                        if t == 3
                        else [bool(v) for v in vals]
                        if t == 4
                        else vals
                    )
                rows[fid] = iter([(fid, *row) for row in zip(*cols, strict=True)])
            assert at == body + length
            for fid in order or [table[0][0]] * n:
                events.append(next(rows[fid]))
        elif tag == b"END ":
            assert u(8, body)[0] == len(events) and body + length + 4 == len(data)
            return events
        pos = body + length + 4


def test_spec_decoder_agrees(tmp_path):
    assert spec_decode(doc_example_bytes()) == [(0, 1000, 7, 0, "main"), (0, 1250, 7, 1, "work")]
    events = every_type_events()
    path = write(tmp_path / "t", events, batch_events=7)
    assert same_events(spec_decode(path.read_bytes()), events)


def test_function_graph_events_are_compact(tmp_path):
    events, ts = [], 10**18
    for i in range(20_000):
        ts += 37 + i % 200
        tid = 1000 + i % 4
        if i % 2 == 0:
            events.append((ENTRY.id, ts, tid, i % 11, f"mod.func_{i % 97}"))
        else:
            events.append((EXIT.id, ts, tid, i % 11, f"mod.func_{i % 97}", ts - 50, 0, 0, "None"))
    path = write(tmp_path / "t", events)
    assert path.stat().st_size / len(events) < 16
    assert read_all(path) == events
