"""Export a function_graph trace as speedscope's own file format (evented profiles).

The file follows speedscope's file-format schema (``https://www.speedscope.app/
file-format-schema.json``): ``shared.frames`` lists every function once (``name``, and
``file``/``line`` when the trace's META ``functions`` knows them), and ``profiles`` holds one
``evented`` profile per thread, named ``thread-pid/tid``, in nanoseconds from the trace's
first event: an ``O`` (open) event where a call (or a resumption of a generator or coroutine)
begins, a ``C`` (close) event where it returns or suspends. Per profile the events are in
time order and balanced, each close naming the frame on top (slices rebuilt by
:func:`rethook.output.slices.slice_events`; calls still open when the trace ends close at
their thread's last event). Instants (probe events, lost events) have no place in the format
and are left out.

Each thread's events are kept in memory until the end (as JSON text, a few dozen bytes an
event): the format wants them grouped by profile.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

import rethook
from rethook.buffer.traceread import TraceReader
from rethook.output.info import function_locations, thread_frame, trace_pid
from rethook.output.slices import SLICE_BEGIN, SLICE_END, slice_events

SCHEMA = "https://www.speedscope.app/file-format-schema.json"

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def write_speedscope(reader: TraceReader, out: TextIO) -> int:
    """Write the trace ``reader`` holds to ``out`` as a speedscope file; returns the number
    of open and close events written."""
    meta = dict(reader.meta)
    names = dict(reader.threads)
    pid = trace_pid(meta, names)
    where = function_locations(reader.all_meta)
    frames: dict[str, int] = {}
    events: dict[int, list[str]] = {}  # tid -> the profile's events, as JSON
    first: int | None = None
    last: dict[int, int] = {}
    for kind, ts, tid, name, _ in slice_events(reader, close_open=True):
        if kind != SLICE_BEGIN and kind != SLICE_END:
            continue
        if first is None:
            first = ts
        frame = frames.get(name)
        if frame is None:
            frame = frames[name] = len(frames)
        thread = events.get(tid)
        if thread is None:
            thread = events[tid] = []
        thread.append(f'{{"type":"{"O" if kind == SLICE_BEGIN else "C"}","frame":{frame},'
                      f'"at":{ts - first}}}')
        last[tid] = ts
    shared = []
    for name in frames:
        entry: dict[str, Any] = {"name": name}
        loc = where.get(name)
        if loc is not None:
            entry["file"] = loc.file
            entry["line"] = loc.line
        shared.append(_dumps(entry))
    write = out.write
    argv = meta.get("argv")
    title = " ".join(map(str, argv)) if isinstance(argv, list) and argv else "rethook trace"
    write(f'{{"$schema":"{SCHEMA}",\n"name":{_dumps(title)},\n'
          f'"exporter":{_dumps(f"rethook {rethook.__version__}")},\n"activeProfileIndex":0,\n'
          '"shared":{"frames":[\n' + ",\n".join(shared) + "\n]},\n" + '"profiles":[')
    count = 0
    for i, (tid, thread) in enumerate(events.items()):
        label = thread_frame(names.get(tid, f"tid-{tid}"), pid, tid)
        write(("," if i else "") + f'\n{{"type":"evented","name":{_dumps(label)},'
              f'"unit":"nanoseconds","startValue":0,"endValue":{last[tid] - (first or 0)},'
              '"events":[\n' + ",\n".join(thread) + "\n]}")
        count += len(thread)
    write("\n]}\n")
    return count
