"""Where traced events go: the event model, the per-thread ring buffer, the trace file.

- :mod:`rethook.buffer.events` -- event formats (``events/*/format``), the format
  registry, the ``(format_id, ts_ns, tid, *fields)`` event tuple, ``Lost`` markers.
- :mod:`rethook.buffer.ring` -- :class:`TraceBuffer`, the kernel's per-CPU ring
  buffer with one buffer per thread, its ``trace`` and ``trace_pipe`` readers.
- :mod:`rethook.buffer.tracefile` -- the binary trace file (docs/trace-format.md) and its
  writer; :mod:`rethook.buffer.traceread` -- its readers.

The names below are imported from their modules on first use: a reader of trace files
(``rethook report``, stream's printer process) does not load the ring buffer.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Each name's module.
_HOMES = {
    **dict.fromkeys(("COMMON_FIELDS", "FIELD_TYPES", "Event", "EventFormat", "Field",
                     "FormatRegistry", "Lost", "clock_ns"), "rethook.buffer.events"),
    **dict.fromkeys(("BufferStats", "ThreadBuffer", "ThreadStats", "TraceBuffer", "TracePipe",
                     "buffer_geometry"), "rethook.buffer.ring"),
    **dict.fromkeys(("TraceFileError", "TraceFileWarning", "TraceWriter", "write_trace"),
                    "rethook.buffer.tracefile"),
    **dict.fromkeys(("TraceReader", "TraceTail"), "rethook.buffer.traceread"),
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    __import__(home)  # (not importlib.import_module: importlib is ~0.3 ms of a start-up)
    return getattr(sys.modules[home], name)
