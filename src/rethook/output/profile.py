"""The profile as people read it: the profiler's table, and pstats files.

The numbers are :class:`~rethook.tracers.profiler.FunctionStat` rows: from the function
profiler of a run (``rethook profile``), or from a recorded function_graph trace
(:func:`profile_of_trace`). This module sorts them, cuts them to the top N, and writes them:

* :func:`render_table`: the plain text table, the kernel's ``trace_stat`` layout with the
  columns a cProfile user expects: Function, Hit, Total, Self, Avg, s^2, File:Line.

  Total is a function's inclusive time with recursion counted once (cProfile's cumtime), Self
  its time minus its children's (tottime), Avg and s^2 the mean and variance of one call's
  time as the kernel's profiler has them: inclusive, or self time with ``-O nograph-time``.
  Times are in the kernel's duration format.
* :func:`rich_table`: the same rows as a ``rich`` table, for terminals.
* :func:`write_pstats`: the ``marshal``-ed dict that :mod:`pstats`, snakeviz and gprof2dot
  read (cProfile's layout: ``{(file, line, func): (prim, calls, self_s, total_s, callers)}``,
  callers ``{(file, line, func): (calls, prim, self_s, total_s)}``).
"""

from __future__ import annotations

import marshal
import os
from collections.abc import Callable, Iterable
from typing import IO, Any

from rethook.buffer.traceread import TraceReader
from rethook.output.durations import MARK_STYLES, graph_duration, mark
from rethook.output.info import Location, function_locations
from rethook.output.slices import SLICE_BEGIN, SLICE_END, Record, slice_events
from rethook.tracers.profiler import FunctionStat, ProfileThread, merge_stats

#: ``--sort`` keys: the column names, and cProfile's names for the same columns. Numbers
#: sort largest first, names and places in alphabetical order.
SORT_KEYS: dict[str, tuple[str, Callable[[FunctionStat], Any]]] = {}


def _sort_key(column: str, key: Callable[[FunctionStat], Any], *names: str) -> None:
    for name in (column, *names):
        SORT_KEYS[name] = (column, key)


_sort_key("hit", lambda s: -s.hit, "calls", "ncalls")
_sort_key("total", lambda s: -s.total_ns, "cumtime", "cumulative")
_sort_key("self", lambda s: -s.self_ns, "tottime")
_sort_key("avg", lambda s: -s.avg_ns)
_sort_key("s2", lambda s: -s.s2_ns, "s^2")
_sort_key("name", lambda s: s.name, "function")
_sort_key("file", lambda s: (s.file, s.line), "filename", "line")

#: The columns ``--sort`` names, in table order.
SORT_COLUMNS = ("hit", "total", "self", "avg", "s2", "name", "file")


def sort_stats(stats: Iterable[FunctionStat], by: str | None = None,
               graph_time: bool = True) -> list[FunctionStat]:
    """Sorted by column ``by`` (a :data:`SORT_KEYS` name); by default Total, or Self with
    graph-time off (the kernel's Time column), then by hits and name."""
    if by is None:
        by = "total" if graph_time else "self"
    _column, key = SORT_KEYS[by]
    return sorted(stats, key=lambda s: (key(s), -s.hit, s.name))


def place(stat: FunctionStat, cwd: str | None = None) -> str:
    """``file:line``, the file relative to ``cwd`` when it is inside it; '' if unknown."""
    if not stat.file:
        return ""
    path = stat.file
    if cwd and os.path.isabs(path):
        rel = os.path.relpath(path, cwd)
        if not rel.startswith(os.pardir + os.sep) and rel != os.pardir:
            path = rel
    return f"{path}:{stat.line}"


def _s2(stat: FunctionStat) -> int:
    """s^2 as the kernel prints it: the variance in ns^2, divided by 1000, in its us format."""
    return int(stat.s2_ns / 1000)


_TIME_COLUMNS = ("Total", "Self", "Avg", "s^2")


def render_table(stats: list[FunctionStat], *, total: int | None = None,
                 cwd: str | None = None) -> str:
    """The table of ``stats`` (already sorted and cut): one line per function. ``total`` is
    how many functions there were before the cut; a last line says how many are shown."""
    width = max([30, *(len(s.name) for s in stats)])
    times = "".join(f"{c:<12}    " for c in _TIME_COLUMNS)
    rules = "".join(f"{'-' * len(c):<12}    " for c in _TIME_COLUMNS)
    lines = [f"  {'Function':<{width}}  {'Hit':>10}    {times}File:Line",
             f"  {'--------':<{width}}  {'---':>10}    {rules}---------"]
    for s in stats:
        cols = (s.total_ns, s.self_ns, int(s.avg_ns), _s2(s))
        line = (f"  {s.name:<{width}}  {s.hit:>10}    "
                + "".join(f"{graph_duration(v)}    " for v in cols) + place(s, cwd))
        lines.append(line.rstrip())
    if total is not None and total > len(stats):
        lines.append(f"  ({len(stats)} of {total} functions shown: --limit)")
    return "\n".join(lines) + "\n"


def rich_table(stats: list[FunctionStat], *, total: int | None = None,
               cwd: str | None = None, sort: str | None = None) -> Any:
    """The table as a ``rich.table.Table`` (rich is imported here, on first use): times
    coloured by the function_graph duration marks they would get, the sorted column bold."""
    from rich.table import Table
    from rich.text import Text

    caption = None
    if total is not None and total > len(stats):
        caption = f"{len(stats)} of {total} functions shown (--limit)"
    table = Table(caption=caption, header_style="bold", box=None, pad_edge=False)
    sorted_column = SORT_KEYS[sort][0] if sort else None
    for label, column, justify in (("Function", "name", "left"), ("Hit", "hit", "right"),
                                   ("Total", "total", "right"), ("Self", "self", "right"),
                                   ("Avg", "avg", "right"), ("s^2", "s2", "right"),
                                   ("File:Line", "file", "left")):
        style = "underline" if column == sorted_column else ""
        table.add_column(label, justify=justify, header_style=f"bold {style}".strip(),
                         overflow="fold")

    def duration(ns: int) -> Text:
        return Text(graph_duration(ns).rstrip(), style=MARK_STYLES.get(mark(ns), ""))

    for s in stats:
        table.add_row(Text(s.name, style="bold"), str(s.hit), duration(s.total_ns),
                      duration(s.self_ns), duration(int(s.avg_ns)),
                      Text(graph_duration(_s2(s)).rstrip()), Text(place(s, cwd), style="dim"))
    return table


# -- pstats ---------------------------------------------------------------------------------


def _pstats_key(stat: FunctionStat | None, name: str) -> tuple[str, int, str]:
    if stat is None or not stat.file:
        return ("~", 0, name)  # pstats prints such a function by its name alone
    return (stat.file, stat.line, stat.func or name)


def pstats_dict(stats: Iterable[FunctionStat]) -> dict[tuple[str, int, str], tuple]:
    """The stats in the layout cProfile's ``Profile.create_stats`` makes (times in s)."""
    by_name = {s.name: s for s in stats}
    out: dict[tuple[str, int, str], tuple] = {}
    for s in by_name.values():
        callers = {_pstats_key(by_name.get(name), name):
                   (c.hit, c.prim, c.self_ns / 1e9, c.total_ns / 1e9)
                   for name, c in s.callers.items()}
        key = _pstats_key(s, s.name)
        if key in out:  # two functions on one line of one file (lambdas): as cProfile, one
            prim, hit, self_s, total_s, more = out[key]
            callers = {**more, **callers}
            out[key] = (prim + s.prim, hit + s.hit, self_s + s.self_ns / 1e9,
                        total_s + s.total_ns / 1e9, callers)
        else:
            out[key] = (s.prim, s.hit, s.self_ns / 1e9, s.total_ns / 1e9, callers)
    return out


def write_pstats(stats: Iterable[FunctionStat], out: IO[bytes]) -> int:
    """Write ``stats`` as a pstats file (``pstats.Stats(path)`` loads it); returns the
    number of functions."""
    table = pstats_dict(stats)
    marshal.dump(table, out)
    return len(table)


# -- from a recorded trace ------------------------------------------------------------------


def profile_of_trace(records: Iterable[Record], locations: dict[str, Location] | None = None,
                     graph_time: bool = True) -> list[FunctionStat]:
    """The profile of a function_graph trace's slices (every slice ending:
    ``slice_events(reader, close_open=True)``), counted as the profiler counts a run: each
    slice is a hit (a call, or a resumption of a generator or coroutine, as cProfile counts
    them), its time is its own piece (time suspended is not in it), and its caller is the
    slice it is nested in. ``locations`` (META ``functions``) gives file:line."""
    threads: dict[int, ProfileThread] = {}
    begins: dict[int, list[int]] = {}
    for kind, ts, tid, name, _ in records:
        if kind == SLICE_BEGIN:
            th = threads.get(tid)
            if th is None:
                th = threads[tid] = ProfileThread()
                begins[tid] = []
            th.begin(name, name)
            begins[tid].append(ts)
        elif kind == SLICE_END:
            th = threads[tid]
            ProfileThread.end(th.stack[-1], ts - begins[tid].pop(), graph_time)
    locations = locations or {}

    def where(name: str) -> tuple[str, int, str]:
        loc = locations.get(name)
        return (loc.file, loc.line, loc.qualname) if loc is not None else ("", 0, name)

    return merge_stats((r for th in threads.values() for r in th.row_tuples()),
                       (e for th in threads.values() for e in th.edge_tuples()),
                       str, where)


def trace_profile(reader: TraceReader) -> list[FunctionStat]:
    """The profile of the function_graph trace ``reader`` holds (see profile_of_trace), with
    Avg and s^2 as the trace's graph-time option says."""
    opts = reader.meta.get("options")
    graph_time = bool(opts.get("graph-time", True)) if isinstance(opts, dict) else True
    return profile_of_trace(slice_events(reader, close_open=True),
                            function_locations(reader.all_meta), graph_time)


def write_trace_pstats(reader: TraceReader, out: IO[bytes]) -> int:
    """The pstats file of a function_graph trace (``rethook export --format pstats``)."""
    return write_pstats(trace_profile(reader), out)
