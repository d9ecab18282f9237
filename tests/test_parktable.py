"""The C core's parked table (engine/parktable.h) against a dict, the table it replaces.

Random sequences of parks, takes, replacements and clears on real frames give the same
mapping as a dict given the same operations, and the table holds one reference to each parked
frame and record, as the dict did (collect_parked tells a collected generator's frame by its
count).
"""

from __future__ import annotations

import gc
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rethook.engine.select import c_core_available

pytestmark = pytest.mark.skipif(not c_core_available(), reason="the C core is not built")


def _gen():
    yield 1


FRAMES_KEPT = [g for g in (_gen() for _ in range(64))]  # their frames stay alive
FRAMES = [g.gi_frame for g in FRAMES_KEPT]

def _refs(objs: list) -> list[int]:
    gc.collect()  # (a KeyError raised with a frame in it may sit in a cycle until then)
    return [sys.getrefcount(o) for o in objs]


OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, len(FRAMES) - 1)),
    st.tuples(st.just("pop"), st.integers(0, len(FRAMES) - 1)),
    st.tuples(st.just("del"), st.integers(0, len(FRAMES) - 1)),
    st.tuples(st.just("clear"), st.just(0)),
), max_size=300)


@pytest.fixture()
def table():
    from rethook.engine import _ccore

    t = _ccore.parked()
    assert len(t) == 0, "the engine left calls parked"
    yield t
    t.clear()


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_the_table_behaves_as_a_dict_of_frames(ops):
    from rethook.engine import _ccore

    table, model = _ccore.parked(), {}
    records = [[i] for i in range(len(FRAMES))]
    try:
        for op, i in ops:
            frame, rec = FRAMES[i], records[i]
            if op == "put":
                table[frame] = rec
                model[frame] = rec
            elif op == "pop":
                assert table.pop(frame, None) is model.pop(frame, None)
            elif op == "del":
                if frame in model:
                    del table[frame]
                    del model[frame]
                else:
                    with pytest.raises(KeyError):
                        del table[frame]
            else:
                table.clear()
                model.clear()
            assert len(table) == len(model)
        assert dict(table.items()) == model
        assert set(table.keys()) == set(model) == set(table)
        assert all(frame in table and table[frame] is model[frame] for frame in model)
        assert sorted(map(id, table.values())) == sorted(map(id, model.values()))
        assert not [f for f in FRAMES if f not in model and (f in table or table.pop(f, 0))]
        # one reference to each parked frame and record, as the dict holds: what clearing
        # the table releases
        held = _refs(FRAMES), _refs(records)
        table.clear()
        after = _refs(FRAMES), _refs(records)
        assert [h - a for h, a in zip(held[0], after[0], strict=True)] == [
            int(f in model) for f in FRAMES]
        parked = {id(r) for r in model.values()}
        assert [h - a for h, a in zip(held[1], after[1], strict=True)] == [
            int(id(r) in parked) for r in records]
    finally:
        table.clear()


def test_keys_are_frames_and_misses_raise(table):
    with pytest.raises(TypeError):
        table["not a frame"] = [1]
    with pytest.raises(KeyError):
        table[FRAMES[0]]
    with pytest.raises(KeyError):
        table.pop(FRAMES[0])
    assert repr(table) == "<parked table: 0 calls>"


def test_a_churning_table_stays_small_and_finds_everything(table):
    """Parks and takes interleaved over many frames (a yield/resume storm): no entry lost,
    whatever the deletions did to the probe runs."""
    live: dict = {}
    for step in range(20000):
        frame = FRAMES[(step * 7) % len(FRAMES)]
        if frame in live:
            assert table.pop(frame) is live.pop(frame)
        else:
            live[frame] = [step]
            table[frame] = live[frame]
        if step % 997 == 0:
            assert all(table[f] is r for f, r in live.items()) and len(table) == len(live)
