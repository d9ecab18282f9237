"""Export a trace file as a native Perfetto trace, for ui.perfetto.dev and trace_processor.

The output is a protobuf ``Trace``: a stream of ``TracePacket`` messages, written by a small
wire-format encoder in this module (no protobuf runtime needed). Field numbers are those of
Perfetto's public protos (``trace_packet.proto``, ``track_event.proto``,
``track_descriptor.proto``, ``debug_annotation.proto``, ``interned_data.proto``,
``clock_snapshot.proto``). What maps to what is described in docs/export.md; in short:

* one process track per process (the recording process and every followed child), and one
  thread track per thread (tid and thread name) under its process;
* function_graph calls are nested slices (SLICE_BEGIN/SLICE_END) named after the function,
  with the call's arguments, return value or exception and exit flags as debug annotations;
  a generator or coroutine suspension ends its slice and a resumption starts a new one
  (annotated ``resumed``);
* every other event (``function`` tracer calls, stack traces, probe events) is an instant
  event with its fields as annotations, and lost events are instants ``lost N events``.

Timestamps are the trace's own (CLOCK_MONOTONIC, from ``perf_counter_ns``): a clock snapshot
makes MONOTONIC the trace's primary clock and the packets default to it.

The slices are rebuilt by :func:`slice_events`, shared with the folded-stack exporter. It
guarantees per thread what Perfetto needs: slices that nest, timestamps that never go back.
An exit whose entry the trace lacks (lost, overwritten, or never recorded because of
tracing_thresh) still becomes a slice, begun at its ``calltime``; finding those exits takes a
first pass over the file, so the file is read twice and never held in memory (only such
exits are remembered between the passes). Both passes read the events in time order across
threads (``TraceReader.ordered_events``). Calls still open when the trace ends stay open:
Perfetto shows them as slices that did not end.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from collections.abc import Iterator
from typing import Any, BinaryIO

from rethook.buffer.events import COMMON_COUNT, EventFormat, Lost
from rethook.buffer.tracefile import TraceReader
from rethook.tracers.formats import EXIT_RAISED

FLAG_UNFINISHED = 1  # the engine's flags on funcgraph_exit (rethook.engine.core)
FLAG_CLOSED = 2

# TrackEvent.Type, also the kinds of the records slice_events yields
SLICE_BEGIN = 1
SLICE_END = 2
INSTANT = 3

#: ``(kind, ts_ns, tid, name, annotations)``: one record of :func:`slice_events`.
Record = tuple[int, int, int, str, tuple[tuple[str, Any], ...]]

# how an open slice began
_ENTRY, _RESUMED, _SYNTHETIC = 0, 1, 2
# what an exit closes
_MATCH, _ORPHAN, _DETACHED = 0, 1, 2


# -- rebuilding slices ------------------------------------------------------------------


class _Thread:
    """One thread's open slices, as both passes of :func:`slice_events` see them."""

    __slots__ = ("stack", "suspended", "floor", "last", "orphans", "orphan_exits")

    def __init__(self) -> None:
        self.stack: list[tuple[int, str, int]] = []  # (depth, func, how); depths increase
        self.suspended: dict[str, int] = {}  # func -> calls suspended here, not resumed yet
        self.floor: list[int] = []  # [d]: time of the latest graph event at depth <= d
        self.last = 0  # latest timestamp given to a record of this thread
        self.orphans: deque[tuple[int, int, str, int]] = deque()  # (begin, depth, func, index)
        self.orphan_exits: set[int] = set()

    def cut(self, depth: int) -> list[tuple[int, str, int]]:
        """Pop the slices at ``depth`` or deeper: a new call at ``depth`` means they ended."""
        stack = self.stack
        popped = []
        while stack and stack[-1][0] >= depth:
            popped.append(stack.pop())
        return popped

    def unwind(self, depth: int, func: str) -> tuple[list[tuple[int, str, int]], bool]:
        """Pop what must have ended before ``func`` at ``depth`` leaves; whether it is on top."""
        stack = self.stack
        popped = []
        while stack and stack[-1][0] > depth:
            popped.append(stack.pop())
        if stack and stack[-1][0] == depth:
            if stack[-1][1] == func:
                return popped, True
            popped.append(stack.pop())
        return popped, False

    def exit(self, depth: int, func: str, flags: int) -> tuple[list[tuple[int, str, int]], int]:
        """Classify an exit: it closes the top slice, one never begun, or a suspended call."""
        stack = self.stack
        if stack and stack[-1][0] == depth and stack[-1][1] == func:
            return [], _MATCH
        if flags & (FLAG_CLOSED | FLAG_UNFINISHED) and self.suspended.get(func):
            # a suspended generator closed, collected or torn down: no slice is open for it
            self.suspended[func] -= 1
            return [], _DETACHED
        popped, matched = self.unwind(depth, func)
        return popped, _MATCH if matched else _ORPHAN

    def suspend(self, func: str) -> None:
        self.suspended[func] = self.suspended.get(func, 0) + 1

    def raise_floor(self, depth: int, ts: int) -> None:
        floor = self.floor
        if floor and ts < floor[-1]:  # a late event: raise only what it is later than
            for k in range(depth, len(floor)):
                if floor[k] < ts:
                    floor[k] = ts
        elif depth < len(floor):
            del floor[depth + 1:]
            floor[depth] = ts
        else:
            floor.extend([floor[-1] if floor else 0] * (depth - len(floor)))
            floor.append(ts)

    def floor_at(self, depth: int) -> int:
        floor = self.floor
        return floor[min(depth, len(floor) - 1)] if floor else 0


def _resume(threads: dict[int, _Thread], here: _Thread, func: str) -> None:
    """A resumption takes a suspended call off its thread (maybe another: it migrated)."""
    for th in (here, *threads.values()):
        if th.suspended.get(func):
            th.suspended[func] -= 1
            return


def _graph_ids(reader: TraceReader) -> tuple[int | None, ...]:
    ids = {f.name: f.id for f in reader.formats}
    return (ids.get("funcgraph_entry"), ids.get("funcgraph_exit"),
            ids.get("funcgraph_suspend"), ids.get("funcgraph_resume"))


def _find_orphans(reader: TraceReader, ids: tuple[int | None, ...]) -> dict[int, _Thread]:
    """First pass: per thread, the exits whose entry is missing, with where their slice
    begins: at ``calltime``, but not before the thread's last graph event at that depth or
    shallower (a call resumed without a recorded resumption). Sorted by begin, outer first."""
    entry, exit_, suspend, resume = ids
    threads: dict[int, _Thread] = {}
    for index, ev in enumerate(reader.ordered_events(lost=True)):
        if isinstance(ev, Lost):
            continue
        fid = ev[0]
        if fid != entry and fid != exit_ and fid != suspend and fid != resume:
            continue
        ts, tid, depth, func = ev[1], ev[2], ev[3], ev[4]
        th = threads.get(tid)
        if th is None:
            th = threads[tid] = _Thread()
        if fid == exit_:
            _, outcome = th.exit(depth, func, ev[8])
            if outcome == _MATCH:
                th.stack.pop()
            elif outcome == _ORPHAN:
                begin = min(ts, max(ev[5], th.floor_at(depth)))
                th.orphans.append((begin, depth, func, index))
            else:
                continue  # a suspended call closed: says nothing of what the thread runs
        elif fid == entry or fid == resume:
            if fid == resume:
                _resume(threads, th, func)
            th.cut(depth)
            th.stack.append((depth, func, _ENTRY))
        else:
            _popped, matched = th.unwind(depth, func)
            if matched:
                th.stack.pop()
            th.suspend(func)
        th.raise_floor(depth, ts)
    for th in threads.values():
        th.orphans = deque(sorted(th.orphans, key=lambda o: (o[0], o[1], o[3])))
        th.orphan_exits = {o[3] for o in th.orphans}
    return threads


def _exit_annotations(ev: tuple) -> list[tuple[str, Any]]:
    _, _, _, _, _, _calltime, overrun, sleep, flags, retval = ev
    ann: list[tuple[str, Any]] = []
    if flags & EXIT_RAISED:
        ann.append(("raised", True))
        if retval:
            ann.append(("exception", retval))
    elif retval:
        ann.append(("retval", retval))
    if flags & FLAG_UNFINISHED:
        ann.append(("unfinished", True))
    if flags & FLAG_CLOSED:
        ann.append(("closed", True))
    if sleep:
        ann.append(("sleep_ns", sleep))
    if overrun:
        ann.append(("overrun", overrun))
    return ann


def _instant(fmt: EventFormat, ev: tuple) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """Name and annotations of an event shown as an instant."""
    fields = ev[COMMON_COUNT:]
    ann = tuple(zip(fmt.field_names, fields, strict=False))
    if fmt.name == "function":
        return fields[0], ann[1:] if fields[1] else ()
    return fmt.name, ann


_EXIT_MISSING = (("exit_missing", True),)
_ENTRY_MISSING = (("entry_missing", True),)
_RESUMED_ANN = (("resumed", True),)
_SUSPENDED_ANN = (("suspended", True),)


def slice_events(reader: TraceReader) -> Iterator[Record]:
    """The trace as per-thread nested slices and instants, in file order.

    Yields ``(kind, ts_ns, tid, name, annotations)`` with kind SLICE_BEGIN, SLICE_END or
    INSTANT. Per thread, BEGIN/END pairs nest properly and timestamps never decrease; an END
    closes the latest open BEGIN of its thread (its name repeats that slice's name).
    """
    ids = _graph_ids(reader)
    entry, exit_, suspend, resume = ids
    graph = {fid for fid in ids if fid is not None}
    threads = _find_orphans(reader, ids) if exit_ is not None else {}
    for th in threads.values():  # the second pass starts over, knowing the orphans
        th.stack.clear()
        th.suspended.clear()
        th.floor.clear()
    formats = reader.formats
    instants: dict[int, EventFormat | None] = {}
    latest = 0

    def at(th: _Thread, ts: int) -> int:
        if ts > th.last:
            th.last = ts
        return th.last

    def ended(th: _Thread, tid: int, ts: int, popped: list) -> Iterator[Record]:
        if popped:
            t = at(th, ts)
            for _depth, func, _how in popped:
                yield (SLICE_END, t, tid, func, _EXIT_MISSING)

    def begin_orphans(th: _Thread, tid: int, ts: int, index: int) -> Iterator[Record]:
        """Begin the slices of entry-less exits that start before ``ts`` (or end at it)."""
        queue = th.orphans
        due = index in th.orphan_exits
        while queue and (due or queue[0][0] < ts):
            begin, depth, func, idx = queue.popleft()
            th.orphan_exits.discard(idx)
            if idx == index:
                due = False
            t = at(th, begin)
            yield from ended(th, tid, t, th.cut(depth))
            th.stack.append((depth, func, _SYNTHETIC))
            yield (SLICE_BEGIN, t, tid, func, _ENTRY_MISSING)

    for index, ev in enumerate(reader.ordered_events(lost=True)):
        if isinstance(ev, Lost):
            tid = ev.tid
            th = threads.get(tid) or threads.setdefault(tid, _Thread())
            t = max(latest, th.last)
            if th.orphans:
                yield from begin_orphans(th, tid, t, index)
            yield (INSTANT, at(th, t), tid, f"lost {ev.count} events", (("count", ev.count),))
            continue
        fid, ts, tid = ev[0], ev[1], ev[2]
        th = threads.get(tid) or threads.setdefault(tid, _Thread())
        if ts > latest:
            latest = ts
        if th.orphans:
            yield from begin_orphans(th, tid, ts, index)
        if fid not in graph:
            fmt = instants.get(fid)
            if fmt is None:
                fmt = instants[fid] = formats.get(fid)
            name, ann = _instant(fmt, ev)
            yield (INSTANT, at(th, ts), tid, name, ann)
            continue
        depth, func = ev[3], ev[4]
        if fid == entry:
            yield from ended(th, tid, ts, th.cut(depth))
            th.stack.append((depth, func, _ENTRY))
            yield (SLICE_BEGIN, at(th, ts), tid, func, (("args", ev[5]),) if ev[5] else ())
        elif fid == exit_:
            popped, outcome = th.exit(depth, func, ev[8])
            yield from ended(th, tid, ts, popped)
            ann = _exit_annotations(ev)
            if outcome == _MATCH:
                how = th.stack.pop()[2]
                if how == _RESUMED:
                    ann.append(("call_ns", ts - ev[5]))
                yield (SLICE_END, at(th, ts), tid, func, tuple(ann))
            elif outcome == _DETACHED:
                ann.append(("while_suspended", True))
                yield (INSTANT, at(th, ts), tid, func, tuple(ann))
            else:  # not foreseen by the first pass (a stale slice matched there): a leaf
                yield (SLICE_BEGIN, at(th, min(ev[5], ts)), tid, func, _ENTRY_MISSING)
                yield (SLICE_END, at(th, ts), tid, func, tuple(ann))
        elif fid == suspend:
            popped, matched = th.unwind(depth, func)
            yield from ended(th, tid, ts, popped)
            th.suspend(func)
            if matched:
                th.stack.pop()
                yield (SLICE_END, at(th, ts), tid, func, _SUSPENDED_ANN)
            else:
                yield (INSTANT, at(th, ts), tid, func, _SUSPENDED_ANN)
        else:  # resume
            _resume(threads, th, func)
            yield from ended(th, tid, ts, th.cut(depth))
            th.stack.append((depth, func, _RESUMED))
            yield (SLICE_BEGIN, at(th, ts), tid, func, _RESUMED_ANN)


# -- protobuf wire format -----------------------------------------------------------------

_VARINT = 0
_FIXED64 = 1
_LEN = 2
_MASK64 = (1 << 64) - 1


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL[value]
    value &= _MASK64  # negative int64: ten bytes of two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _len(field_key: bytes, payload: bytes) -> bytes:
    return field_key + _varint(len(payload)) + payload


def _text(value: str) -> bytes:
    return value.encode("utf-8", "backslashreplace")


# Trace
_TRACE_PACKET = _key(1, _LEN)
# TracePacket
_P_CLOCK_SNAPSHOT = _key(6, _LEN)
_P_TIMESTAMP = _key(8, _VARINT)
_P_SEQUENCE_ID = _key(10, _VARINT)
_P_TRACK_EVENT = _key(11, _LEN)
_P_INTERNED_DATA = _key(12, _LEN)
_P_SEQUENCE_FLAGS = _key(13, _VARINT)
_P_PREVIOUS_DROPPED = _key(42, _VARINT)
_P_DEFAULTS = _key(59, _LEN)
_P_TRACK_DESCRIPTOR = _key(60, _LEN)
_P_FIRST_ON_SEQUENCE = _key(87, _VARINT)
_SEQ_INCREMENTAL_STATE_CLEARED = 1
_SEQ_NEEDS_INCREMENTAL_STATE = 2
# TracePacketDefaults
_D_TIMESTAMP_CLOCK_ID = _key(58, _VARINT)
# ClockSnapshot, ClockSnapshot.Clock
_CS_CLOCKS = _key(1, _LEN)
_CS_PRIMARY_TRACE_CLOCK = _key(2, _VARINT)
_C_CLOCK_ID = _key(1, _VARINT)
_C_TIMESTAMP = _key(2, _VARINT)
_CLOCK_REALTIME = 1  # BuiltinClock
_CLOCK_MONOTONIC = 3
# TrackDescriptor, ProcessDescriptor, ThreadDescriptor
_TD_UUID = _key(1, _VARINT)
_TD_PROCESS = _key(3, _LEN)
_TD_THREAD = _key(4, _LEN)
_TD_PARENT_UUID = _key(5, _VARINT)
_PD_PID = _key(1, _VARINT)
_PD_CMDLINE = _key(2, _LEN)
_PD_PROCESS_NAME = _key(6, _LEN)
_THD_PID = _key(1, _VARINT)
_THD_TID = _key(2, _VARINT)
_THD_THREAD_NAME = _key(5, _LEN)
# TrackEvent
_TE_DEBUG_ANNOTATIONS = _key(4, _LEN)
_TE_TYPE = _key(9, _VARINT)
_TE_NAME_IID = _key(10, _VARINT)
_TE_TRACK_UUID = _key(11, _VARINT)
# DebugAnnotation
_DA_NAME_IID = _key(1, _VARINT)
_DA_BOOL = _key(2, _VARINT)
_DA_UINT = _key(3, _VARINT)
_DA_INT = _key(4, _VARINT)
_DA_DOUBLE = _key(5, _FIXED64)
_DA_STRING = _key(6, _LEN)
# InternedData, EventName, DebugAnnotationName
_ID_EVENT_NAMES = _key(2, _LEN)
_ID_ANNOTATION_NAMES = _key(3, _LEN)
_IID = _key(1, _VARINT)
_IID_NAME = _key(2, _LEN)

_DOUBLE = struct.Struct("<d")
_SEQUENCE_ID = 1
_PROCESS_UUID = 0x7265746870726F63  # arbitrary, unique within the file
_THREAD_UUID_BASE = 0x7265746874687200

#: Bytes every event packet carries: its sequence, which needs the interned names.
_EVENT_PACKET_HEAD = (_P_SEQUENCE_ID + _varint(_SEQUENCE_ID)
                      + _P_SEQUENCE_FLAGS + _varint(_SEQ_NEEDS_INCREMENTAL_STATE))

_TYPES = {kind: _TE_TYPE + _varint(kind) for kind in (SLICE_BEGIN, SLICE_END, INSTANT)}


def _annotation_value(value: Any) -> bytes:
    if isinstance(value, bool):
        return _DA_BOOL + _SMALL[value]
    if isinstance(value, int):
        if -(1 << 63) <= value < (1 << 63):
            return _DA_INT + _varint(value)
        if 0 <= value <= _MASK64:
            return _DA_UINT + _varint(value)
        return _len(_DA_STRING, str(value).encode())
    if isinstance(value, float):
        return _DA_DOUBLE + _DOUBLE.pack(value)
    return _len(_DA_STRING, _text(value if isinstance(value, str) else repr(value)))


def _int32_id(value: int) -> int:
    """pid/tid fields are int32: keep ids that fit, fold the others into that range."""
    if 0 < value < (1 << 31):
        return value
    return value % ((1 << 31) - 1) + 1


class _Writer:
    """Frames packets into the output, interning event and annotation names."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.buf = bytearray()
        self.packets = 0
        self.names: dict[str, int] = {}
        self.keys: dict[str, int] = {}

    def packet(self, payload: bytes) -> None:
        buf = self.buf
        buf += _TRACE_PACKET
        buf += _varint(len(payload))
        buf += payload
        self.packets += 1
        if len(buf) >= 1 << 20:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            self.out.write(self.buf)
            self.buf = bytearray()

    def event(self, kind: int, ts: int, uuid: int, name: str,
              annotations: tuple[tuple[str, Any], ...]) -> None:
        interned = b""
        event = _TYPES[kind] + _TE_TRACK_UUID + _varint(uuid)
        if kind != SLICE_END:
            iid = self.names.get(name)
            if iid is None:
                iid = self.names[name] = len(self.names) + 1
                interned += _len(_ID_EVENT_NAMES,
                                 _IID + _varint(iid) + _len(_IID_NAME, _text(name)))
            event += _TE_NAME_IID + _varint(iid)
        for key, value in annotations:
            kid = self.keys.get(key)
            if kid is None:
                kid = self.keys[key] = len(self.keys) + 1
                interned += _len(_ID_ANNOTATION_NAMES,
                                 _IID + _varint(kid) + _len(_IID_NAME, _text(key)))
            event += _len(_TE_DEBUG_ANNOTATIONS,
                          _DA_NAME_IID + _varint(kid) + _annotation_value(value))
        packet = _P_TIMESTAMP + _varint(max(0, ts)) + _EVENT_PACKET_HEAD
        if interned:
            packet += _len(_P_INTERNED_DATA, interned)
        self.packet(packet + _len(_P_TRACK_EVENT, event))


def _clock_snapshot(meta: dict[str, Any], t0: int) -> bytes:
    """MONOTONIC as the primary clock; REALTIME too when META holds a pair of readings."""
    clocks = [(_CLOCK_MONOTONIC, t0)]
    pair = meta.get("clock_snapshot")
    if isinstance(pair, dict):
        mono, real = pair.get("monotonic_ns"), pair.get("realtime_ns")
        if isinstance(mono, int) and isinstance(real, int) and mono >= 0 and real >= 0:
            clocks = [(_CLOCK_MONOTONIC, mono), (_CLOCK_REALTIME, real)]
    body = b"".join(_len(_CS_CLOCKS, _C_CLOCK_ID + _varint(cid) + _C_TIMESTAMP + _varint(ts))
                    for cid, ts in clocks)
    return body + _CS_PRIMARY_TRACE_CLOCK + _varint(_CLOCK_MONOTONIC)


def _pid(meta: dict[str, Any], threads: dict[int, str]) -> int:
    """The process id: META's ``pid``, else the main thread's id (Linux: the same)."""
    pid = meta.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool):
        return pid
    for tid, name in threads.items():
        if name == "MainThread":
            return tid
    return min(threads, default=1)


def _argv(value: Any) -> list[str]:
    return [str(a) for a in value] if isinstance(value, list) else []


def _process_uuid(proc_pid: int, main_pid: int) -> int:
    """The recording process keeps the one uuid; every other process gets its own."""
    return _PROCESS_UUID if proc_pid == main_pid else _PROCESS_UUID + 1 + proc_pid


def _first_timestamp(reader: TraceReader) -> int:
    for ev in reader.ordered_events():
        return ev[1]
    return 0


def write_perfetto(reader: TraceReader, out: BinaryIO) -> int:
    """Write the trace ``reader`` holds to ``out`` as a Perfetto protobuf trace.

    Returns the number of packets written (descriptors and clock included)."""
    meta = dict(reader.meta)
    names = dict(reader.threads)
    w = _Writer(out)
    pid = _int32_id(_pid(meta, names))
    t0 = _first_timestamp(reader)

    # the clock first: trace_processor fixes the trace's clock domain on first use
    w.packet(_len(_P_CLOCK_SNAPSHOT, _clock_snapshot(meta, t0)))
    # one process track per process (a trace of several processes: PROC sections)
    procs: dict[int, list[str]] = {pid: _argv(meta.get("argv"))}
    for other, info in reader.processes.items():
        procs.setdefault(_int32_id(other), _argv(info.get("argv")))
    thread_pids = {tid: _int32_id(p) for tid, p in reader.thread_pids.items() if p is not None}
    first = True
    for proc_pid, argv in procs.items():
        pname = (os.path.basename(argv[0]) if argv and argv[0] != "-c" else
                 f"rethook {meta.get('tracer', 'trace')}") if proc_pid == pid else \
            (os.path.basename(argv[0]) if argv and argv[0] != "-c" else f"python {proc_pid}")
        process = _PD_PID + _varint(proc_pid) + _len(_PD_PROCESS_NAME, _text(pname))
        process += b"".join(_len(_PD_CMDLINE, _text(a)) for a in argv)
        head = (_P_SEQUENCE_ID + _varint(_SEQUENCE_ID)
                + _P_SEQUENCE_FLAGS + _varint(_SEQ_INCREMENTAL_STATE_CLEARED)
                + _P_FIRST_ON_SEQUENCE + b"\x01" + _P_PREVIOUS_DROPPED + b"\x01"
                + _len(_P_DEFAULTS, _D_TIMESTAMP_CLOCK_ID + _varint(_CLOCK_MONOTONIC))
                ) if first else _P_SEQUENCE_ID + _varint(_SEQUENCE_ID)
        first = False
        w.packet(head + _len(_P_TRACK_DESCRIPTOR, _TD_UUID + _varint(_process_uuid(proc_pid, pid))
                             + _len(_TD_PROCESS, process)))

    tracks: dict[int, int] = {}

    def track(tid: int) -> int:
        uuid = tracks[tid] = _THREAD_UUID_BASE + len(tracks)
        owner = thread_pids.get(tid, pid)
        thread = (_THD_PID + _varint(owner) + _THD_TID + _varint(_int32_id(tid))
                  + _len(_THD_THREAD_NAME, _text(names.get(tid, f"tid-{tid}"))))
        w.packet(_P_SEQUENCE_ID + _varint(_SEQUENCE_ID)
                 + _len(_P_TRACK_DESCRIPTOR, _TD_UUID + _varint(uuid)
                        + _TD_PARENT_UUID + _varint(_process_uuid(owner, pid))
                        + _len(_TD_THREAD, thread)))
        return uuid

    for tid in names:
        track(tid)
    for kind, ts, tid, name, ann in slice_events(reader):
        uuid = tracks.get(tid)
        if uuid is None:
            uuid = track(tid)
        w.event(kind, ts, uuid, name, ann)
    w.flush()
    return w.packets
