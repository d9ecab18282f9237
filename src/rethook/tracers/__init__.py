"""The tracers: users of the hook engine that record into the trace buffer.

- ``nop`` (:class:`~rethook.tracers.base.NopTracer`), ``function``
  (:mod:`~rethook.tracers.function`), ``function_graph`` (:mod:`~rethook.tracers.function_graph`);
- the function profiler (:mod:`~rethook.tracers.profiler`) and the function commands
  (:mod:`~rethook.tracers.commands`);
- the event formats they record (:mod:`~rethook.tracers.formats`).

``TRACERS`` and the tracer classes are imported on first use: naming the tracers
(``TRACER_NAMES``, which the command line's help does) loads no engine.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from rethook.tracers.base import NopTracer, Tracer
    from rethook.tracers.function import FunctionTracer
    from rethook.tracers.function_graph import FunctionGraphTracer

#: ``available_tracers``, in the kernel's order: each name's module and class.
_CLASSES = {
    "function_graph": ("rethook.tracers.function_graph", "FunctionGraphTracer"),
    "function": ("rethook.tracers.function", "FunctionTracer"),
    "nop": ("rethook.tracers.base", "NopTracer"),
}
#: The tracers' names (``available_tracers``).
TRACER_NAMES: tuple[str, ...] = tuple(_CLASSES)


def _module(name: str) -> Any:
    __import__(name)  # (as rethook.buffer's: importlib is not loaded at start-up)
    return sys.modules[name]


def __getattr__(name: str) -> Any:
    """``TRACERS`` (name -> tracer class, ``dict[str, type[Tracer]]``) and the classes."""
    if name == "TRACERS":
        tracers = {n: getattr(_module(m), c) for n, (m, c) in _CLASSES.items()}
        globals()["TRACERS"] = tracers
        return tracers
    for module, cls in (*_CLASSES.values(), ("rethook.tracers.base", "Tracer")):
        if name == cls:
            return getattr(_module(module), cls)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TRACERS", "TRACER_NAMES", "FunctionGraphTracer", "FunctionTracer", "NopTracer",
           "Tracer"]
