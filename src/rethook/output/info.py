"""What a trace file says about itself: the recording's metadata, and counts from one pass.

:func:`trace_info` reads a trace once (every event decoded) and returns a :class:`TraceInfo`:
META (tracer, options, command line, filters, probe events, clock, versions), the threads
with their events, lost events and time span, the events per format, and the file's size and
state. ``rethook info`` prints it; other views take what they need (the HTML view's header).

The small helpers the exporters share live here too: the process id a trace was recorded in
(:func:`trace_pid`), the source location of its functions (:func:`function_locations`, from
META ``functions``) and the name of a thread's root frame in per-thread stacks
(:func:`thread_frame`).
"""

from __future__ import annotations

import os
from typing import Any

from rethook.buffer.events import Lost
from rethook.buffer.traceread import TraceReader
from rethook.frozen import Fields, Frozen


def trace_pid(meta: dict[str, Any], threads: dict[int, str]) -> int:
    """The process id: META's ``pid``, else the main thread's id (Linux: the same)."""
    pid = meta.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool):
        return pid
    for tid, name in threads.items():
        if name == "MainThread":
            return tid
    return min(threads, default=1)


def thread_frame(name: str, pid: int, tid: int) -> str:
    """``name-pid/tid``: a thread as the root frame of its stacks (the convention of
    stackcollapse-perf.pl --tid, where the name is the thread's comm)."""
    return f"{name}-{pid}/{tid}"


class Location(Frozen):
    """Where a function is defined."""

    __slots__ = ("file", "line", "qualname")

    def __init__(self, file: str, line: int, qualname: str) -> None:
        object.__setattr__(self, "file", file)
        object.__setattr__(self, "line", line)
        object.__setattr__(self, "qualname", qualname)


def function_locations(meta: dict[str, Any]) -> dict[str, Location]:
    """META ``functions`` (``{name: [file, line, qualname]}``, written by ``rethook record``
    for the functions a trace names) as Locations; entries of another shape are skipped."""
    raw = meta.get("functions")
    out: dict[str, Location] = {}
    if not isinstance(raw, dict):
        return out
    for name, loc in raw.items():
        if (isinstance(loc, list) and len(loc) == 3 and isinstance(loc[0], str)
                and isinstance(loc[1], int) and isinstance(loc[2], str)):
            out[name] = Location(*loc)
    return out


class ThreadInfo(Fields):
    """One thread of a trace: ``pid`` the process it belongs to, ``lost`` the events
    dropped (as the LOST markers in the file count them), its first and last timestamps."""

    __slots__ = ("tid", "name", "pid", "events", "lost", "first_ns", "last_ns")

    def __init__(self, tid: int, name: str, pid: int = 0, events: int = 0, lost: int = 0,
                 first_ns: int | None = None, last_ns: int | None = None) -> None:
        self.tid, self.name, self.pid, self.events, self.lost = tid, name, pid, events, lost
        self.first_ns, self.last_ns = first_ns, last_ns


class TraceInfo(Fields):
    """One trace file, summarised: ``complete`` if the file ends with its END chunk,
    ``damage`` what stopped the reading (a damaged file), ``stats`` the STAT chunk's counts,
    ``processes`` every process by pid (the recording one first), as TraceReader.processes
    gives them."""

    __slots__ = ("path", "size", "version", "complete", "damage", "meta", "pid", "threads",
                 "events_by_format", "stats", "processes")

    def __init__(self, path: str, size: int, version: tuple[int, int], complete: bool,
                 damage: str | None, meta: dict[str, Any], pid: int,
                 threads: dict[int, ThreadInfo] | None = None,
                 events_by_format: dict[str, int] | None = None,
                 stats: dict[int, dict[str, Any]] | None = None,
                 processes: dict[int, dict[str, Any]] | None = None) -> None:
        self.path, self.size, self.version, self.complete = path, size, version, complete
        self.damage, self.meta, self.pid = damage, meta, pid
        self.threads: dict[int, ThreadInfo] = threads if threads is not None else {}
        self.events_by_format: dict[str, int] = (events_by_format
                                                 if events_by_format is not None else {})
        self.stats: dict[int, dict[str, Any]] = stats if stats is not None else {}
        self.processes: dict[int, dict[str, Any]] = processes if processes is not None else {}

    @property
    def events(self) -> int:
        return sum(self.events_by_format.values())

    @property
    def lost(self) -> int:
        return sum(t.lost for t in self.threads.values())

    @property
    def span_ns(self) -> tuple[int, int] | None:
        """The first and last event's timestamps, or None without events."""
        firsts = [t.first_ns for t in self.threads.values() if t.first_ns is not None]
        lasts = [t.last_ns for t in self.threads.values() if t.last_ns is not None]
        return (min(firsts), max(lasts)) if firsts else None


def trace_info(reader: TraceReader) -> TraceInfo:
    """Read the whole trace once and summarise it. With a reader that is not strict, a
    damaged file is summarised up to the damage (``damage`` says where)."""
    counts: dict[int, int] = {}
    threads: dict[int, ThreadInfo] = {}
    for ev in reader.events(lost=True):
        if isinstance(ev, Lost):
            th = threads.get(ev.tid) or threads.setdefault(ev.tid, ThreadInfo(ev.tid, ""))
            th.lost += ev.count
            continue
        fid, ts, tid = ev[0], ev[1], ev[2]
        counts[fid] = counts.get(fid, 0) + 1
        th = threads.get(tid)
        if th is None:
            th = threads[tid] = ThreadInfo(tid, "")
        th.events += 1
        if th.first_ns is None or ts < th.first_ns:
            th.first_ns = ts
        if th.last_ns is None or ts > th.last_ns:
            th.last_ns = ts
    names = reader.threads
    meta = reader.all_meta
    stats = reader.stats
    formats = reader.formats
    for tid, name in names.items():
        threads.setdefault(tid, ThreadInfo(tid, name)).name = name
    pid = trace_pid(meta, names)
    pids = reader.thread_pids
    for th in threads.values():
        th.pid = pids.get(th.tid, pid)
    processes = dict(reader.processes) or {pid: {}}
    by_format = {}
    for fid, n in sorted(counts.items()):
        fmt = formats.get(fid)
        by_format[fmt.name if fmt is not None else f"format {fid}"] = n
    damage = reader.damage
    try:
        size = os.path.getsize(reader.path)
    except (OSError, TypeError):
        size = 0
    return TraceInfo(
        path=str(reader.path), size=size, version=reader.version,
        complete=damage is None, damage=str(damage) if damage is not None else None,
        meta=dict(meta), pid=pid, processes=processes,
        threads=dict(sorted(threads.items(), key=lambda kv: (kv[1].first_ns is None,
                                                              kv[1].first_ns or 0, kv[0]))),
        events_by_format=by_format, stats=dict(stats))
