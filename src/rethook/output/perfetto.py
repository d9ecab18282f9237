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

The slices are rebuilt by :func:`rethook.output.slices.slice_events`, shared with the other
exports: slices that nest and timestamps that never go back on a thread, whatever the trace
lacks. Calls still open when the trace ends stay open: Perfetto shows them as slices that did
not end. The events are read in time order across threads
(``TraceReader.ordered_events``).
"""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO

from rethook.buffer.traceread import TraceReader
from rethook.output.info import trace_pid
from rethook.output.slices import INSTANT, SLICE_BEGIN, SLICE_END, slice_events

__all__ = ["INSTANT", "SLICE_BEGIN", "SLICE_END", "slice_events", "write_perfetto"]

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
_DA_NAME = _key(10, _LEN)
_DA_DICT_ENTRIES = _key(11, _LEN)
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
    if isinstance(value, dict):  # one nested annotation per item (a call's arguments)
        return b"".join(_len(_DA_DICT_ENTRIES, _len(_DA_NAME, _text(str(k)))
                             + _annotation_value(v)) for k, v in value.items())
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
    pid = _int32_id(trace_pid(meta, names))
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
