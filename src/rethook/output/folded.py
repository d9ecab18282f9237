"""Export a trace file as folded stacks, the input of flamegraph.pl, speedscope and inferno.

One line per distinct stack, root first, frames joined by ``;``, then a space and a value::

    programs.calls.outer;programs.calls.leaf 3

``function_graph`` traces: the stacks are those of the trace's call tree
(:mod:`rethook.output.calltree`, built from :func:`rethook.output.slices.slice_events`, so
entry-less exits and suspended coroutines are handled the same way as in the Perfetto export),
and the value is the stack's *self time* in microseconds: the time its innermost frame ran,
minus its children, summed over every time that stack occurred, rounded to the nearest
microsecond (halves up) and at least 1 when not zero. A suspended generator or coroutine
counts only while it runs, under whatever resumed it. Calls still open when the trace ends
are counted up to their thread's last event.

``function`` traces record only a function and its caller, not the whole stack, so each line
is ``caller;function COUNT`` (or ``function COUNT`` without a caller): how many calls the
trace holds of that function from that caller.

With ``per_thread=True`` every stack starts with its thread as the root frame, named
``name-pid/tid`` as ``stackcollapse-perf.pl --tid`` names threads. Lines are sorted, so the
output of one trace is always the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from rethook.buffer.events import COMMON_COUNT
from rethook.buffer.traceread import TraceReader
from rethook.output.calltree import build_call_tree
from rethook.output.info import thread_frame, trace_pid
from rethook.output.slices import is_graph_trace, slice_events
from rethook.printable import printable


def _frame(name: str) -> str:
    """A frame name that cannot break the line format (nor reach a terminal raw)."""
    return printable(name.replace(";", ":").replace("\n", " ").replace("\r", " "))


def _micros(ns: int) -> int:
    """Nanoseconds to microseconds, halves rounded up; at least 1 for any time at all."""
    us = (ns + 500) // 1000
    return us if us or ns <= 0 else 1


def _thread_frames(reader: TraceReader) -> Callable[[int], str]:
    """A thread's root frame, by its id."""
    names = reader.threads
    pid = trace_pid(reader.meta, names)
    pids = reader.thread_pids  # a trace of several processes: each thread's own
    return lambda tid: _frame(thread_frame(names.get(tid, f"tid-{tid}"), pids.get(tid) or pid,
                                           tid))


def _graph_stacks(reader: TraceReader, per_thread: bool) -> dict[tuple[str, ...], int]:
    """Self time in ns per stack."""
    tree = build_call_tree(slice_events(reader, close_open=True))
    totals: dict[tuple[str, ...], int] = {}
    if per_thread:
        frame = _thread_frames(reader)
        roots = [((frame(tid),), root) for tid, root in tree.roots.items()]
    else:
        roots = [((), tree.merged())]
    for above, root in roots:
        for node, stack in root.walk():
            key = (*above, *map(_frame, stack))
            totals[key] = totals.get(key, 0) + node.self_ns
    return totals


def _function_stacks(reader: TraceReader, per_thread: bool) -> dict[tuple[str, ...], int]:
    """Call counts per (caller, function)."""
    fid = next((f.id for f in reader.formats if f.name == "function"), None)
    frame = _thread_frames(reader)
    counts: dict[tuple[str, ...], int] = {}
    if fid is None:
        return counts
    for ev in reader.events():
        if ev[0] != fid:
            continue
        func, parent = ev[COMMON_COUNT], ev[COMMON_COUNT + 1]
        key = (_frame(parent), _frame(func)) if parent else (_frame(func),)
        if per_thread:
            key = (frame(ev[2]), *key)
        counts[key] = counts.get(key, 0) + 1
    return counts


def write_folded(reader: TraceReader, out: TextIO, *, per_thread: bool = False) -> int:
    """Write the folded stacks of the trace ``reader`` holds to ``out``; returns the number
    of lines."""
    if is_graph_trace(reader):
        values = {key: _micros(ns) for key, ns in _graph_stacks(reader, per_thread).items()}
    else:
        values = _function_stacks(reader, per_thread)
    lines = sorted(f"{';'.join(key)} {value}" for key, value in values.items() if value > 0)
    for line in lines:
        out.write(line + "\n")
    return len(lines)
