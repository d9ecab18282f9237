"""Where traced events go: the event model, the per-thread ring buffer, the trace file.

- :mod:`rethook.buffer.events` -- event formats (``events/*/format``), the format
  registry, the ``(format_id, ts_ns, tid, *fields)`` event tuple, ``Lost`` markers.
- :mod:`rethook.buffer.ring` -- :class:`TraceBuffer`, the kernel's per-CPU ring
  buffer with one buffer per thread, its ``trace`` and ``trace_pipe`` readers.
- :mod:`rethook.buffer.tracefile` -- the binary trace file (docs/trace-format.md).

The names below are imported from their modules on first use: a reader of trace files
(``rethook report``, stream's printer process) does not load the ring buffer.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Each name's module.
_HOMES = {
    **dict.fromkeys(("COMMON_FIELDS", "FIELD_TYPES", "Event", "EventFormat", "Field",
                     "FormatRegistry", "Lost", "clock_ns"), "rethook.buffer.events"),
    **dict.fromkeys(("BufferStats", "ThreadBuffer", "ThreadStats", "TraceBuffer", "TracePipe",
                     "buffer_geometry"), "rethook.buffer.ring"),
    **dict.fromkeys(("TraceFileError", "TraceFileWarning", "TraceReader", "TraceWriter",
                     "write_trace"), "rethook.buffer.tracefile"),
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
