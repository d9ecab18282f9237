"""Where traced events go: the event model, the per-thread ring buffer, the trace file.

- :mod:`rethook.buffer.events` -- event formats (``events/*/format``), the format
  registry, the ``(format_id, ts_ns, tid, *fields)`` event tuple, ``Lost`` markers.
- :mod:`rethook.buffer.ring` -- :class:`TraceBuffer`, the kernel's per-CPU ring
  buffer with one buffer per thread, its ``trace`` and ``trace_pipe`` readers.
- :mod:`rethook.buffer.tracefile` -- the binary trace file (docs/trace-format.md).
"""

from rethook.buffer.events import (
    COMMON_FIELDS,
    FIELD_TYPES,
    Event,
    EventFormat,
    Field,
    FormatRegistry,
    Lost,
    clock_ns,
)
from rethook.buffer.ring import (
    BufferStats,
    ThreadBuffer,
    ThreadStats,
    TraceBuffer,
    TracePipe,
    buffer_geometry,
)
from rethook.buffer.tracefile import (
    TraceFileError,
    TraceFileWarning,
    TraceReader,
    TraceWriter,
    write_trace,
)

__all__ = [
    "COMMON_FIELDS",
    "FIELD_TYPES",
    "BufferStats",
    "Event",
    "EventFormat",
    "Field",
    "FormatRegistry",
    "Lost",
    "ThreadBuffer",
    "ThreadStats",
    "TraceBuffer",
    "TraceFileError",
    "TraceFileWarning",
    "TracePipe",
    "TraceReader",
    "TraceWriter",
    "buffer_geometry",
    "clock_ns",
    "write_trace",
]
