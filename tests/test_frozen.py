"""rethook.frozen: the records that were frozen dataclasses behave as they did (repr, ==, hash,
immutability, match, pickle and copy); TraceSettings as the plain dataclass it was; the Rows
that were NamedTuples as named tuples."""

from __future__ import annotations

import copy
import pickle

import pytest

from rethook.buffer.events import EventFormat, Field, Lost
from rethook.buffer.ring import BufferStats
from rethook.engine.coreapi import Capabilities
from rethook.engine.filters import FilterCommand, Pattern
from rethook.engine.registry import FunctionInfo
from rethook.frozen import Row
from rethook.runner.settings import TraceSettings


def test_records_compare_hash_and_show_their_fields():
    assert repr(Lost(1, 2)) == "Lost(tid=1, count=2)"
    assert repr(Pattern("a*", position=4)) == \
        "Pattern(glob='a*', module=None, remove=False, position=4)"
    assert repr(EventFormat(5, "ev", ["a:u64"])) == \
        "EventFormat(id=5, name='ev', fields=(Field(name='a', type='u64'),))"
    assert Lost(1, 2) == Lost(1, 2) and Lost(1, 2) != Lost(1, 3)
    assert Lost(1, 2) != (1, 2)  # not a tuple: never mistaken for an event
    assert len({Lost(1, 2), Lost(1, 2)}) == 1
    # position says where a pattern was written: not compared
    assert Pattern("a*", position=4) == Pattern("a*") and \
        hash(Pattern("a*", position=4)) == hash(Pattern("a*"))
    assert Pattern("a*") != Pattern("a*", remove=True)
    assert FilterCommand("f", None, "traceoff", count=3, position=9) == \
        FilterCommand("f", None, "traceoff", count=3)
    assert Capabilities("c", True, False) == Capabilities("c", direct_calls=True,
                                                          native_users=False)


def test_function_info_is_compared_by_identity():
    def f():
        pass

    args = (f.__code__, "m.f", "m", "f", "m.py", 1, "function")
    a, b = FunctionInfo(*args), FunctionInfo(*args)
    assert a == a and a != b and hash(a) != hash(b) and a.suffix == ""


@pytest.mark.parametrize("record", [
    Lost(1, 2), Field("x", "u64"), EventFormat(7, "ev", [Field("x", "u64")]),
    Pattern("g*", "mod", True, 3), FilterCommand("f", None, "enable_event", ("a", "b"), 5),
    Capabilities("python", False, False),
], ids=lambda r: type(r).__name__)
def test_records_are_frozen_and_pickle(record):
    name = record.__match_args__[0]
    with pytest.raises(AttributeError, match="cannot assign to field"):
        setattr(record, name, 1)
    with pytest.raises(AttributeError, match="cannot delete field"):
        delattr(record, name)
    with pytest.raises(AttributeError):  # (frozen slotted dataclasses raised TypeError here)
        record.other = 1
    for again in (pickle.loads(pickle.dumps(record)), copy.copy(record), copy.deepcopy(record)):
        assert again == record and repr(again) == repr(record)


def test_records_match_by_position():
    match Lost(3, 4):
        case Lost(tid, count):
            assert (tid, count) == (3, 4)


def test_validation_stays():
    with pytest.raises(ValueError, match="common_ prefix"):
        Field("common_x", "u64")
    with pytest.raises(ValueError, match="duplicate field names"):
        EventFormat(1, "ev", ["a:u64", "a:str"])


def test_trace_settings():
    s = TraceSettings(filters=["a*"], event_filters={"e": ["x > 1"]})
    assert s.notrace == [] and s.notrace is not TraceSettings().notrace
    assert s == TraceSettings.from_json(s.to_json()) and s != TraceSettings()
    t = s.replace(filters=["b*"])
    assert t.filters == ["b*"] and s.filters == ["a*"] and t.event_filters is s.event_filters
    assert repr(TraceSettings()).startswith("TraceSettings(tracer='function_graph', filters=[], ")
    with pytest.raises(TypeError):
        hash(s)
    s.tracer = "function"  # mutable, as before
    assert s.tracer == "function"


class _Point(Row):
    x: int
    y: int = 0  #: a default
    label: str = "p"


def test_rows_are_named_tuples():
    p = _Point(1, 2)
    assert p == (1, 2, "p") and isinstance(p, tuple) and p[1] == 2 and p.label == "p"
    assert _Point(1) == (1, 0, "p") and _Point(x=3, label="q") == (3, 0, "q")
    assert _Point._fields == ("x", "y", "label") and _Point.__match_args__ == _Point._fields
    assert repr(p) == "_Point(x=1, y=2, label='p')"
    assert p._asdict() == {"x": 1, "y": 2, "label": "p"}
    assert p._replace(y=5) == (1, 5, "p") and type(p._replace()) is _Point
    x, y, label = p
    assert (x, y, label) == (1, 2, "p")
    with pytest.raises(AttributeError):
        p.x = 4  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing argument 'x'"):
        _Point()
    with pytest.raises(TypeError, match="takes 3 arguments"):
        _Point(1, 2, "a", 4)
    with pytest.raises(TypeError, match="unexpected arguments"):
        _Point(1, z=2)
    stats = BufferStats(1, 2, 3, 4)
    assert pickle.loads(pickle.dumps(stats)) == stats and copy.copy(stats) == stats
    assert type(pickle.loads(pickle.dumps(stats))) is BufferStats
    match stats:
        case BufferStats(entries, written):
            assert (entries, written) == (1, 2)


def test_a_row_subclass_keeps_its_fields():
    class Named(_Point):
        def norm(self) -> int:
            return abs(self.x) + abs(self.y)

    assert Named(3, -4).norm() == 7 and Named._fields == _Point._fields
    with pytest.raises(TypeError, match="declared in one class"):
        class Wider(_Point):  # noqa: F841 - the class statement is the test
            z: int
