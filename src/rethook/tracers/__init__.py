"""The tracers: users of the hook engine that record into the trace buffer.

- ``nop`` (:class:`~rethook.tracers.base.NopTracer`), ``function``
  (:mod:`~rethook.tracers.function`), ``function_graph`` (:mod:`~rethook.tracers.function_graph`);
- the function profiler (:mod:`~rethook.tracers.profiler`) and the function commands
  (:mod:`~rethook.tracers.commands`);
- the event formats they record (:mod:`~rethook.tracers.formats`).
"""

from rethook.tracers.base import NopTracer, Tracer
from rethook.tracers.function import FunctionTracer
from rethook.tracers.function_graph import FunctionGraphTracer

#: ``available_tracers``, by name.
TRACERS: dict[str, type[Tracer]] = {
    "function_graph": FunctionGraphTracer,
    "function": FunctionTracer,
    "nop": NopTracer,
}

__all__ = ["TRACERS", "FunctionGraphTracer", "FunctionTracer", "NopTracer", "Tracer"]
