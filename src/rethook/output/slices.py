"""The trace as nested slices: what every timeline and stack export is built from.

A function_graph trace records entries, exits, suspensions and resumptions per thread, and
may lack some of them (lost events, an overwriting buffer, ``tracing_thresh``, which records
exits only). :func:`slice_events` turns it into per-thread slices that always nest, with
timestamps that never go back on a thread: what Perfetto, Chrome's trace viewer and speedscope
need, and what call trees, flame graphs and profiles are computed from.

* an exit whose entry the trace lacks still becomes a slice, begun at its ``calltime``;
  finding those exits takes a first pass over the file, so the file is read twice and never
  held in memory (only such exits are remembered between the passes);
* an entry whose exit is missing ends when its thread is next seen at its depth or shallower;
* a generator or coroutine suspension ends its slice and a resumption begins a new one;
* every other event (``function`` tracer calls, stack traces, probe events, lost events) is an
  instant;
* calls still open when the trace ends stay open, or, with ``close_open=True``, end at their
  thread's last timestamp.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from rethook.buffer.events import COMMON_COUNT, EventFormat, Lost
from rethook.buffer.traceread import TraceReader
from rethook.tracers.formats import EXIT_RAISED

FLAG_UNFINISHED = 1  # the engine's flags on funcgraph_exit (rethook.engine.core)
FLAG_CLOSED = 2

# the kinds of the records slice_events yields (the values of Perfetto's TrackEvent.Type)
SLICE_BEGIN = 1
SLICE_END = 2
INSTANT = 3

#: ``(kind, ts_ns, tid, name, annotations)``: one record of :func:`slice_events`.
Record = tuple[int, int, int, str, tuple[tuple[str, Any], ...]]

# how an open slice began
_ENTRY, _RESUMED, _SYNTHETIC = 0, 1, 2
# what an exit closes
_MATCH, _ORPHAN, _DETACHED = 0, 1, 2


def is_graph_trace(reader: TraceReader) -> bool:
    """Whether the trace is function_graph's (its META says so, or its formats do)."""
    tracer = reader.meta.get("tracer")
    if tracer in ("function_graph", "function"):
        return tracer == "function_graph"
    names = {f.name for f in reader.formats}
    return "funcgraph_exit" in names or "funcgraph_entry" in names


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


def slice_events(reader: TraceReader, close_open: bool = False) -> Iterator[Record]:
    """The trace as per-thread nested slices and instants, in file order.

    Yields ``(kind, ts_ns, tid, name, annotations)`` with kind SLICE_BEGIN, SLICE_END or
    INSTANT. Per thread, BEGIN/END pairs nest properly and timestamps never decrease; an END
    closes the latest open BEGIN of its thread (its name repeats that slice's name). A call's
    arguments (funcgraph-args) are the annotation ``args``: a dict, one item per parameter
    (see :func:`split_args`). With ``close_open``, the slices still open when the trace ends
    are ended last, each at its thread's latest timestamp and annotated ``open_at_end``.
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
            yield (SLICE_BEGIN, at(th, ts), tid, func, (("args", split_args(ev[5])),)
                   if ev[5] else ())
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
    if close_open:
        for tid, th in threads.items():
            while th.stack:
                _depth, func, _how = th.stack.pop()
                yield (SLICE_END, th.last, tid, func, _OPEN_AT_END)


_OPEN_AT_END = (("open_at_end", True),)
_OPENERS = {"(": ")", "[": "]", "{": "}"}


def split_args(text: str) -> dict[str, str]:
    """``a=1, b='x, y'`` (funcgraph-args: each parameter's bounded repr) as
    ``{"a": "1", "b": "'x, y'"}``.

    A parameter starts after a ``, `` that is outside quotes and brackets and followed by
    ``NAME=``; a value that starts with ``<`` (``<Foo object at ...>``) also nests its angle
    brackets. Text that does not start with ``NAME=`` comes back as ``{"args": text}``.
    """
    out: dict[str, str] = {}
    n = len(text)
    i = 0
    while i < n:
        eq = text.find("=", i)
        name = text[i:eq]
        if eq < 0 or not name.isidentifier():
            return {"args": text} if not out else {**out, "args": text[i:]}
        j = start = eq + 1
        closers: list[str] = []
        angle = j < n and text[j] == "<"
        quote = ""
        while j < n:
            ch = text[j]
            if quote:
                if ch == "\\":
                    j += 1
                elif ch == quote:
                    quote = ""
            elif ch in "'\"":
                quote = ch
            elif ch in _OPENERS:
                closers.append(_OPENERS[ch])
            elif angle and ch == "<":
                closers.append(">")
            elif closers and ch == closers[-1]:
                closers.pop()
            elif not closers and text.startswith(", ", j) and _names_param(text, j + 2):
                break
            j += 1
        out[name] = text[start:j]
        i = j + 2
    return out


def _names_param(text: str, i: int) -> bool:
    """Whether ``text[i:]`` starts with ``NAME=``."""
    eq = text.find("=", i)
    return eq > i and text[i:eq].isidentifier()
