"""Export a trace file as Chrome's Trace Event Format (JSON), for chrome://tracing, Perfetto's
legacy JSON importer, speedscope and the other viewers that read it.

The output is the JSON Object Format: ``{"traceEvents": [...], "displayTimeUnit": "ns",
"otherData": {...}}``, written as it is read (the trace is never held in memory). Events:

* metadata (``"ph": "M"``): ``process_name`` (META ``argv[0]``) and, per thread,
  ``thread_name`` and ``thread_sort_index`` (threads in order of first appearance);
* function_graph calls as duration events: ``"B"`` at the entry, ``"E"`` at the exit, on
  the thread's ``tid``, nested as the calls nested (rebuilt by
  :func:`rethook.output.slices.slice_events`, which ends calls still open when the trace
  ends at their thread's last event); a generator or coroutine suspension ends its slice,
  a resumption begins a new one (``args.resumed``). The arguments (funcgraph-args) are
  ``args.args``, one item per parameter; the return value, exception and exit flags are the
  ``"E"`` event's args, which viewers merge into the slice's;
* every other event (``function`` tracer calls, probe events, stack traces, lost events) is a
  thread-scoped instant event (``"ph": "i"``, ``"s": "t"``) with its fields as args.

``ts`` is in microseconds with the trace's nanoseconds as three decimals (the trace's own
CLOCK_MONOTONIC timestamps); ``pid`` is the recorded process's (META ``pid``).
"""

from __future__ import annotations

import json
import os
from typing import Any, TextIO

import rethook
from rethook.buffer.traceread import TraceReader
from rethook.output.info import trace_pid
from rethook.output.slices import INSTANT, SLICE_BEGIN, SLICE_END, slice_events

_PHASE = {SLICE_BEGIN: "B", SLICE_END: "E", INSTANT: "i"}
_CATEGORY = {SLICE_BEGIN: "function", SLICE_END: "function", INSTANT: "event"}

#: Integers beyond this lose precision in JavaScript's numbers: written as strings.
_SAFE_INT = 2**53 - 1

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _micros(ns: int) -> str:
    """Nanoseconds as a JSON number of microseconds, exact to the nanosecond."""
    sign = "-" if ns < 0 else ""
    us, rest = divmod(abs(ns), 1000)
    return f"{sign}{us}.{rest:03d}" if rest else f"{sign}{us}"


def _json_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -_SAFE_INT <= value <= _SAFE_INT else str(value)
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    return value if isinstance(value, str) else repr(value)


def _args(annotations: tuple[tuple[str, Any], ...]) -> str:
    return _dumps({k: _json_value(v) for k, v in annotations})


def write_chrome(reader: TraceReader, out: TextIO) -> int:
    """Write the trace ``reader`` holds to ``out`` as Trace Event Format JSON; returns the
    number of trace events written (metadata events included)."""
    meta = dict(reader.meta)
    names = dict(reader.threads)
    pid = trace_pid(meta, names)
    argv = meta.get("argv")
    argv = [str(a) for a in argv] if isinstance(argv, list) else []
    pname = os.path.basename(argv[0]) if argv else f"rethook {meta.get('tracer', 'trace')}"
    write = out.write
    write('{"traceEvents":[\n')
    count = 0
    sep = ""

    def event(text: str) -> None:
        nonlocal count, sep
        write(sep + text)
        sep = ",\n"
        count += 1

    head = f'"pid":{pid}'
    event(f'{{"name":"process_name","ph":"M",{head},"tid":{pid},'
          f'"args":{_dumps({"name": pname})}}}')
    seen: dict[int, int] = {}

    def thread(tid: int) -> None:
        seen[tid] = len(seen)
        name = names.get(tid, f"tid-{tid}")
        event(f'{{"name":"thread_name","ph":"M",{head},"tid":{tid},'
              f'"args":{_dumps({"name": name})}}}')
        event(f'{{"name":"thread_sort_index","ph":"M",{head},"tid":{tid},'
              f'"args":{{"sort_index":{seen[tid]}}}}}')

    for kind, ts, tid, name, ann in slice_events(reader, close_open=True):
        if tid not in seen:
            thread(tid)
        scope = ',"s":"t"' if kind == INSTANT else ""
        args = f',"args":{_args(ann)}' if ann else ""
        event(f'{{"name":{_dumps(name)},"cat":"{_CATEGORY[kind]}","ph":"{_PHASE[kind]}"{scope},'
              f'"ts":{_micros(ts)},{head},"tid":{tid}{args}}}')
    other = {"exporter": f"rethook {rethook.__version__}", "clock": "CLOCK_MONOTONIC"}
    for key in ("tracer", "command", "python", "start_time_iso"):
        if meta.get(key) is not None:
            other[key] = str(meta[key]) if not isinstance(meta[key], list) else " ".join(
                map(str, meta[key]))
    write(f'\n],\n"displayTimeUnit":"ns",\n"otherData":{_dumps(other)}}}\n')
    return count
