"""One owner for each shared shape: the event schema, the shadow-stack entry kinds, the core
interface and its capabilities, each defined once in Python and checked against the C twins."""

from __future__ import annotations

import types

import pytest

from rethook.buffer import native, schema
from rethook.engine import core, select
from rethook.engine.coreapi import Capabilities, HookCore
from rethook.tracers import formats


def test_the_tracers_formats_are_the_schemas():
    assert formats.BUILTIN is schema.BUILTIN
    assert formats.EXIT_RAISED == schema.EXIT_FLAGS["raised"]
    assert schema.EXIT_FLAGS["unfinished"] == core.FLAG_UNFINISHED
    assert schema.EXIT_FLAGS["closed"] == core.FLAG_CLOSED
    bits = list(schema.EXIT_FLAGS.values())
    assert all(b & (b - 1) == 0 for b in bits) and len(set(bits)) == len(bits)


@pytest.mark.skipif(native._cring is None, reason="the C ring is not built")
def test_the_c_ring_was_built_for_this_schema():
    assert native.check_c_schema(native._cring) == ""


def test_a_c_ring_of_another_schema_is_refused():
    good = {f.id: f.name for f in schema.NATIVE_FORMATS}
    other = types.SimpleNamespace(RECORD_TYPES={**good, 9: "funcgraph_exit"},
                                  RAW_RECORD_FIELDS=schema.RAW_RECORD_FIELDS,
                                  CALLER_OFFSET=schema.CALLER_OFFSET)
    assert "record types" in native.check_c_schema(other)
    swapped = tuple(reversed(schema.RAW_RECORD_FIELDS))
    other = types.SimpleNamespace(RECORD_TYPES=good, RAW_RECORD_FIELDS=swapped,
                                  CALLER_OFFSET=schema.CALLER_OFFSET)
    assert "raw records" in native.check_c_schema(other)


def test_decoded_records_follow_the_formats_field_order():
    """The decoder (the reference of the C ones) puts each value where its format says."""
    code = test_decoded_records_follow_the_formats_field_order.__code__
    raw = dict(ts=10, code=code, parent=None, depth=3, calltime=4, sleep=5, flags=6, overrun=7)
    for fmt in schema.NATIVE_FORMATS:
        rec = dict(raw, type=fmt.id, parent=code if fmt is schema.FUNCTION else None)
        (event,) = native.decode([tuple(rec[f] for f in schema.RAW_RECORD_FIELDS)], 99,
                                 lambda c: c.co_name)
        assert event[:3] == (fmt.id, 10, 99)
        values = dict(zip((f.name for f in fmt.fields), event[3:], strict=True))
        want = {"func": code.co_name, "depth": 3, "calltime": 4, "overrun": 7, "sleep": 5,
                "flags": 6, "args": "", "retval": "", "parent": code.co_name,
                "parent_line": 3}  # a function record's depth holds the caller's line
        assert values == {k: want[k] for k in values}, fmt.name


def test_shadow_stack_entry_kinds():
    code = test_shadow_stack_entry_kinds.__code__
    marker = core.make_marker(code)
    direct = core.make_direct(code, "reg", "capsule")
    record = [code, code, None, 0, 0, 0]
    assert core.entry_kind(marker) is core.EntryKind.MARKER
    assert core.entry_kind(direct) is core.EntryKind.DIRECT
    assert core.entry_kind(record) is core.EntryKind.RECORD
    assert core.entry_code(marker) is core.entry_code(direct) is core.entry_code(record) is code
    assert core.direct_registration(direct) == "reg"
    record += ["r1", "d1", "r2", "d2"]
    assert core.claims(record) == [("r1", "d1"), ("r2", "d2")]


def test_every_core_implements_the_interface_and_says_what_it_can():
    caps = select.available_cores()
    assert [c.name for c in caps][-1] == "python"  # the reference is always there
    assert len({c.name for c in caps}) == len(caps)
    for cap in caps:
        c = select.choose_core(cap.name)
        assert isinstance(c, HookCore)
        assert c.capabilities == cap and c.name == cap.name
        assert isinstance(cap, Capabilities) and cap.describe().startswith("core capabilities")
    assert core.PyCore.capabilities.direct_calls is False  # it ignores direct entries


@pytest.mark.skipif(native._cring is None, reason="the C ring is not built")
def test_a_callers_offset_is_read_as_its_line():
    """The native function user stores the caller's instruction offset (CALLER_OFFSET); every
    reader gives the line: raw records, decoded events and the fused drain (test_fused_drain
    compares that one with the events)."""
    import dis

    def caller():
        return 1

    code = caller.__code__
    ring = native._cring.Ring(16, 1)
    offsets = [(i.offset, i.positions.lineno) for i in dis.get_instructions(code)
               if i.positions.lineno is not None]
    for off, _ in offsets:
        ring.write(1, 5, code, code, off, 0, 0, schema.CALLER_OFFSET, 0)
    ring.write(1, 6, code, code, 42, 0, 0, 0, 0)  # a line as it is
    lines = [line for _, line in offsets] + [42]
    raw = ring.events()
    assert [r[4] for r in raw] == lines and {r[7] for r in raw} == {0}
    events = ring.events(1, lambda c: c.co_name)
    assert [e[5] for e in events] == lines
