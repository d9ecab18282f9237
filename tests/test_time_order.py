"""Reports in time order across threads, for every tracer and view.

- from the command line: threads that hand over to each other in the middle of their calls
  (events, not timing), recorded and reported with ``-O funcgraph-abstime`` (and the function
  tracer's timestamps): the timestamps never decrease;
- the in-process ``trace`` file, the same way;
- ``TraceReader.ordered_events``, property-tested: per-thread streams cut into chunks written
  in any order across threads come back merged by timestamp, each thread's items in their
  recorded order, Lost markers where they fell, and the lookahead pairs right.
"""

from __future__ import annotations

import io
import re
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rethook.buffer.events import EventFormat, Field, Lost
from rethook.buffer.tracefile import TraceFileError, TraceFileWarning, TraceWriter
from rethook.buffer.traceread import TraceReader
from rethook.control import Tracefs
from test_cli import rethook

ROUNDS = 12
TIMESTAMP = re.compile(r"^\s*(\d+\.\d{6}) \|")  # funcgraph-abstime's column
FUNCTION_TS = re.compile(r"\] +(\d+\.\d{6}):")  # the function tracer's


def timestamps(lines: list[str], pattern: re.Pattern[str]) -> list[float]:
    return [float(m.group(1)) for line in lines if (m := pattern.search(line))]


def never_decrease(values: list[float]) -> bool:
    return all(a <= b for a, b in zip(values, values[1:], strict=False))


def test_reports_of_threads_in_time_order(tmp_path: Path) -> None:
    for tracer, flags, pattern in (("function_graph", ("-O", "funcgraph-abstime"), TIMESTAMP),
                                   ("function", (), FUNCTION_TS)):
        out = tmp_path / f"{tracer}.dat"
        rec = rethook("record", "-p", tracer, "-o", str(out), "handoff.py", str(ROUNDS))
        assert rec.returncode == 0, rec.stderr
        rep = rethook("report", "-i", str(out), *flags)
        assert rep.returncode == 0, rep.stderr
        lines = rep.stdout.splitlines()
        stamps = timestamps(lines, pattern)
        assert len(stamps) > 6 * ROUNDS
        assert never_decrease(stamps), tracer
        assert sum("__main__.leaf" in line for line in lines) == 3 * ROUNDS


def test_the_trace_file_in_time_order(engine) -> None:
    """The in-process ``trace`` file: a call whose thread's next event comes after other
    threads' is printed when it is due."""
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", "*:mod:test_time_order")
        fs.write("options/funcgraph-abstime", "1")
        fs.write("current_tracer", "function_graph")
        _handoff(3, ROUNDS)
        fs.write("tracing_on", "0")
        lines = fs.read("trace").splitlines()
    finally:
        fs.close()
    stamps = timestamps(lines, TIMESTAMP)
    assert len(stamps) > 6 * ROUNDS
    assert never_decrease(stamps)
    assert sum("test_time_order.handoff_leaf" in line for line in lines) == 3 * ROUNDS


def handoff_leaf(i: int) -> int:
    return i + 1


def handoff_turn(i: int, me: threading.Event, following: threading.Event) -> int:
    me.wait()
    me.clear()
    value = handoff_leaf(i)
    following.set()
    return value


def handoff_worker(rounds: int, me: threading.Event, following: threading.Event) -> None:
    for i in range(rounds):
        handoff_turn(i, me, following)


def _handoff(n: int, rounds: int) -> None:
    events = [threading.Event() for _ in range(n)]
    threads = [threading.Thread(target=handoff_worker,
                                args=(rounds, events[k], events[(k + 1) % n]))
               for k in range(n)]
    for t in threads:
        t.start()
    events[0].set()
    for t in threads:
        t.join()


# --- the reader's merge ---------------------------------------------------------------------
FMT = EventFormat(0, "mark", (Field("seq", "u64"),))


@st.composite
def recordings(draw):
    """Per-thread streams (sorted timestamps, ties allowed, Lost markers anywhere), and the
    order a recorder wrote them in: chunks of a few items of one or more threads."""
    nthreads = draw(st.integers(1, 4))
    streams = []
    for tid in range(1, nthreads + 1):
        steps = draw(st.lists(st.integers(0, 3), max_size=25))
        items, t = [], 0
        for seq, step in enumerate(steps):
            t += step
            items.append((0, t, tid * 1000, seq))
        for _ in range(draw(st.integers(0, 2))):
            lost = Lost(tid * 1000, draw(st.integers(1, 5)))
            items.insert(draw(st.integers(0, len(items))), lost)
        streams.append(items)
    chunks, pos = [], [0] * nthreads
    while any(p < len(s) for p, s in zip(pos, streams, strict=True)):
        chunk = []
        for _ in range(draw(st.integers(1, 3))):
            k = draw(st.integers(0, nthreads - 1))
            n = draw(st.integers(1, 4))
            chunk += streams[k][pos[k]:pos[k] + n]
            pos[k] += n
        chunks.append(chunk)
    return streams, chunks


@settings(max_examples=150, deadline=None)
@given(recording=recordings())
def test_ordered_events_merge_threads_by_time(recording) -> None:
    streams, chunks = recording
    buf = io.BytesIO()
    with TraceWriter(buf, formats=[FMT]) as w:
        for chunk in chunks:
            w.write_events(chunk)
    buf.seek(0)
    with TraceReader(buf) as reader:
        merged = list(reader.ordered_events(lost=True))
        pairs = list(reader.ordered_events(lost=True, lookahead=True))
        events = list(reader.ordered_events())
    # each thread's items in their recorded order, nothing lost or added
    by_thread: dict[int, list] = {}
    for item in merged:
        by_thread.setdefault(item.tid if isinstance(item, Lost) else item[2], []).append(item)
    assert {items[0].tid if isinstance(items[0], Lost) else items[0][2]: items
            for items in streams if items} == by_thread
    # events by time; a Lost marker keyed like its thread's next event (or its last; a
    # thread with nothing but Lost markers has them last of all)
    keys = []
    for items in by_thread.values():
        last = 1 << 64
        for i, item in enumerate(items):
            if isinstance(item, Lost):
                later = [x[1] for x in items[i:] if not isinstance(x, Lost)]
                keys.append((id(item), later[0] if later else last))
            else:
                last = item[1]
    key_of = dict(keys)
    times = [key_of[id(x)] if isinstance(x, Lost) else x[1] for x in merged]
    assert times == sorted(times)
    assert events == [x for x in merged if not isinstance(x, Lost)]
    # lookahead: the next item of the same thread
    assert [p[0] for p in pairs] == merged
    following: dict[int, object] = {}
    for item, nxt in reversed(pairs):
        tid = item.tid if isinstance(item, Lost) else item[2]
        assert nxt == following.get(tid)
        following[tid] = item


def test_ordered_events_of_a_damaged_file() -> None:
    """Everything before the damage, merged, then the error (strict) or a warning."""
    buf = io.BytesIO()
    with TraceWriter(buf, formats=[FMT]) as w:
        w.write_events([(0, 5, 1, 0), (0, 6, 1, 1)])
        w.write_events([(0, 1, 2, 0), (0, 7, 2, 1)])
        w.write_events([(0, 8, 1, 2)])
    data = buf.getvalue()
    cut = io.BytesIO(data[:data.rindex(b"EVTS") + 10])  # inside the last events chunk
    reader = TraceReader(cut)
    got = []
    try:
        for ev in reader.ordered_events():
            got.append(ev)
    except TraceFileError as e:
        assert "truncated" in str(e)
    else:
        raise AssertionError("no error for a truncated file")
    assert [ev[1] for ev in got] == [1, 5, 6, 7]
    with pytest.warns(TraceFileWarning):
        assert [ev[1] for ev in TraceReader(cut, strict=False).ordered_events()] == [1, 5, 6, 7]
