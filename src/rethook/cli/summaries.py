"""``rethook profile``'s table or pstats file, and ``rethook info``: summaries of a run.

The data is shaped in rethook.output (profile.py, info.py); this module picks the form for
where it goes: a rich table on a terminal, the plain text table otherwise (cli/term.py).
"""

from __future__ import annotations

import io
import os
import sys
from typing import IO, Any

from rethook.runner.observers import emit, human_size
from rethook.tracers.profiler import FunctionStat, add_stats


def print_profile(stats: list[FunctionStat], out: IO[str], *, sort: str | None,
                  limit: int | None, graph_time: bool) -> None:
    """The profile table on ``out``: sorted, cut to ``limit`` rows."""
    from rethook.cli.term import console
    from rethook.output.profile import render_table, rich_table, sort_stats

    rows = sort_stats(stats, sort, graph_time)
    total = len(rows)
    if limit is not None:
        rows = rows[:limit]
    cwd = os.getcwd()
    con = console(out)
    if con is None:
        out.write(render_table(rows, total=total, cwd=cwd))
    else:
        con.print(rich_table(rows, total=total, cwd=cwd, sort=sort or (
            "total" if graph_time else "self")))


def show_profile(tables: list[tuple[int, list[FunctionStat]]], *, output: str | None,
                 sort: str | None, limit: int | None, graph_time: bool, per_process: bool,
                 abrupt: bool) -> bool:
    """What ``rethook profile`` says at the end: the processes' tables merged (or one per
    process with ``per_process``) on stdout, or the merged profile as a pstats file
    ``output``. ``abrupt``: a signal ends the process, so the text goes straight to the file
    descriptor (see runner.observers.emit). False when the file could not be written."""
    merged: dict[str, FunctionStat] = {}
    for _pid, stats in tables:
        add_stats(merged, stats)
    if output is not None:
        try:
            emit(2, write_profile(list(merged.values()), output), abrupt)
        except OSError as e:
            emit(2, f"rethook: error: {output}: {e.strerror or e}", abrupt)
            return False
        return True
    parts = tables if per_process and len(tables) > 1 else [(None, list(merged.values()))]
    try:
        if not abrupt:
            sys.stdout.flush()  # the program's output comes first
        out = sys.__stdout__ or sys.stdout
        for pid, stats in parts:
            buf = io.StringIO() if abrupt else out
            if pid is not None:
                buf.write(f"# process {pid}\n")
            print_profile(stats, buf, sort=sort, limit=limit, graph_time=graph_time)
            if abrupt:
                emit(1, buf.getvalue(), abrupt, end="")
        out.flush()
    except BrokenPipeError:
        pass
    return True


def write_profile(stats: list[FunctionStat], path: str) -> str:
    """The pstats file at ``path``; returns the line to say so."""
    from rethook.output.profile import write_pstats

    with open(path, "wb") as f:
        count = write_pstats(stats, f)
    return (f"rethook: profile of {count:,} function{'' if count == 1 else 's'} written to {path} "
            f"({human_size(os.path.getsize(path))}): python -m pstats {path}")


# -- rethook info ---------------------------------------------------------------------------


def _when(meta: dict[str, Any], key: str) -> str:
    from rethook.engine.clock import local_iso

    t = meta.get(key)
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return ""
    try:
        return local_iso(t)
    except (OverflowError, OSError, ValueError):  # a damaged file's time: out of range
        return ""


def _seconds(ns: int) -> str:
    return f"{ns / 1e9:.6f} s"


def _words(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value) or "-"
    return "-" if value in (None, "") else str(value)


def info_lines(info: Any) -> list[str]:
    """``rethook info``'s text: one ``key: value`` line per fact, tables for the threads and
    the events."""
    from rethook.tracers.base import OPTION_DEFAULTS

    meta = info.meta
    lines = []

    def field(key: str, value: Any) -> None:
        lines.append(f"{key + ':':<16}{value}")

    state = "complete" if info.complete else f"damaged: {info.damage}"
    field("file", f"{info.path} ({human_size(info.size)}, format "
                  f"{info.version[0]}.{info.version[1]}, {state})")
    field("tracer", meta.get("tracer", "-"))
    field("command", _words(meta.get("command") or meta.get("argv")))
    if meta.get("rethook_command"):
        field("recorded with", _words(meta.get("rethook_command")))
    field("rethook", f"{meta.get('rethook_version', '-')} (engine: {meta.get('engine', '-')})"
                     f", {meta.get('python_implementation', 'python')} {meta.get('python', '-')}")
    field("started", _when(meta, "start_time") or meta.get("start_time_iso", "-"))
    field("ended", _when(meta, "end_time") or "-")
    field("clock", f"{meta.get('clock', '-')} ({meta.get('clock_source', '-')})")
    opts = meta.get("options") if isinstance(meta.get("options"), dict) else {}
    changed = [name if value else f"no{name}" for name, value in sorted(opts.items())
               if name in OPTION_DEFAULTS and value != OPTION_DEFAULTS[name]]
    field("options", " ".join(changed) + " (the rest at their defaults)" if changed
          else "all at their defaults")
    for key, label in (("filter", "filter (-l)"), ("notrace", "notrace (-n)"),
                       ("graph_function", "graph (-g)"), ("graph_notrace", "graph_notrace")):
        if meta.get(key):
            field(label, _words(meta[key]))
    for key, label in (("max_graph_depth", "max depth"), ("tracing_thresh_us", "thresh (us)"),
                       ("buffer_size_kb", "buffer (KB)")):
        if meta.get(key):
            field(label, meta[key])
    probes = meta.get("probe_events")
    if isinstance(probes, dict) and probes:
        field("probe events", f"{len(probes)}")
        for name, text in probes.items():
            lines.append(f"  {name}: {text}")
    for key, label in (("event_filters", "  filter"), ("event_triggers", "  trigger")):
        values = meta.get(key)
        if isinstance(values, dict):
            for event, items in values.items():
                for item in items if isinstance(items, list) else [items]:
                    lines.append(f"{label} ({event}): {item}")
    hists = meta.get("histograms")
    if isinstance(hists, dict) and hists:
        field("histograms", f"{', '.join(sorted(hists))} (rethook hist -i {info.path})")
    several = len(info.processes) > 1
    if several:
        field("processes", f"{len(info.processes)}")
        lines.append(f"  {'pid':>8}  {'ppid':>8}  {'how':<6}  command")
        for pid, proc in info.processes.items():
            ppid = proc.get("ppid")
            lines.append(f"  {pid:>8}  {ppid if ppid is not None else '-':>8}  "
                         f"{str(proc.get('how') or '-'):<6}  {_words(proc.get('argv')) or '-'}")
    else:
        field("processes", f"1 (pid {info.pid})")
    span = info.span_ns
    if span is not None:
        field("time span", f"{_seconds(span[1] - span[0])} (first event at "
                           f"{span[0] / 1e9:.6f}, last at {span[1] / 1e9:.6f})")
    field("events", f"{info.events:,}" + (f" ({info.lost:,} lost)" if info.lost else
                                            " (none lost)"))
    width = max([6, *(len(name) for name in info.events_by_format)])
    for name, n in info.events_by_format.items():
        lines.append(f"  {name:<{width}}  {n:>12,}")
    field("threads", f"{len(info.threads)}")
    pid_head = f"{'pid':>8}  " if several else ""
    lines.append(f"  {pid_head}{'tid':>8}  {'name':<24}  {'events':>12}  {'lost':>8}  span")
    for th in info.threads.values():
        when = (_seconds(th.last_ns - th.first_ns) if th.first_ns is not None
                and th.last_ns is not None else "-")
        pid = f"{th.pid:>8}  " if several else ""
        lines.append(f"  {pid}{th.tid:>8}  {th.name or '-':<24}  {th.events:>12,}  "
                     f"{th.lost:>8,}  {when}")
    return lines


def info_json(info: Any) -> str:
    import json

    threads = [{"tid": t.tid, "pid": t.pid, "name": t.name, "events": t.events, "lost": t.lost,
                "first_ns": t.first_ns, "last_ns": t.last_ns} for t in info.threads.values()]
    return json.dumps({"path": info.path, "size": info.size, "version": list(info.version),
                       "complete": info.complete, "damage": info.damage, "pid": info.pid,
                       "events": info.events, "lost": info.lost,
                       "events_by_format": info.events_by_format, "threads": threads,
                       "processes": {str(pid): {k: v for k, v in proc.items() if k != "meta"}
                                     for pid, proc in info.processes.items()},
                       "span_ns": list(info.span_ns) if info.span_ns else None,
                       "meta": info.meta}, indent=1, sort_keys=True, default=str)


def info_file(path: str, as_json: bool) -> int:
    """``rethook info``: print the trace's metadata and counts; the exit status (1 if the file
    is damaged, after printing what is readable)."""
    from rethook.buffer.tracefile import TraceFileError
    from rethook.buffer.traceread import TraceReader
    from rethook.cli.reporting import _error
    from rethook.cli.term import progress
    from rethook.output.info import trace_info
    from rethook.printable import printable_lines

    try:
        reader = TraceReader(path, strict=False)
    except TraceFileError as e:
        _error(str(e))
        return 1
    except OSError as e:
        _error(f"{path}: {e.strerror}")
        return 1
    import warnings

    with reader, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # damage is reported once, below
        with progress(reader, "info", passes=1) as reading:
            info = trace_info(reading)
    # names, argv and metadata come from the program and the file: escaped (JSON escapes)
    text = info_json(info) if as_json else printable_lines("\n".join(info_lines(info)))
    sys.stdout.write(text + "\n")
    if info.damage is not None:
        _error(info.damage)
        return 1
    return 0
