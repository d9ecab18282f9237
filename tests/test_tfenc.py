"""The C column encoder (rethook.buffer._tfenc) against the Python one it mirrors.

Every test compares bytes: what ``_tfenc.encode_ints``/``encode_group`` append against what
``tracefile._encode_ints``/``TraceWriter._encode_group`` append, and whole files written with
and without the C encoder. The C encoder may decline (return False, having changed nothing);
the tests also pin down *when* it declines, so a C encoder that quietly gave up on ordinary
columns would fail them.
"""

from __future__ import annotations

import io
import struct
import sys
import sysconfig
from contextlib import contextmanager
from itertools import accumulate
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rethook.buffer import tracefile as tf
from rethook.buffer.events import FIELD_TYPES, FormatRegistry, Lost
from rethook.buffer.tracefile import TraceWriter
from rethook.buffer.traceread import TraceReader

NOT_BUILT = "rethook.buffer._tfenc is not built (no C compiler?): the writer runs tracefile.py"

I64_MIN, I64_MAX, U64_MAX = -(2**63), 2**63 - 1, 2**64 - 1

#: Values at and next to the edge of every width, and beyond 64 bits.
EDGES = sorted(
    {0, 1, -1, 2, -2, 2**64, 2**64 + 1, -(2**63) - 1, 2**100, -(2**100)}
    | {edge + d for size in (1, 2, 4, 8) for edge in (2 ** (8 * size) - 1, 2 ** (8 * size - 1) - 1,
                                                     -(2 ** (8 * size - 1)))
       for d in (-1, 0, 1)}
)


@pytest.fixture(scope="module")
def tfenc():
    return pytest.importorskip("rethook.buffer._tfenc", reason=NOT_BUILT)


@contextmanager
def encoder(c_module):
    """Run the writer with the C encoder ``c_module`` (None: the Python code only)."""
    saved = tf._tfenc
    tf._tfenc = c_module
    try:
        yield
    finally:
        tf._tfenc = saved


class Spy:
    """Stands in for the C module and records what encode_group answered."""

    def __init__(self, module) -> None:
        self.module = module
        self.answers: list[bool] = []

    def encode_group(self, *args):
        done = self.module.encode_group(*args)
        self.answers.append(done)
        return done

    def encode_ints(self, *args):  # (the batch's format-order column)
        return self.module.encode_ints(*args)


def py_ints(values: list, try_delta: bool) -> bytes:
    out: list[bytes] = []
    tf._encode_ints(list(values), out, try_delta)
    return b"".join(out)


def c_takes(values: list) -> bool:
    """Whether the C encoder must encode this column itself (rather than decline)."""
    if not values or any(type(v) not in (int, bool) for v in values):
        return False
    lo, hi = min(values), max(values)
    return I64_MIN <= lo and hi <= U64_MAX and not (lo < 0 and hi > I64_MAX)


def check_ints(tfenc, values: list, try_delta: bool) -> None:
    """encode_ints and encode_group (one column) append _encode_ints' bytes, or decline."""
    takes = c_takes(values)
    out = [b"before"]
    assert tfenc.encode_ints(list(values), out, try_delta) is takes
    group_out = [b"before"]
    group = [(0, v) for v in values]
    assert tfenc.encode_group(group, ("u64" if try_delta else "bool",), {}, [], group_out) is takes
    if not takes:
        assert out == group_out == [b"before"]
        return
    want = py_ints(values, try_delta)
    assert out == group_out == [b"before", want]


# -- integer columns ----------------------------------------------------------------------

edge = st.sampled_from(EDGES)
small = st.integers(-300, 300)
any64 = st.integers(I64_MIN, U64_MAX)
value = st.one_of(edge, small, any64, st.integers(-(2**70), 2**70), st.booleans())


@st.composite
def constants(draw):
    return [draw(value)] * draw(st.integers(1, 300))


@st.composite
def timestamps(draw):
    """Wide values with small steps (delta columns), starting anywhere, even near the edges."""
    first = draw(st.one_of(st.integers(10**12, 10**19), edge, any64))
    step = draw(st.sampled_from([2**7, 2**15, 2**31, 2**33]))
    deltas = draw(st.lists(st.integers(-step, step), min_size=1, max_size=400))
    return list(accumulate(deltas, initial=first))


@st.composite
def outliers(draw):
    """A long narrow column with a few far values the width sample may miss."""
    n = draw(st.integers(129, 3000))
    lo = draw(st.sampled_from([0, -100, 10**12, I64_MAX - 10**6, -(10**15)]))
    base = [lo + i % draw(st.integers(1, 200)) for i in range(n)]
    if draw(st.booleans()):
        base = list(accumulate(base[:1] + [1] * (n - 1)))  # a rising run: deltas of 1
    for _ in range(draw(st.integers(1, 3))):
        base[draw(st.integers(0, n - 1))] = draw(value)
    return base


@st.composite
def one_width(draw):
    """Values of one width, its bounds often among them: the narrowest width is exact."""
    size = draw(st.sampled_from([1, 2, 4, 8]))
    lo, hi = draw(st.sampled_from([(0, 2 ** (8 * size) - 1),
                                   (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1)]))
    inside = st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, lo + 1, hi - 1]))
    return draw(st.lists(inside, min_size=1, max_size=300))


@st.composite
def crossing(draw):
    """A rising or falling run that crosses a width's edge, maybe between the sample's points:
    whether deltas are tried depends on the width guessed from the sample."""
    n = draw(st.integers(2, 3000))
    edge_ = draw(st.sampled_from([2**8, 2**16, 2**32, -(2**7) - 1, -(2**15) - 1, -(2**31) - 1]))
    at = draw(st.integers(0, n - 1))  # where the run passes the edge
    step = 1 if edge_ > 0 else -1
    return [edge_ + step * (i - at) for i in range(n)]


columns = st.one_of(
    constants(),
    one_width(),
    crossing(),
    st.lists(value, min_size=1, max_size=300),
    st.lists(st.one_of(small, st.booleans()), min_size=1, max_size=300),
    st.lists(st.integers(0, 70000), min_size=1, max_size=300),
    st.lists(edge, min_size=1, max_size=300),
    timestamps(),
    outliers(),
)


@settings(max_examples=600, deadline=None)
@given(values=columns, try_delta=st.booleans())
@example(values=[I64_MIN, I64_MAX], try_delta=True)  # the difference needs 65 bits
@example(values=[I64_MAX, I64_MIN], try_delta=True)
@example(values=[I64_MAX - 1, I64_MAX, I64_MAX + 1], try_delta=True)  # one value beyond i64
@example(values=[U64_MAX, 0], try_delta=True)
@example(values=[U64_MAX] * 3, try_delta=True)  # a const beyond i64: 9-byte bigint
@example(values=[I64_MIN] * 2, try_delta=False)
@example(values=[-1, U64_MAX], try_delta=False)  # needs the big encoding: declined
@example(values=[2**64, 2**64], try_delta=True)  # a big const: declined
@example(values=[True, 1, True], try_delta=False)  # a const of True == 1
@example(values=[True, False, 5], try_delta=False)
@example(values=[5], try_delta=True)
def test_integer_columns(tfenc, values, try_delta):
    check_ints(tfenc, values, try_delta)


def test_the_width_sample_decides_whether_deltas_are_tried(tfenc):
    # 640 values rising by 1 across 2**32 at index 635, between the sample's points (every
    # 10th): the guess is u32, so no deltas are tried -- plain u64, though deltas would fit u8
    values = [2**32 - 635 + i for i in range(640)]
    assert py_ints(values, True)[:2] == bytes((tf._INT_PLAIN, 0x08))
    check_ints(tfenc, values, True)
    values = [2**32 - 625 + i for i in range(640)]  # crosses at 625: 630 is on the grid
    assert py_ints(values, True)[:1] == bytes((tf._INT_DELTA,))
    check_ints(tfenc, values, True)


def test_long_columns(tfenc):
    """Columns far longer than the width sample; the sample misses the outlier."""
    n = 300_001
    ts = list(accumulate([1 + i % 977 for i in range(n)], initial=1_700_000_000_000_000_000))
    check_ints(tfenc, ts, True)
    check_ints(tfenc, ts, False)
    narrow = [i % 200 for i in range(n)]
    check_ints(tfenc, narrow, True)
    narrow[12_345] = 70_000  # not on the sample's grid of n // 64: u8 guessed, u32 needed
    check_ints(tfenc, narrow, True)
    narrow[12_346] = -1  # and now signed
    check_ints(tfenc, narrow, True)
    wide_jump = list(ts)
    wide_jump[200_001] += 2**40  # one difference needs 8 bytes: plain, not delta
    check_ints(tfenc, wide_jump, True)


def test_declines_what_is_not_an_exact_int(tfenc):
    class MyInt(int):
        pass

    for values in ([], [1, 2.0], [1.0, 1], [1, "1"], [1, None], [MyInt(3), 4], [2**64, 1]):
        out: list[bytes] = []
        assert tfenc.encode_ints(values, out, True) is False
        assert out == []
    with pytest.raises(TypeError):
        tfenc.encode_ints((1, 2), [], True)
    with pytest.raises(TypeError):
        tfenc.encode_ints([1, 2], [], True, 4)


# -- whole groups -------------------------------------------------------------------------


def py_group(fmt, group, strings, new_strings) -> bytes:
    writer = TraceWriter(io.BytesIO())
    writer._strings = strings
    out: list[bytes] = []
    with encoder(None):
        writer._encode_group(fmt, group, out, new_strings)
    return b"".join(out)


def test_group_of_every_type(tfenc):
    reg = FormatRegistry()
    fmt = reg.register("every", ["u:u64", "s:s64", "f:f64", "a:str", "b:str", "flag:bool"])
    group = [
        (fmt.id, 1_000_000_000 + 10 * i, 7, i * i, -i, i / 3, f"s{i % 3}", f"s{i % 5}", i % 2 == 0)
        for i in range(50)
    ]
    group[3] = group[3][:5] + (-0.0,) + group[3][6:]
    group[4] = group[4][:5] + (float("nan"),) + group[4][6:]
    group[5] = group[5][:5] + (7,) + group[5][6:]  # an int in an f64 column, as array("d") takes
    types = ("u64", "s64", *(f.type for f in fmt.fields))
    strings = {"s4": 0, "old": 1}
    new: list[str] = []
    out: list[bytes] = []
    assert tfenc.encode_group(group, types, strings, new, out) is True
    assert len(out) == 1
    want_strings = {"s4": 0, "old": 1}
    want_new: list[str] = []
    assert out[0] == py_group(fmt, group, want_strings, want_new)
    # new strings in first-seen order, column by column, as _encode_strings adds them
    assert new == want_new == ["s0", "s1", "s2", "s3"]
    assert strings == want_strings


def test_group_declines_without_changing_anything(tfenc):
    types = ("u64", "s64", "str")
    good = [(1, 10, 7, "new"), (1, 20, 7, "other")]
    cases = [
        [],
        good + [(1, 30, 7)],  # short
        good + [(1, 30, 7, "x", 0)],  # long
        good + [[1, 30, 7, "x"]],  # not a tuple
        good + [(1, 30.0, 7, "x")],  # a float in an int column
        good + [(1, 2**64, 7, "x")],  # beyond 64 bits
        good + [(1, -1, 7, "x"), (1, U64_MAX, 7, "x")],  # the big encoding
        good + [(1, 30, 7, 3)],  # not a str
        good + [(1, 30, 7, type("S", (str,), {})("x"))],  # a str subclass
    ]
    for group in cases:
        strings = {"old": 0}
        new: list[str] = []
        out = [b"before"]
        assert tfenc.encode_group(group, types, strings, new, out) is False, group
        assert (strings, new, out) == ({"old": 0}, [], [b"before"])
    for bad_types in (("u64", "s64", "text"), ("u64", "s64", 3)):
        assert tfenc.encode_group(good, bad_types, {}, [], []) is False
    with pytest.raises(TypeError):
        tfenc.encode_group(good, list(types), {}, [], [])
    with pytest.raises(TypeError):
        tfenc.encode_group(good, types, {}, [])


def test_no_reference_leaks(tfenc):
    big = 10**15 + int("7")  # objects made here, so their counts are this test's
    s_old, s_new = "".join(["o", "ld"]), "".join(["n", "ew"])
    ev = (1, big, 7, s_old, s_new, 1.5, True)
    group = [ev] * 3 + [(1, big + 1, 7, s_old, s_new, 2.5, False)]
    types = ("u64", "s64", "str", "str", "f64", "bool")
    watched = (ev, big, s_old, s_new, group)
    before = [sys.getrefcount(x) for x in watched]
    for _ in range(200):
        strings = {s_old: 0}
        new: list[str] = []
        out: list[bytes] = []
        assert tfenc.encode_group(group, types, strings, new, out)
        assert new == [s_new] and strings[s_new] == 1
        assert not tfenc.encode_group(group + [(1, 2**70, 7, s_old, s_new, 1.0, True)], types,
                                      strings, new, out)
        assert tfenc.encode_ints([big, big + 1], out, True)
        assert not tfenc.encode_ints([big, 2**70], out, True)
        del strings, new, out
    assert [sys.getrefcount(x) for x in watched] == before


# -- whole files --------------------------------------------------------------------------


def write_file(events, formats, c_module, **kw) -> bytes | tuple[type, str]:
    """The file's bytes, or the error the writer raised (type and message)."""
    out = io.BytesIO()
    with encoder(c_module):
        try:
            with TraceWriter(out, {"tracer": "test"}, formats=formats, **kw) as w:
                w.write_events(events)
        except (TypeError, ValueError) as exc:
            return type(exc), str(exc)
    return out.getvalue()


POOL = ["", "main", "pkg.mod.f", "pkg.mod.g", "héllo", "✓ 🐍", "lone \ud800"]


class Text(str):
    pass


def field_values(ftype: str, bad: bool):
    """Values for a field of type ftype; with bad, also ones only Python handles (or refuses)."""
    if ftype in ("u64", "s64"):
        good = st.one_of(value, timestamps().map(lambda v: v[0]))
        return st.one_of(good, st.just(1.5), st.none()) if bad else good
    if ftype == "bool":
        good = st.one_of(st.booleans(), st.integers(0, 3))
        return st.one_of(good, st.none(), st.just("yes")) if bad else good
    if ftype == "f64":
        good = st.one_of(st.floats(), st.integers(-(2**53), 2**53))
        return st.one_of(good, st.just(2**1100), st.just("1.0")) if bad else good
    good = st.one_of(st.sampled_from(POOL), st.text(max_size=3))
    return st.one_of(good, st.sampled_from(POOL).map(Text), st.just(3)) if bad else good


@st.composite
def traces(draw):
    """A registry of 1-3 formats and events of them, now and then one the C side declines."""
    reg = FormatRegistry()
    fmts = []
    for k in range(draw(st.integers(1, 3))):
        ftypes = draw(st.lists(st.sampled_from(FIELD_TYPES), max_size=4))
        fmts.append(reg.register(f"fmt{k}", [f"f{i}:{t}" for i, t in enumerate(ftypes)]))
    bad = draw(st.integers(0, 3)) == 0
    events = []
    for _ in range(draw(st.integers(1, 60))):
        fmt = draw(st.sampled_from(fmts))
        ts = draw(st.one_of(st.integers(10**15, 10**15 + 10**6), value) if bad
                  else st.integers(10**15, 10**15 + 10**6))
        tid = draw(st.sampled_from([1, 2, 99999]))
        fields = tuple(draw(field_values(f.type, bad)) for f in fmt.fields)
        if bad and draw(st.integers(0, 20)) == 0:
            fields = fields[:-1] if fields else (1,)  # wrong length
        events.append((fmt.id, ts, tid, *fields))
        if draw(st.integers(0, 15)) == 0:
            events.append(Lost(tid, 3))
    return reg, events


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), batch=st.sampled_from([1, 3, 7, 1000]))
def test_files_are_byte_identical(tfenc, trace, batch):
    reg, events = trace
    spy = Spy(tfenc)
    with_c = write_file(events, reg, spy, batch_events=batch)
    python = write_file(events, reg, None, batch_events=batch)
    assert with_c == python
    if isinstance(with_c, bytes):
        back = list(TraceReader(io.BytesIO(with_c)).events(lost=True))
        assert list(map(normal, back)) == [normal(item, reg) for item in events]


def normal(item, reg=None):
    """An event as the reader returns it (the field types applied), floats as their bits."""
    if isinstance(item, Lost):
        return item
    fid, ts, tid, *values = item
    types = [f.type for f in reg.get(fid).fields] if reg is not None else [None] * len(values)
    cast = {"u64": int, "s64": int, "bool": bool, "str": str, "f64": float, None: lambda v: v}
    values = [cast[t](v) for t, v in zip(types, values, strict=True)]
    return (fid, int(ts), int(tid),
            *(struct.pack("<d", v) if isinstance(v, float) else (type(v), v) for v in values))


def test_batches_add_strings_like_python(tfenc):
    """New strings in two columns at once, over several batches: same table, same bytes."""
    reg = FormatRegistry()
    fmt = reg.register("two", ["a:str", "b:str", "n:u64"])
    names = [f"name{i}" for i in range(40)]
    events = [(fmt.id, 1000 + i, 5, names[(i * 7) % 40], names[(i * 3) % 23], i)
              for i in range(500)]
    spy = Spy(tfenc)
    with_c = write_file(events, reg, spy, batch_events=37)
    assert spy.answers and all(spy.answers)
    assert with_c == write_file(events, reg, None, batch_events=37)


def rec(n: int) -> int:
    """The function traced by test_recorded_function_graph_trace."""
    return n if n < 2 else rec(n - 1) + rec(n - 2)


def test_recorded_function_graph_trace(engine, tfenc):
    from rethook.control import Tracefs

    fs = Tracefs()
    try:
        fs.write("options/funcgraph-args", "1")
        fs.write("options/funcgraph-retval", "1")
        fs.write("set_ftrace_filter", f"{rec.__module__}.{rec.__qualname__}")
        fs.write("current_tracer", "function_graph")
        rec(16)
        fs.write("tracing_on", "0")
        items = fs.ctx.buffer._consume_all()
        formats = fs.ctx.formats
    finally:
        fs.close()
    calls = 2 * 1597 - 1  # calls rec(16) makes: 2 * fib(17) - 1
    assert not [item for item in items if isinstance(item, Lost)]
    assert len(items) == 2 * calls
    assert len({item[0] for item in items}) == 2  # entries and exits
    spy = Spy(tfenc)
    with_c = write_file(items, formats, spy, batch_events=1000)
    python = write_file(items, formats, None, batch_events=1000)
    assert isinstance(with_c, bytes)
    assert spy.answers and all(spy.answers)  # the C encoder wrote every group
    assert with_c == python
    assert list(TraceReader(io.BytesIO(with_c)).events(lost=True)) == items


def test_built_extension_is_imported():
    """A built _tfenc must be what tracefile uses (a failed constant check hides it)."""
    built = Path(tf.__file__).with_name("_tfenc" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not built.exists():
        pytest.skip(NOT_BUILT)
    assert tf._tfenc is not None
    assert Path(tf._tfenc.__file__) == built


def load_against(tfenc, monkeypatch, **changes) -> None:
    """Load the extension again, with tracefile's constants changed as given."""
    import importlib.util
    import types

    fake = types.ModuleType("rethook.buffer.tracefile")
    for name in ("_INT_PLAIN", "_INT_DELTA", "_INT_CONST", "_WIDTH_SAMPLES", "_UNSIGNED",
                 "_SIGNED", "_CHUNK_HEAD", "TAG_EVENTS", "TAG_STRINGS", "MAX_CHUNK_PAYLOAD"):
        setattr(fake, name, changes.get(name, getattr(tf, name)))
    for name, change in changes.items():
        if change is None:
            delattr(fake, name)
    monkeypatch.setitem(sys.modules, "rethook.buffer.tracefile", fake)
    spec = importlib.util.spec_from_file_location("rethook.buffer._tfenc", tfenc.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.encode_ints([1, 2], [], True) is True


def test_import_checks_the_constants(tfenc, monkeypatch):
    load_against(tfenc, monkeypatch)  # the real ones
    with pytest.raises(ImportError, match="_INT_DELTA is 5"):
        load_against(tfenc, monkeypatch, _INT_DELTA=5)
    with pytest.raises(ImportError, match="_WIDTH_SAMPLES is 32"):
        load_against(tfenc, monkeypatch, _WIDTH_SAMPLES=32)
    swapped = (tf._SIGNED[1], tf._SIGNED[0], *tf._SIGNED[2:])  # the order _narrowest tries
    with pytest.raises(ImportError, match=r"_SIGNED\[0\]\.code"):
        load_against(tfenc, monkeypatch, _SIGNED=swapped)
    with pytest.raises(ImportError, match="cannot check"):  # tracefile.py changed shape
        load_against(tfenc, monkeypatch, _INT_CONST=None)
    # the head of the EVTS chunks a call writes itself (encode_ring's fd)
    with pytest.raises(ImportError, match="EVTS chunk head"):
        load_against(tfenc, monkeypatch, TAG_EVENTS=b"EVNT")
    with pytest.raises(ImportError, match="EVTS chunk head"):
        load_against(tfenc, monkeypatch, _CHUNK_HEAD=struct.Struct(">4sI"))
    # and of the STR chunks (the strings its batches add), no larger than a chunk may be
    with pytest.raises(ImportError, match="TAG_STRINGS: the STR  chunk head"):
        load_against(tfenc, monkeypatch, TAG_STRINGS=b"STRS")
    with pytest.raises(ImportError, match="MAX_CHUNK_PAYLOAD is 1024"):
        load_against(tfenc, monkeypatch, MAX_CHUNK_PAYLOAD=1024)
