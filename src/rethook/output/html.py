"""The trace as one self-contained HTML page: timelines, flame graph, icicle, histograms.

:func:`write_html` turns a trace into a single HTML file that needs nothing else to open: the
viewer (``viewer/viewer.js`` and ``viewer/viewer.css`` beside this module, plain JavaScript on
a canvas, written for rethook) and the trace's data are inlined, and the page's Content
Security Policy forbids every network access.

The data is the :class:`View` that :func:`build_view` makes in one pass over
:func:`rethook.output.perfetto.slice_events` (the same rebuilt slices as the Perfetto and
folded-stack exports, so entry-less exits, lost events and coroutines are handled alike). It is
embedded as compact JSON: a string table, and per thread one set of columns per depth (slice
starts as deltas, durations, name and detail indices), never one object per event::

    processes[] -> threads[] -> rows[depth] = {start: [...], dur: [...], name: [...],
                                               info: [...]}
                            -> markers = {ts: [...], name: [...], info: [...], kind: [...]}
    profile = {parent: [...], name: [...], total: [...], count: [...]}   (the call tree)

Slices of one thread at one depth never overlap, so they end in the order they start: a
thread's rows are filled in start order as slice_events closes slices, with no sorting.

**Big traces are aggregated**, so that the page still opens in seconds: the timeline keeps the
``max_slices`` longest calls (a call is dropped only with all its callees, since a callee never
lasts longer than its caller), the markers are thinned to about ``max_markers`` (every k-th),
and the call tree to ``max_nodes`` nodes (the time of a dropped subtree stays in its parent's
self time). The flame graph and the counts always cover every call. What was left out is in
``View.aggregated`` and said on the page; Perfetto (``rethook export --format perfetto``)
shows everything. The timeline's columns stay within about twice those limits whatever the
trace's size (the call tree and the string table grow with distinct stacks and texts).

**Processes.** The model is process -> thread -> slices from the start. A trace's process is
the one that recorded it (pid from META ``pid``); a reader that knows more processes (a trace
of followed children: ``reader.processes``, pid -> its META, and ``reader.thread_pids``,
tid -> pid) puts each thread under its own. :meth:`_Builder.track` is the one place that
assigns a thread to its process.
"""

from __future__ import annotations

import html
import json
import os
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from itertools import compress
from typing import Any, TextIO

from rethook.buffer.traceread import TraceReader
from rethook.output.info import trace_pid
from rethook.output.slices import INSTANT, SLICE_BEGIN, SLICE_END, slice_events

#: Version of the embedded data's layout (viewer.js checks it).
DATA_VERSION = 1

#: Calls the timeline keeps before it aggregates (the longest are kept).
DEFAULT_MAX_SLICES = 400_000
#: Markers (probe events, function calls, instants) the timeline keeps before thinning.
DEFAULT_MAX_MARKERS = 200_000
#: Nodes of the call tree (flame graph, icicle) kept before the smallest are folded.
DEFAULT_MAX_NODES = 100_000

#: What a marker stands for, by its kind number (the page carries this list to the viewer):
#: ``event`` a probe event, stack trace or message (any non-graph event); ``call`` a function
#: tracer call; ``lost`` lost events; ``graph`` a graph instant (a suspension with no open
#: slice, a call closed while suspended).
MARKER_KINDS = ("event", "call", "lost", "graph")
MARK_EVENT, MARK_CALL, MARK_LOST, MARK_GRAPH = (MARKER_KINDS.index(k) for k in MARKER_KINDS)

# the call tree's unit: graph traces weigh calls by time, function traces by count
UNIT_NS = "ns"
UNIT_CALLS = "calls"

_VIEWER = "viewer"
_NAME_KEY = 32  # a call-tree node's child key: parent << _NAME_KEY | name


# -- strings ------------------------------------------------------------------------------


class _Strings:
    """The page's string table: every name and detail text, once."""

    __slots__ = ("ids", "table")

    def __init__(self) -> None:
        self.table: list[str] = []
        self.ids: dict[str, int] = {}

    def id(self, text: str) -> int:
        sid = self.ids.get(text)
        if sid is None:
            sid = self.ids[text] = len(self.table)
            self.table.append(text)
        return sid


def _value_text(value: Any) -> str:
    if isinstance(value, dict):  # a call's arguments, one item per parameter
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return value if isinstance(value, str) else repr(value)


def _hashable(ann: tuple[tuple[str, Any], ...]) -> tuple:
    """Annotations as a dict key (a call's arguments are a dict: its items instead)."""
    return tuple((k, tuple(v.items()) if isinstance(v, dict) else v) for k, v in ann)


def _details(ann: tuple[tuple[str, Any], ...]) -> str:
    """A slice's or marker's annotations as lines: ``key: value``, or ``key`` for flags."""
    return "\n".join(key if value is True else f"{key}: {_value_text(value)}"
                     for key, value in ann)


# -- the call tree -------------------------------------------------------------------------


class _Tree:
    """The merged call tree: one node per distinct stack, root 0.

    Nodes are numbered as they are made, so a parent's number is below its children's.
    ``own`` is what was recorded at the node itself: inclusive time for graph traces (a call
    lasts at least as long as its callees), a count of calls for function traces."""

    __slots__ = ("parent", "name", "own", "count", "children")

    def __init__(self, root_name: int) -> None:
        self.parent = array("q", [-1])
        self.name = array("q", [root_name])
        self.own = array("q", [0])
        self.count = array("q", [0])
        self.children: dict[int, int] = {}

    def child(self, parent: int, name: int) -> int:
        key = parent << _NAME_KEY | name
        node = self.children.get(key)
        if node is None:
            node = self.children[key] = len(self.parent)
            self.parent.append(parent)
            self.name.append(name)
            self.own.append(0)
            self.count.append(0)
        return node

    def totals(self, inclusive: bool) -> array:
        """Each node's total: its own value when inclusive, else own plus its children's;
        structural nodes (process, thread) always sum their children."""
        parent, own = self.parent, self.own
        total = array("q", own)
        below = array("q", bytes(8 * len(own)))
        for node in range(len(own) - 1, 0, -1):
            if not inclusive or total[node] == 0:
                total[node] += below[node]
            below[parent[node]] += total[node]
        total[0] = below[0]
        return total

    def pruned(self, total: array, max_nodes: int) -> tuple[list[int], int]:
        """The nodes to keep (ancestors before descendants) and the smallest total kept."""
        n = len(total)
        if n <= max_nodes:
            return list(range(n)), 0
        floor = sorted(total, reverse=True)[max_nodes - 1] + 1  # keep totals >= floor
        keep = [node for node in range(n) if total[node] >= floor or node == 0]
        return keep, floor


# -- the view ------------------------------------------------------------------------------


class _Row:
    """One depth of one thread: its slices in start order, each four numbers in one array
    (one ``extend`` a slice): start, duration, name's string id, details' string id + 1 (0 for
    none)."""

    __slots__ = ("cols",)
    WIDTH = 4
    START, DUR, NAME, INFO = range(WIDTH)

    def __init__(self) -> None:
        self.cols = array("q")

    def column(self, k: int) -> array:
        return self.cols[k::self.WIDTH]

    def __len__(self) -> int:
        return len(self.cols) // self.WIDTH

    def keep_longer(self, threshold: int) -> None:
        """Drop the slices that last ``threshold`` ns or less."""
        mask = [d > threshold for d in self.column(self.DUR) for _ in range(self.WIDTH)]
        self.cols = array("q", compress(self.cols, mask))


class _Track:
    """One thread: its rows, open slices, markers and counts."""

    __slots__ = ("pid", "tid", "node", "rows", "stack", "slices", "markers", "marker_count",
                 "lost", "last")

    def __init__(self, pid: int, tid: int, node: int) -> None:
        self.pid = pid
        self.tid = tid
        self.node = node  # its call-tree node
        self.rows: list[_Row] = []
        self.stack: list[tuple] = []  # open slices: (begin, name id, entry annotations, node)
        self.slices = 0  # every slice of the thread, kept on the timeline or not
        self.markers = (array("q"), array("q"), array("q"), array("q"))  # ts, name, info, kind
        self.marker_count = 0
        self.lost = 0
        self.last = 0


@dataclass
class View:
    """What the page shows, ready to embed (:meth:`data`), and what was left out."""

    data: dict[str, Any]
    slices: int  # calls in the trace
    slices_shown: int  # calls on the timeline
    markers: int
    markers_shown: int
    aggregated: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """One line for the command line: what the page holds, and what it left out."""
        parts = [f"{self.slices_shown:,} calls"] if self.slices or not self.markers else []
        if self.markers:
            parts.append(f"{self.markers_shown:,} markers")
        return " and ".join(parts)

    def notes(self) -> list[str]:
        """What aggregation left out, one sentence each (empty when nothing was)."""
        return list(self.data["aggregated"].get("notes", []))


class _Builder:
    def __init__(self, reader: TraceReader, max_slices: int, max_markers: int) -> None:
        self.meta = reader.all_meta
        self.thread_names = dict(reader.threads)
        self.strings = _Strings()
        self.max_slices = max_slices
        self.max_markers = max_markers
        self.threshold = -1  # slices kept on the timeline last longer than this (ns)
        self.kept = 0  # slices on the timeline now
        self.marker_stride = 1  # keep every marker_stride-th marker
        self.markers_seen = 0
        self.markers_kept = 0  # markers on the timeline now
        self.tracks: dict[tuple[int, int], _Track] = {}
        self.processes: dict[int, int] = {}  # pid -> call-tree node
        self.tree = _Tree(self.strings.id("all"))
        self.pid = trace_pid(self.meta, self.thread_names)  # as the Perfetto export names it
        # the processes of a trace of several (none known: every thread is self.pid's)
        self.process_meta: dict[int, Any] = dict(getattr(reader, "processes", None) or {})
        self.thread_pids: dict[int, int | None] = dict(getattr(reader, "thread_pids", None)
                                                       or {})
        self.function_trace = self.meta.get("tracer") == "function"
        self.t0: int | None = None
        self.t1 = 0
        self.damage: Exception | None = None  # where a damaged file stopped the reading
        self.details: dict[tuple, int] = {}  # (entry, exit annotations) -> details' id + 1

    # -- processes and threads (the seam for per-process traces) --

    def argv(self, pid: int) -> list[str]:
        meta = self.meta if pid == self.pid else self.process_meta.get(pid)
        argv = meta.get("argv") if isinstance(meta, dict) else None
        return [str(a) for a in argv] if isinstance(argv, list) else []

    def process_name(self, pid: int) -> str:
        argv = self.argv(pid)
        if argv and argv[0] != "-c":
            return f"{os.path.basename(argv[0])} (pid {pid})"
        return f"python (pid {pid})" if argv else f"pid {pid}"

    def track(self, tid: int) -> _Track:
        """The track of thread ``tid``, under its process (the recording process unless the
        reader says otherwise)."""
        pid = self.thread_pids.get(tid) or self.pid
        tr = self.tracks.get((pid, tid))
        if tr is None:
            pnode = self.processes.get(pid)
            if pnode is None:
                pnode = self.processes[pid] = self.tree.child(
                    0, self.strings.id(self.process_name(pid)))
            name = self.thread_names.get(tid, f"tid-{tid}")
            node = self.tree.child(pnode, self.strings.id(f"{name} ({tid})"))
            tr = self.tracks[(pid, tid)] = _Track(pid, tid, node)
        return tr

    # -- records --

    def feed(self, records: Iterable[tuple]) -> None:
        """Take in slice_events' records. The loop is the builder's hot path (one pass per
        record of the trace): lookups of names and call-tree nodes are inlined."""
        begin, end, instant = SLICE_BEGIN, SLICE_END, INSTANT
        sid, ids = self.strings.id, self.strings.ids
        tree = self.tree
        nodes, child = tree.children, tree.child
        tracks: dict[int, _Track] = {}
        t0 = None
        ts = 0
        for kind, ts, tid, name, ann in records:
            if t0 is None:
                t0 = ts
            tr = tracks.get(tid)
            if tr is None:
                tr = tracks[tid] = self.track(tid)
            tr.last = ts
            if kind == begin:
                stack = tr.stack
                name_id = ids.get(name)
                if name_id is None:
                    name_id = sid(name)
                parent = stack[-1][3] if stack else tr.node
                node = nodes.get(parent << _NAME_KEY | name_id)
                if node is None:
                    node = child(parent, name_id)
                stack.append((ts, name_id, ann, node))
            elif kind == end:
                self.close(tr, ts, ann)
            elif kind == instant:
                self.instant(tr, ts, name, ann)
        self.t0 = t0 if t0 is not None else 0
        self.t1 = ts
        for tr in self.tracks.values():  # calls still running when the trace ends
            while tr.stack:
                self.close(tr, tr.last, (("running at the end of the trace", True),))

    def close(self, tr: _Track, ts: int, ann: tuple[tuple[str, Any], ...]) -> None:
        begin, name_id, begin_ann, node = tr.stack.pop()
        dur = ts - begin
        tree = self.tree
        tree.own[node] += dur
        tree.count[node] += 1
        tr.slices += 1
        if dur <= self.threshold:
            return
        info = 0
        if ann or begin_ann:  # the details of the entry, then those of the exit
            key = (_hashable(begin_ann), _hashable(ann))
            info = self.details.get(key, 0)
            if not info:
                info = self.details[key] = self.strings.id(_details(begin_ann + ann)) + 1
        depth = len(tr.stack)
        rows = tr.rows
        while len(rows) <= depth:
            rows.append(_Row())
        rows[depth].cols.extend((begin, dur, name_id, info))
        self.kept += 1
        if self.kept > 2 * self.max_slices:
            self.compact(self.max_slices)

    def compact(self, keep: int) -> None:
        """Keep only the ``keep`` longest slices (ties dropped together)."""
        durs = sorted((d for tr in self.tracks.values() for row in tr.rows
                       for d in row.column(_Row.DUR)), reverse=True)
        if len(durs) <= keep:
            return
        self.threshold = max(self.threshold, durs[keep - 1])
        self.kept = 0
        for tr in self.tracks.values():
            for row in tr.rows:
                row.keep_longer(self.threshold)
                self.kept += len(row)

    def instant(self, tr: _Track, ts: int, name: str, ann: tuple[tuple[str, Any], ...]) -> None:
        if name.startswith("lost ") and ann and ann[0][0] == "count":
            kind = MARK_LOST
            tr.lost += ann[0][1]
        elif self.function_trace:
            kind = MARK_CALL
            self.call(tr, name, ann)
        elif any(key in ("suspended", "while_suspended") for key, _ in ann):
            kind = MARK_GRAPH
        else:
            kind = MARK_EVENT
        tr.marker_count += 1
        if kind != MARK_LOST:  # lost markers are few and always shown
            self.markers_seen += 1
            if self.markers_seen % self.marker_stride:
                return
        sid = self.strings.id
        ts_col, name_col, info_col, kind_col = tr.markers
        ts_col.append(ts)
        name_col.append(sid(name))
        info_col.append(sid(_details(ann)) + 1 if ann else 0)
        kind_col.append(kind)
        self.markers_kept += 1
        if self.markers_kept > 2 * self.max_markers:
            self.thin()

    def thin(self) -> None:
        """Keep every other marker (lost markers stay), from here on every 2k-th."""
        self.marker_stride *= 2
        self.markers_kept = 0
        for tr in self.tracks.values():
            kinds = tr.markers[3]
            mask = [kind == MARK_LOST or i % 2 == 0 for i, kind in enumerate(kinds)]
            tr.markers = tuple(array("q", compress(col, mask)) for col in tr.markers)
            self.markers_kept += len(tr.markers[0])

    def call(self, tr: _Track, func: str, ann: tuple[tuple[str, Any], ...]) -> None:
        """A function tracer call: counted under its caller in the call tree."""
        sid, tree = self.strings.id, self.tree
        parent = tr.node
        caller = dict(ann).get("parent")
        if caller:
            parent = tree.child(parent, sid(_value_text(caller)))
        node = tree.child(parent, sid(func))
        tree.own[node] += 1
        tree.count[node] += 1

    # -- the page's data --

    def data(self, max_nodes: int) -> View:
        if self.kept > self.max_slices:
            self.compact(self.max_slices)
        t0 = self.t0 or 0
        processes: dict[int, dict[str, Any]] = {}
        slices = shown = markers = markers_shown = 0
        for (pid, tid), tr in self.tracks.items():
            proc = processes.get(pid)
            if proc is None:
                proc = processes[pid] = self.process(pid)
            rows = []
            for row in tr.rows:
                start = [s - t0 for s in row.column(_Row.START)]
                rows.append({"start": [b - a for a, b in zip([0, *start], start, strict=False)],
                             "dur": row.column(_Row.DUR).tolist(),
                             "name": row.column(_Row.NAME).tolist(),
                             "info": row.column(_Row.INFO).tolist()})
                shown += len(row)
            while rows and not rows[-1]["dur"]:
                rows.pop()
            ts_col, name_col, info_col, kind_col = tr.markers
            mts = [t - t0 for t in ts_col]
            proc["threads"].append({
                "tid": tid,
                "name": self.strings.id(self.thread_names.get(tid, f"tid-{tid}")),
                "slices": tr.slices,
                "rows": rows,
                "markerCount": tr.marker_count,
                "markers": {"ts": [b - a for a, b in zip([0, *mts], mts, strict=False)],
                            "name": name_col.tolist(), "info": info_col.tolist(),
                            "kind": kind_col.tolist()},
                "lost": tr.lost,
            })
            slices += tr.slices
            markers += tr.marker_count
            markers_shown += len(ts_col)
        profile, profile_note = self.profile(max_nodes)
        notes = []
        if shown < slices:
            notes.append(f"the timeline shows the {shown:,} longest of {slices:,} calls "
                         f"(calls of {_duration(self.threshold)} or less are left out); "
                         "the flame graph and the icicle count every call")
        if markers_shown < markers:
            notes.append(f"the timeline shows {markers_shown:,} of {markers:,} markers "
                         f"(one event in {self.marker_stride:,})")
        if profile_note:
            notes.append(profile_note)
        aggregated: dict[str, Any] = {}
        if notes:
            aggregated = {"notes": notes, "minDuration": max(self.threshold, 0),
                          "markerStride": self.marker_stride}
        data = {
            "version": DATA_VERSION,
            "title": self.title(),
            "meta": {k: v for k, v in self.meta.items() if k != "histograms"},
            "t0": t0,
            "duration": max(0, self.t1 - t0),
            "processes": list(processes.values()),
            "profile": profile,
            "markerKinds": list(MARKER_KINDS),
            "histograms": _histograms(self.meta.get("histograms")),
            "aggregated": aggregated,
            "damage": str(self.damage) if self.damage is not None else None,
            "strings": self.strings.table,
        }
        if aggregated:  # what was left out may leave strings nothing refers to
            _drop_unused_strings(data)
        return View(data, slices, shown, markers, markers_shown, aggregated)

    def process(self, pid: int) -> dict[str, Any]:
        return {"pid": pid, "name": self.strings.id(self.process_name(pid)),
                "cmdline": self.argv(pid), "threads": []}

    def title(self) -> str:
        argv = self.meta.get("argv")
        if isinstance(argv, list) and argv:
            return " ".join(str(a) for a in argv)
        return os.path.basename(str(self.meta.get("tracer", "trace")))

    def profile(self, max_nodes: int) -> tuple[dict[str, Any], str]:
        tree = self.tree
        total = tree.totals(inclusive=not self.function_trace)
        keep, floor = tree.pruned(total, max_nodes)
        index = {node: i for i, node in enumerate(keep)}
        note = ""
        if floor:
            note = (f"the flame graph folds {len(total) - len(keep):,} of {len(total):,} "
                    f"stacks smaller than {_value(floor, self.function_trace)} into their "
                    "callers' self time")
        return {
            "unit": UNIT_CALLS if self.function_trace else UNIT_NS,
            "parent": [index.get(tree.parent[node], -1) for node in keep],
            "name": [tree.name[node] for node in keep],
            "total": [total[node] for node in keep],
            "count": [tree.count[node] for node in keep],
        }, note


def _drop_unused_strings(data: dict[str, Any]) -> None:
    """Renumber the string table of the page's ``data`` to the strings it uses."""
    threads = [th for proc in data["processes"] for th in proc["threads"]]
    columns = [data["profile"]["name"]]  # every column of string ids
    details = []  # every column of string ids + 1 (0: none)
    for th in threads:
        columns += [row["name"] for row in th["rows"]] + [th["markers"]["name"]]
        details += [row["info"] for row in th["rows"]] + [th["markers"]["info"]]
    used = {proc["name"] for proc in data["processes"]} | {th["name"] for th in threads}
    for col in columns:
        used.update(col)
    for col in details:
        used.update(i - 1 for i in col if i)
    table = data["strings"]
    if len(used) == len(table):
        return
    order = sorted(used)
    new = {old: i for i, old in enumerate(order)}
    data["strings"] = [table[i] for i in order]
    for proc in data["processes"]:
        proc["name"] = new[proc["name"]]
    for th in threads:
        th["name"] = new[th["name"]]
    for col in columns:
        col[:] = [new[i] for i in col]
    for col in details:
        col[:] = [new[i - 1] + 1 if i else 0 for i in col]


def _duration(ns: int) -> str:
    if ns < 1000:
        return f"{ns} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.3g} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e9:.3g} s"


def _value(v: int, calls: bool) -> str:
    return f"{v:,} calls" if calls else _duration(v)


# -- histograms ------------------------------------------------------------------------------

_HIST_PAIR = re.compile(r"([A-Za-z_][\w.]*):\s+(\S+)")
_HIST_TOTAL = re.compile(r"^\s+(Hits|Entries|Dropped):\s+(\d+)\s*$")


def _hist_section(text: str) -> dict[str, Any]:
    """One trigger's section of a ``hist`` file (probes.hist renders it): its entries as
    ``[keys, hitcount, vals...]`` rows, the names of the vals, and the totals."""
    trigger = ""
    rows: list[list[Any]] = []
    vals: list[str] = []
    totals: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("# trigger info: "):
            trigger = line[len("# trigger info: "):]
        elif line.startswith("{"):
            close = line.rfind("} hitcount:")
            if close < 0:
                continue
            keys = re.sub(r"\s{2,}", " ", line[1:close].strip())
            pairs = _HIST_PAIR.findall(line[close + 1:])
            if not pairs or pairs[0][0] != "hitcount":
                continue
            if not vals:
                vals = [name for name, _ in pairs[1:]]
            rows.append([keys, *(_number(v) for _, v in pairs)])
        else:
            m = _HIST_TOTAL.match(line)
            if m:
                totals[m.group(1).lower()] = int(m.group(2))
    return {"trigger": trigger, "vals": vals, "rows": rows, "totals": totals}


def _number(text: str) -> int | float | str:
    for conv in (int, lambda t: int(t, 16), float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _histograms(hists: Any) -> list[dict[str, Any]]:
    """META ``histograms`` (event name -> the text of its hist file) for the page: the raw
    text, and each section parsed for the bar charts."""
    if not isinstance(hists, dict):
        return []
    out = []
    for event in sorted(hists):
        text = hists[event]
        if not isinstance(text, str):
            continue
        sections = [_hist_section(part) for part in re.split(r"\n(?=# event histogram)", text)
                    if part.strip()]
        out.append({"event": str(event), "text": text, "sections": sections})
    return out


# -- the page ------------------------------------------------------------------------------


def build_view(reader: TraceReader, *, max_slices: int = DEFAULT_MAX_SLICES,
               max_markers: int = DEFAULT_MAX_MARKERS,
               max_nodes: int = DEFAULT_MAX_NODES) -> View:
    """Read the trace once and make the page's data (aggregated past the limits). A reader
    opened with ``strict=False`` on a damaged file gives a page of what precedes the damage,
    which the page names."""
    if max_slices < 1 or max_markers < 1 or max_nodes < 2:
        raise ValueError("max_slices and max_markers must be >= 1, max_nodes >= 2")
    builder = _Builder(reader, max_slices, max_markers)
    builder.feed(slice_events(reader))
    builder.damage = reader.damage  # a reader opened with strict=False stops at damage
    return builder.data(max_nodes)


def _asset(name: str) -> str:
    return resources.files("rethook.output").joinpath(_VIEWER, name).read_text("utf-8")


def _inline(name: str, element: str) -> str:
    """A viewer file's text, checked to be safe inside an HTML ``element``."""
    text = _asset(name)
    if f"</{element}" in text.lower() or "<!--" in text:
        raise ValueError(f"{name} cannot be inlined in a <{element}> element")
    return text


def page(view: View) -> str:
    """The HTML page showing ``view``: the viewer and the data inlined, nothing fetched."""
    template = _asset("viewer.html")
    # Every '<' of the JSON is escaped, so no text in the trace can end the script element.
    data = json.dumps(view.data, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).replace("<", "\\u003c")
    parts = {
        "{{title}}": html.escape(f"rethook: {view.data['title']}"),
        "{{style}}": _inline("viewer.css", "style"),
        "{{script}}": _inline("viewer.js", "script"),
    }
    for marker, text in parts.items():
        template = template.replace(marker, text)
    head, _, tail = template.partition("{{data}}")
    return head + data + tail


def write_html(reader: TraceReader, out: TextIO, **limits: int) -> View:
    """Write the trace ``reader`` holds to ``out`` as a self-contained HTML page; returns the
    :class:`View` (what it shows, what it aggregated). ``limits``: ``max_slices``,
    ``max_markers``, ``max_nodes`` (see :func:`build_view`)."""
    view = build_view(reader, **limits)
    out.write(page(view))
    return view
