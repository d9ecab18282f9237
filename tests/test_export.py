"""Exports: the Perfetto trace (parsed back with Perfetto's own protos) and folded stacks.

The Perfetto output is decoded with ``perfetto_trace_pb2`` from the ``perfetto`` package
(Perfetto's published Python bindings: the compiled protos of perfetto_trace.proto), so the
field numbers and wire types of the hand-written encoder are checked against the real schema.
"""

from __future__ import annotations

import asyncio
import gc
import io
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rethook.buffer.events import EventFormat, Lost
from rethook.buffer.tracefile import TraceWriter, write_trace
from rethook.buffer.traceread import TraceReader
from rethook.control import Tracefs
from rethook.output.folded import write_folded
from rethook.output.perfetto import (
    INSTANT,
    SLICE_BEGIN,
    SLICE_END,
    slice_events,
    write_perfetto,
)
from rethook.tracers.formats import BUILTIN, EXIT_RAISED

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

# -- the traced program: every function counts its own calls, per thread -------------------

CALLS: Counter[tuple[str, str]] = Counter()
PREFIX = f"{__name__}.prog_"


def _hit(name: str) -> None:
    CALLS[threading.current_thread().name, name] += 1


def prog_fib(n):
    _hit("prog_fib")
    return n if n < 2 else prog_fib(n - 1) + prog_fib(n - 2)


class ProgError(Exception):
    pass


def prog_fail(n):
    _hit("prog_fail")
    if n == 0:
        raise ProgError("bottom")
    return prog_fail(n - 1)


def prog_catch(n):
    _hit("prog_catch")
    try:
        return prog_fail(n)
    except ProgError:
        return "caught"


def prog_leaf(x):
    _hit("prog_leaf")
    return x * 2


def prog_outer(x):
    _hit("prog_outer")
    return prog_leaf(x) + prog_leaf(x + 1)


def prog_gen(n):
    _hit("prog_gen")
    for i in range(n):
        yield prog_leaf(i)


async def prog_nap(i):
    _hit("prog_nap")
    await asyncio.sleep(0.001 * i)  # suspends exactly once
    return prog_leaf(i)


async def prog_main(n):
    _hit("prog_main")
    return await asyncio.gather(*[prog_nap(i) for i in range(n)])


def prog_worker(n):
    _hit("prog_worker")
    return prog_fib(n) + len(prog_catch(2))


# -- recording and decoding ------------------------------------------------------------------


@pytest.fixture
def fs(engine):
    CALLS.clear()
    fs = Tracefs()
    yield fs
    fs.close()


def record(fs: Tracefs, path: Path, fn, *args, tracer: str = "function_graph",
           options: tuple[str, ...] = ("funcgraph-args", "funcgraph-retval"),
           **settings: str) -> TraceReader:
    for opt in options:
        fs.write(f"options/{opt}", "1")
    for name, value in settings.items():
        fs.write(name, value)
    fs.write("set_ftrace_filter", PREFIX + "*")
    fs.write("current_tracer", tracer)
    fn(*args)
    fs.write("tracing_on", "0")
    write_trace(path, fs.ctx.buffer, fs.ctx.formats,
                meta={"tracer": fs.tracer.name, "options": fs.ctx.options.as_dict()})
    return TraceReader(path)


@dataclass
class Slice:
    name: str
    begin: int
    end: int | None = None
    depth: int = 0
    parent: Slice | None = None
    args: dict[str, Any] = field(default_factory=dict)
    end_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Decoded:
    packets: list
    processes: dict[int, Any]  # uuid -> ProcessDescriptor
    threads: dict[int, Any]  # uuid -> ThreadDescriptor
    slices: dict[int, list[Slice]]  # uuid -> slices in begin order
    instants: dict[int, list[tuple[int, str, dict]]]
    timestamps: dict[int, list[int]]  # uuid -> every event's timestamp, in file order

    def track_of(self, thread_name: str) -> int:
        (uuid,) = [u for u, t in self.threads.items() if t.thread_name == thread_name]
        return uuid


def _value(ann) -> Any:
    if ann.dict_entries:  # a call's arguments: one nested annotation per parameter
        return {e.name: _value(e) for e in ann.dict_entries}
    return getattr(ann, ann.WhichOneof("value"))


def decode(data: bytes) -> Decoded:
    """Parse with Perfetto's protos and rebuild the slices as trace_processor would."""
    trace = pb.Trace()
    trace.ParseFromString(data)
    names: dict[int, str] = {}
    keys: dict[int, str] = {}
    out = Decoded(list(trace.packet), {}, {}, {}, {}, {})
    open_: dict[int, list[Slice]] = {}
    for p in trace.packet:
        if p.HasField("interned_data"):
            for n in p.interned_data.event_names:
                assert n.iid not in names, "event name interned twice"
                names[n.iid] = n.name
            for n in p.interned_data.debug_annotation_names:
                assert n.iid not in keys, "annotation name interned twice"
                keys[n.iid] = n.name
        if p.HasField("track_descriptor"):
            td = p.track_descriptor
            if td.HasField("process"):
                out.processes[td.uuid] = td.process
            if td.HasField("thread"):
                out.threads[td.uuid] = td.thread
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        assert p.trusted_packet_sequence_id == 1
        assert p.sequence_flags == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        uuid = te.track_uuid
        assert uuid in out.threads, "event on a track not described before"
        out.timestamps.setdefault(uuid, []).append(p.timestamp)
        ann = {keys[a.name_iid]: _value(a) for a in te.debug_annotations}
        stack = open_.setdefault(uuid, [])
        if te.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            parent = stack[-1] if stack else None
            s = Slice(names[te.name_iid], p.timestamp, None, len(stack), parent, ann)
            stack.append(s)
            out.slices.setdefault(uuid, []).append(s)
        elif te.type == pb.TrackEvent.TYPE_SLICE_END:
            assert stack, "SLICE_END with no open slice"
            s = stack.pop()
            s.end = p.timestamp
            s.end_args = ann
        else:
            assert te.type == pb.TrackEvent.TYPE_INSTANT
            out.instants.setdefault(uuid, []).append((p.timestamp, names[te.name_iid], ann))
    for uuid, stamps in out.timestamps.items():
        assert stamps == sorted(stamps), f"timestamps go back on track {uuid}"
    return out


def export(reader: TraceReader) -> Decoded:
    buf = io.BytesIO()
    count = write_perfetto(reader, buf)
    decoded = decode(buf.getvalue())
    assert count == len(decoded.packets)
    return decoded


def calls_of(slices: list[Slice]) -> Counter[str]:
    """Slices that are calls (not resumptions of a suspended call)."""
    return Counter(s.name.removeprefix(f"{__name__}.") for s in slices if "resumed" not in s.args)


def short(name: str) -> str:
    return name.removeprefix(f"{__name__}.")


# -- Perfetto: function_graph ------------------------------------------------------------------


def test_perfetto_clock_process_and_thread_tracks(fs, tmp_path):
    def run():
        prog_outer(1)
        t = threading.Thread(target=prog_worker, args=(3,), name="worker-1")
        t.start()
        t.join()

    reader = record(fs, tmp_path / "t.rth", run)
    out = export(reader)
    first = out.packets[0]
    assert first.clock_snapshot.primary_trace_clock == pb.BUILTIN_CLOCK_MONOTONIC
    assert [c.clock_id for c in first.clock_snapshot.clocks] == [pb.BUILTIN_CLOCK_MONOTONIC]
    second = out.packets[1]
    assert second.trace_packet_defaults.timestamp_clock_id == pb.BUILTIN_CLOCK_MONOTONIC
    assert second.sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert second.first_packet_on_sequence
    ((puuid, process),) = out.processes.items()
    names = {t.thread_name: t for t in out.threads.values()}
    main, worker = names["MainThread"], names["worker-1"]
    assert main.tid == threading.main_thread().native_id == process.pid
    assert worker.tid == t_native(reader, "worker-1")
    assert main.pid == worker.pid == process.pid
    for p in out.packets:
        if p.HasField("track_descriptor") and p.track_descriptor.HasField("thread"):
            assert p.track_descriptor.parent_uuid == puuid
    # timestamps are the trace's own: the events' timestamps, per thread
    for uuid, thread in out.threads.items():
        tid = next(t for t, n in reader.threads.items() if n == thread.thread_name)
        stamps = [ev[1] for ev in reader.events() if ev[2] == tid]
        assert out.timestamps.get(uuid, []) == stamps


def t_native(reader: TraceReader, name: str) -> int:
    return next(tid for tid, n in reader.threads.items() if n == name)


def test_perfetto_calls_nest_and_carry_args_and_results(fs, tmp_path):
    def run():
        prog_fib(7)
        prog_catch(3)
        prog_outer(5)
        workers = [threading.Thread(target=prog_worker, args=(i + 4,), name=f"w{i}")
                   for i in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    reader = record(fs, tmp_path / "t.rth", run)
    out = export(reader)
    for thread in ("MainThread", "w0", "w1"):
        slices = out.slices[out.track_of(thread)]
        expected = Counter({f: n for (t, f), n in CALLS.items() if t == thread})
        assert calls_of(slices) == expected
        for s in slices:
            assert s.end is not None and s.begin <= s.end
            if s.parent is not None:  # nested inside the parent's interval
                assert s.parent.begin <= s.begin and s.end <= s.parent.end
            callers = {"prog_fib": {"prog_fib", "prog_worker", None},
                       "prog_fail": {"prog_fail", "prog_catch"},
                       "prog_catch": {"prog_worker", None},
                       "prog_leaf": {"prog_outer"},
                       "prog_outer": {None}, "prog_worker": {None}}[short(s.name)]
            assert (short(s.parent.name) if s.parent else None) in callers
    main = out.slices[out.track_of("MainThread")]
    fibs = [s for s in main if short(s.name) == "prog_fib"]
    assert fibs[0].args == {"args": {"n": "7"}} and fibs[0].end_args == {"retval": "13"}
    assert max(s.depth for s in fibs) == 6
    fails = [s for s in main if short(s.name) == "prog_fail"]
    assert len(fails) == 4
    for s in fails:
        assert s.end_args == {"raised": True, "exception": "ProgError('bottom')"}
    (catch,) = [s for s in main if short(s.name) == "prog_catch"]
    assert catch.args == {"args": {"n": "3"}} and catch.end_args == {"retval": "'caught'"}


def test_perfetto_generators_and_coroutines_suspend_and_resume(fs, tmp_path):
    def run():
        assert list(prog_gen(3)) == [0, 2, 4]
        assert asyncio.run(prog_main(3)) == [0, 2, 4]

    reader = record(fs, tmp_path / "t.rth", run)
    out = export(reader)
    slices = out.slices[out.track_of("MainThread")]
    assert calls_of(slices) == Counter({f: n for (_, f), n in CALLS.items()})
    gen = [s for s in slices if short(s.name) == "prog_gen"]
    # the first run, then one piece per resumption: 3 yields, resumed 3 times
    assert [("resumed" in s.args, "suspended" in s.end_args) for s in gen] == [
        (False, True), (True, True), (True, True), (True, False)]
    assert gen[-1].end_args["retval"] == "None" and "call_ns" in gen[-1].end_args
    for s in gen:
        leaves = [c for c in slices if c.parent is s]
        assert [short(c.name) for c in leaves] == ([] if s is gen[-1] else ["prog_leaf"])
    naps = [s for s in slices if short(s.name) == "prog_nap"]
    assert len(naps) == 6  # three coroutines, each suspended once
    first, resumed = naps[:3], naps[3:]
    assert all("suspended" in s.end_args and "resumed" not in s.args for s in first)
    assert all("resumed" in s.args for s in resumed)
    assert sorted(s.end_args["retval"] for s in resumed) == ["0", "2", "4"]
    assert all(s.parent is None for s in naps)  # the event loop is not traced
    mains = [s for s in slices if short(s.name) == "prog_main"]
    assert "resumed" not in mains[0].args and "suspended" in mains[0].end_args
    assert "resumed" in mains[-1].args and mains[-1].end_args["retval"] == "[0, 2, 4]"


def test_perfetto_tracing_thresh_exits_without_entries(fs, tmp_path):
    reader = record(fs, tmp_path / "t.rth", prog_fib, 12, tracing_thresh="1")
    exits = [ev for ev in reader.events()]
    assert exits and all(ev[0] == 3 for ev in exits)  # no entries at all
    out = export(reader)
    slices = out.slices[out.track_of("MainThread")]
    assert len(slices) == len(exits)
    # a slower parent is always recorded when its child is: nesting depth = graph depth
    by_end = {s.end: s for s in slices}
    for ev in exits:
        s = by_end[ev[1]]
        assert (s.begin, s.depth, s.args) == (ev[5], ev[3], {"entry_missing": True})
        assert s.end_args["retval"] == ev[9]


def test_perfetto_overwritten_buffer_still_nests(fs, tmp_path):
    reader = record(fs, tmp_path / "t.rth", prog_fib, 16, buffer_size_kb="4")
    events = list(reader.events())
    assert events[0][0] == 3, "the oldest entries should have been overwritten"
    out = export(reader)
    slices = out.slices[out.track_of("MainThread")]
    ends = [s for s in slices if "exit_missing" not in s.end_args]
    assert len(ends) == sum(1 for ev in events if ev[0] == 3)
    assert sum(1 for s in slices if "entry_missing" not in s.args) == len(events) - len(ends)
    assert all(s.end is not None for s in slices)
    roots = [s for s in slices if s.parent is None]
    assert [short(s.name) for s in roots] == ["prog_fib"]
    assert roots[0].end_args["retval"] == "987"


def test_perfetto_function_tracer_instants(fs, tmp_path):
    def run():
        prog_outer(1)
        prog_fib(3)

    reader = record(fs, tmp_path / "t.rth", run, tracer="function", options=())
    out = export(reader)
    uuid = out.track_of("MainThread")
    assert uuid not in out.slices
    instants = out.instants[uuid]
    assert Counter(short(name) for _, name, _ in instants) == Counter(
        {f: n for (_, f), n in CALLS.items()})
    by_name = {}
    for _, name, ann in instants:
        by_name.setdefault(short(name), []).append(ann)
    assert all(a["parent"] == f"{__name__}.prog_outer" for a in by_name["prog_leaf"])
    assert all(isinstance(a["parent_line"], int) and a["parent_line"] > 0
               for a in by_name["prog_leaf"])


# -- Perfetto: a hand-written trace with every awkward case -----------------------------------

E, X, S, R = 2, 3, 4, 5  # funcgraph entry, exit, suspend, resume
CLOSED_RAISED = 2 | EXIT_RAISED
K = 1000  # timestamps in microseconds, so the folded values come out exact


def awkward_events() -> list:
    main, w = 11, 22
    return [
        (6, 105 * K, w, "a\nb"),  # a stack trace
        (E, 110 * K, main, 2, "g", "x=1"),  # p and c were entered before the buffer's start
        (E, 130 * K, w, 0, "w", ""),
        (X, 120 * K, main, 2, "g", 110 * K, 0, 0, 0, "1"),
        (X, 140 * K, w, 0, "w", 130 * K, 0, 0, 0, ""),
        (X, 150 * K, main, 1, "c", 100 * K, 0, 0, 0, "2"),
        (E, 160 * K, main, 1, "k", ""),
        Lost(main, 5),  # k's exit among them
        (E, 200 * K, main, 1, "m", ""),
        (X, 210 * K, main, 1, "m", 200 * K, 0, 0, 0, ""),
        (X, 300 * K, main, 0, "p", 50 * K, 0, 0, 0, ""),
        (E, 400 * K, main, 0, "gen", ""),
        (S, 410 * K, main, 0, "gen"),
        (R, 420 * K, main, 0, "gen"),
        (S, 430 * K, main, 0, "gen"),
        (E, 440 * K, main, 0, "q", ""),
        # the suspended generator was collected: the engine closes it at its suspension time
        (X, 430 * K, main, 0, "gen", 400 * K, 0, 0, CLOSED_RAISED, "GeneratorExit()"),
        (X, 460 * K, main, 0, "q", 440 * K, 0, 0, 0, ""),
        (E, 500 * K, main, 0, "open", ""),  # still running when tracing stopped
        (PROBE.id, 510 * K, UNNAMED, 42, 0.5, 2**64 - 1, -(2**70), True),
        (7, 530 * K, main, "traceoff fired"),
    ]


PROBE = EventFormat(100, "myprobe", (("count", "u64"), ("ratio", "f64"), ("big", "u64"),
                                     ("huge", "s64"), ("ok", "bool")))
UNNAMED = 2**40  # a thread id too wide for Perfetto's int32 tid, and no name
AWKWARD_META = {"tracer": "function_graph", "pid": 11, "argv": ["/srv/app.py", "-x"],
                "clock_snapshot": {"monotonic_ns": 7 * K, "realtime_ns": 1_700_000_000 * 10**9}}


def awkward_trace(path: Path) -> TraceReader:
    with TraceWriter(path, AWKWARD_META, formats=(*BUILTIN, PROBE)) as w:
        w.set_thread_name(11, "main")
        w.set_thread_name(22, "worker")
        w.write_events(awkward_events())
    return TraceReader(path)


def test_slice_events_of_the_awkward_trace(tmp_path):
    reader = awkward_trace(tmp_path / "t.rth")
    main = [(k, ts // K, name, dict(ann)) for k, ts, tid, name, ann in slice_events(reader)
            if tid == 11]
    B, End, I = SLICE_BEGIN, SLICE_END, INSTANT  # noqa: E741
    assert main == [
        (B, 50, "p", {"entry_missing": True}),
        (B, 100, "c", {"entry_missing": True}),
        (B, 110, "g", {"args": {"x": "1"}}),
        (End, 120, "g", {"retval": "1"}),
        (End, 150, "c", {"retval": "2"}),
        (B, 160, "k", {}),
        (I, 160, "lost 5 events", {"count": 5}),
        (End, 200, "k", {"exit_missing": True}),
        (B, 200, "m", {}),
        (End, 210, "m", {}),
        (End, 300, "p", {}),
        (B, 400, "gen", {}),
        (End, 410, "gen", {"suspended": True}),
        (B, 420, "gen", {"resumed": True}),
        (End, 430, "gen", {"suspended": True}),
        (B, 440, "q", {}),
        (I, 440, "gen", {"raised": True, "exception": "GeneratorExit()", "closed": True,
                         "while_suspended": True}),
        (End, 460, "q", {}),
        (B, 500, "open", {}),
        (I, 530, "print", {"msg": "traceoff fired"}),
    ]
    worker = [(k, ts // K, name, dict(ann)) for k, ts, tid, name, ann in slice_events(reader)
              if tid == 22]
    assert worker == [(I, 105, "kernel_stack", {"stack": "a\nb"}),
                      (B, 130, "w", {}), (End, 140, "w", {})]
    probe = [(k, ts // K, name, dict(ann)) for k, ts, tid, name, ann in slice_events(reader)
             if tid == UNNAMED]
    assert probe == [(I, 510, "myprobe", {"count": 42, "ratio": 0.5, "big": 2**64 - 1,
                                          "huge": -(2**70), "ok": True})]


def test_slice_events_when_the_first_pass_matched_a_stale_slice(tmp_path):
    # A's child X and X's child Y lost their exits; so did the entries of F (A's next child)
    # and of F's child Y. The first pass takes Y's exit for the stale Y's; the second pass has
    # closed the stale slices when F began, so Y's exit becomes a slice of its own, inside F.
    events = [
        (E, 10, 1, 0, "A", ""), (E, 20, 1, 1, "X", ""), (E, 30, 1, 2, "Y", ""),
        Lost(1, 4),
        (X, 70, 1, 2, "Y", 60, 0, 0, 0, "y"), (X, 80, 1, 1, "F", 50, 0, 0, 0, "f"),
        (X, 90, 1, 0, "A", 10, 0, 0, 0, "a"),
    ]
    with TraceWriter(tmp_path / "t.rth", {"tracer": "function_graph"}, formats=BUILTIN) as w:
        w.write_events(events)
    got = [(k, ts, name, dict(ann)) for k, ts, _, name, ann
           in slice_events(TraceReader(tmp_path / "t.rth"))]
    B, End, I = SLICE_BEGIN, SLICE_END, INSTANT  # noqa: E741
    assert got == [
        (B, 10, "A", {}), (B, 20, "X", {}), (B, 30, "Y", {}),
        (I, 30, "lost 4 events", {"count": 4}),
        (End, 50, "Y", {"exit_missing": True}), (End, 50, "X", {"exit_missing": True}),
        (B, 50, "F", {"entry_missing": True}),
        (B, 60, "Y", {"entry_missing": True}), (End, 70, "Y", {"retval": "y"}),
        (End, 80, "F", {"retval": "f"}), (End, 90, "A", {"retval": "a"}),
    ]


def test_perfetto_of_the_awkward_trace(tmp_path):
    out = export(awkward_trace(tmp_path / "t.rth"))
    clocks = {c.clock_id: c.timestamp for c in out.packets[0].clock_snapshot.clocks}
    assert clocks == {pb.BUILTIN_CLOCK_MONOTONIC: 7 * K,
                      pb.BUILTIN_CLOCK_REALTIME: 1_700_000_000 * 10**9}
    (process,) = out.processes.values()
    assert (process.pid, process.process_name, list(process.cmdline)) == (
        11, "app.py", ["/srv/app.py", "-x"])
    (unnamed,) = [t for t in out.threads.values() if t.thread_name == f"tid-{UNNAMED}"]
    assert 0 < unnamed.tid < 2**31 and unnamed.pid == 11
    ((_, _, probe),) = out.instants[out.track_of(f"tid-{UNNAMED}")]
    assert probe == {"count": 42, "ratio": 0.5, "big": 2**64 - 1, "huge": str(-(2**70)),
                     "ok": True}
    main = out.slices[out.track_of("main")]
    shape = [(s.name, s.begin // K, s.end and s.end // K, s.depth) for s in main]
    assert shape == [("p", 50, 300, 0), ("c", 100, 150, 1), ("g", 110, 120, 2),
                     ("k", 160, 200, 1), ("m", 200, 210, 1), ("gen", 400, 410, 0),
                     ("gen", 420, 430, 0), ("q", 440, 460, 0), ("open", 500, None, 0)]
    assert [(ts // K, name) for ts, name, _ in out.instants[out.track_of("main")]] == [
        (160, "lost 5 events"), (440, "gen"), (530, "print")]


# -- robustness: any loss of events still gives nested slices ----------------------------------


def _call_tree_events(draw_tree: list, tid: int) -> list:
    """A well-formed graph event stream of nested calls (some of them generators)."""
    events: list = []
    t = [1000]

    def tick() -> int:
        t[0] += 7
        return t[0]

    def call(node: tuple, depth: int) -> None:
        name, children, suspends = node
        begin = tick()
        events.append((E, begin, tid, depth, name, ""))
        for i, child in enumerate(children):
            call(child, depth + 1)
            if suspends and i == 0:
                events.append((S, tick(), tid, depth, name))
                events.append((R, tick(), tid, depth, name))
        events.append((X, tick(), tid, depth, name, begin, 0, 0, 0, "r"))

    for node in draw_tree:
        call(node, 0)
    return events


names = st.sampled_from(["a", "b"])  # few names: stale slices often look alike
trees = st.recursive(
    st.tuples(names, st.just([]), st.booleans()),
    lambda kids: st.tuples(names, st.lists(kids, max_size=3), st.booleans()),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(trees, min_size=1, max_size=3), st.data())
def test_slice_events_nest_whatever_is_lost(forest, data):
    events = _call_tree_events(forest, 5)
    keep = data.draw(st.lists(st.booleans(), min_size=len(events), max_size=len(events)))
    kept = [ev for ev, k in zip(events, keep, strict=True) if k]
    buf = io.BytesIO()
    with TraceWriter(buf, {"tracer": "function_graph"}, formats=BUILTIN) as w:
        w.write_events(kept)
    buf.seek(0)
    stack: list[str] = []
    last = 0
    exits = ends = 0
    for kind, ts, _tid, name, ann in slice_events(TraceReader(buf)):
        assert ts >= last
        last = ts
        if kind == SLICE_BEGIN:
            stack.append(name)
        elif kind == SLICE_END:
            assert stack and stack.pop() == name
            ends += "exit_missing" not in dict(ann) and "suspended" not in dict(ann)
    exits = sum(1 for ev in kept if ev[0] == X)
    assert ends == exits  # every recorded exit closes exactly one slice


# -- folded stacks -----------------------------------------------------------------------------


def folded(reader: TraceReader, **kw) -> list[str]:
    out = io.StringIO()
    n = write_folded(reader, out, **kw)
    lines = out.getvalue().splitlines()
    assert n == len(lines)
    return lines


def test_folded_awkward_trace_exact(tmp_path):
    reader = awkward_trace(tmp_path / "t.rth")
    assert folded(reader) == [
        "gen 20", "open 30", "p 150", "p;c 40", "p;c;g 10", "p;k 40", "p;m 10", "q 20", "w 10"]
    assert folded(reader, per_thread=True) == [
        "main-11/11;gen 20", "main-11/11;open 30", "main-11/11;p 150", "main-11/11;p;c 40",
        "main-11/11;p;c;g 10", "main-11/11;p;k 40", "main-11/11;p;m 10", "main-11/11;q 20",
        "worker-11/22;w 10"]


def test_folded_rounding_and_merging(tmp_path):
    events = [
        (E, 0, 1, 0, "f", ""), (X, 400, 1, 0, "f", 0, 0, 0, 0, ""),  # merged before
        (E, 1000, 1, 0, "f", ""), (X, 2100, 1, 0, "f", 1000, 0, 0, 0, ""),  # rounding: 1.5 us
        (E, 3000, 1, 0, "g;h", ""), (X, 3400, 1, 0, "g;h", 3000, 0, 0, 0, ""),  # 0.4 us
    ]
    with TraceWriter(tmp_path / "t.rth", {}, formats=BUILTIN) as w:  # tracer told by formats
        w.write_events(events)
    assert folded(TraceReader(tmp_path / "t.rth")) == ["f 2", "g:h 1"]


def test_folded_function_tracer_counts_caller_pairs(tmp_path):
    events = [(1, t, 1, func, parent, 3) for t, (func, parent) in enumerate(
        [("a", "main"), ("b", "a"), ("b", "a"), ("c", ""), ("a", "main"), ("b", "a")])]
    with TraceWriter(tmp_path / "t.rth", {"tracer": "function"}, formats=BUILTIN) as w:
        w.set_thread_name(1, "T")
        w.write_events(events)
    reader = TraceReader(tmp_path / "t.rth")
    assert folded(reader) == ["a;b 3", "c 1", "main;a 2"]
    assert folded(reader, per_thread=True) == ["T-1/1;a;b 3", "T-1/1;c 1", "T-1/1;main;a 2"]


def test_folded_real_trace_stacks_and_total_time(fs, tmp_path):
    def run():
        prog_fib(6)
        prog_outer(2)
        list(prog_gen(2))

    reader = record(fs, tmp_path / "t.rth", run)
    lines = folded(reader)
    fib = f"{__name__}.prog_fib"
    outer, leaf, gen = (f"{__name__}.prog_{n}" for n in ("outer", "leaf", "gen"))
    stacks = [line.rsplit(" ", 1)[0] for line in lines]
    assert stacks == sorted([";".join([fib] * d) for d in range(1, 7)]
                            + [outer, f"{outer};{leaf}", gen, f"{gen};{leaf}"])
    values = [int(line.rsplit(" ", 1)[1]) for line in lines]
    assert all(v >= 1 for v in values)
    # the values add up to the time the top-level calls ran (not suspended), give or take
    # the rounding of each line (at most 1 us)
    total = start = 0
    for ev in reader.events():
        if ev[3] == 0 and ev[0] in (E, R):
            start = ev[1]
        elif ev[3] == 0 and ev[0] in (X, S):
            total += ev[1] - start
    assert abs(sum(values) - total / 1000) <= len(values)
    threads = folded(reader, per_thread=True)
    tid = threading.get_native_id()
    assert threads == [f"MainThread-{os.getpid()}/{tid};{line}" for line in lines]


def test_exports_write_to_files(fs, tmp_path):
    reader = record(fs, tmp_path / "t.rth", prog_outer, 3)
    with open(tmp_path / "t.pftrace", "wb") as f:
        packets = write_perfetto(reader, f)
    with open(tmp_path / "t.folded", "w") as f:
        lines = write_folded(reader, f)
    assert len(decode((tmp_path / "t.pftrace").read_bytes()).packets) == packets
    assert len((tmp_path / "t.folded").read_text().splitlines()) == lines == 2


def test_perfetto_generator_collected_while_suspended(fs, tmp_path):
    def run():
        g = prog_gen(5)
        next(g)
        next(g)
        del g
        gc.collect()
        prog_outer(1)
        # 3.13 fires no event for the collected generator: the engine finds it and delivers
        # its exit, stamped with the time of its last suspension (before prog_outer ran)
        fs.ctx.engine.collect_parked()

    reader = record(fs, tmp_path / "t.rth", run)
    out = export(reader)
    uuid = out.track_of("MainThread")
    slices = out.slices[uuid]
    assert calls_of(slices) == Counter({f: n for (_, f), n in CALLS.items()})
    pieces = [("resumed" in s.args, s.end_args) for s in slices if short(s.name) == "prog_gen"]
    closed = [a for _, name, a in out.instants.get(uuid, []) if short(name) == "prog_gen"]
    raised = {"raised": True, "exception": "GeneratorExit()"}
    if closed:  # 3.13: no event when it is collected; the engine closes it later
        assert pieces == [(False, {"suspended": True}), (True, {"suspended": True})]
        (ann,) = closed
        assert ann.pop("sleep_ns") > 0  # its one suspension before the last
        assert ann == {**raised, "closed": True, "while_suspended": True}
        # late (stamped before prog_outer ran): shown when it was learnt, after prog_outer
        assert [ts for ts, _, _ in out.instants[uuid]] == [max(s.end for s in slices)]
    else:  # 3.12: collecting it throws GeneratorExit in, a resumption that raises
        assert pieces[:2] == [(False, {"suspended": True}), (True, {"suspended": True})]
        assert len(pieces) == 3 and pieces[2][0]
        assert {k: pieces[2][1][k] for k in raised} == raised
    assert [short(s.name) for s in slices[-3:]] == ["prog_outer", "prog_leaf", "prog_leaf"]
    assert sum(1 for ev in reader.events() if ev[0] == X and short(ev[4]) == "prog_gen") == 1
