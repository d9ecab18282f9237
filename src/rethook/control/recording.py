"""A trace instance's events written into a trace file as they are consumed (``record -P``).

:class:`TraceSink` is the drain's work without its thread: each :meth:`~TraceSink.round`
consumes ``trace_pipe`` once and writes what came: each thread's native records straight
from its C ring (:meth:`TraceWriter.write_native`), anything else through event tuples;
:meth:`~TraceSink.finish` writes what is left, the per-thread statistics, the probe
histograms and the END chunk. The control channel runs it from a connection's thread; the
file is the one the client opened and passed over the socket.
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Callable
from typing import IO, Any

import rethook
from rethook.buffer.tracefile import TraceWriter
from rethook.control.tracefs import Tracefs
from rethook.engine import clock
from rethook.engine.core import notrace


def instance_meta(fs: Tracefs, **extra: Any) -> dict[str, Any]:
    """The META keys of a trace recorded from a running process, read from the instance."""
    ctx = fs.ctx
    meta: dict[str, Any] = {
        "tracer": fs.tracer.name,
        "options": ctx.options.as_dict(),
        "argv": list(sys.argv),
        "command": list(sys.orig_argv),
        "filter": ctx.ftrace_filter.filter_patterns,
        "notrace": ctx.ftrace_filter.notrace_patterns,
        "graph_function": ctx.graph_function.filter_patterns,
        "graph_notrace": ctx.graph_notrace.filter_patterns,
        "probe_events": dict(fs.dynamic.printed),
        "max_graph_depth": ctx.max_graph_depth,
        "tracing_thresh_us": ctx.tracing_thresh_ns // 1000,
        "buffer_size_kb": ctx.buffer.size_kb,
        "python": sys.version.split()[0],
        "python_implementation": sys.implementation.name,
        "engine": ctx.engine.core.name,
        "rethook_version": rethook.__version__,
        "pid": os.getpid(),
        "clock": "monotonic_ns",
        "clock_source": clock.source,
        "attached": True,
        **clock.start_times(),
    }
    meta.update(extra)
    return meta


class TraceSink:
    """Consumes one instance's buffer into a trace file, a round at a time."""

    def __init__(self, fs: Tracefs, file: IO[bytes], meta: dict[str, Any]) -> None:
        self.fs = fs
        self.file = file
        self.writer = TraceWriter(file, meta, formats=fs.ctx.formats)
        if getattr(getattr(fs.tracer, "ops", None), "native", None) is not None:
            # native users fill rings fast: page the encoder's memory in before they do
            self.writer.prepare_native(fs.ctx.buffer.native_capacity)
        self._pipe = fs.ctx.buffer.pipe()
        self._named: dict[int, str] = {}
        self.events = 0
        self.lost = 0
        self.size = 0

    def round(self, timeout: float) -> bool:
        """Consume once, waiting up to ``timeout`` s for something; False if nothing came."""
        with notrace():
            items = self._pipe.read_or_feed(timeout, self._feed)
            if items:
                self._name_threads()
                self.writer.write_events(items)
        return items is None or bool(items)

    def _feed(self, ring: Any, tid: int, name_of: Callable[[types.CodeType], str]) -> None:
        self._name_threads()
        self.writer.write_native(ring, tid, name_of)

    def _name_threads(self) -> None:
        for tid, name in self.fs.ctx.buffer.threads().items():
            if self._named.get(tid) != name:
                self._named[tid] = name
                self.writer.set_thread_name(tid, name)

    def finish(self) -> None:
        """Write what is left and end the file (tracing must be off by now)."""
        writer, fs = self.writer, self.fs
        with notrace():
            try:
                pipe = fs.ctx.buffer.pipe()
                while True:
                    items = pipe.read_or_feed(0, self._feed)
                    if items is not None and not items:
                        break
                    if items:
                        self._name_threads()
                        writer.write_events(items)
                self._name_threads()
                writer.write_stats(fs.ctx.buffer.stats())
                writer.set_meta("end_time", time.time())
                hists = {name: e.read_hist() for name, e in fs.dynamic.events.items()
                         if e.read_hist()}
                if hists:
                    writer.set_meta("histograms", hists)
                writer.close()
                self.size = os.fstat(self.file.fileno()).st_size
            finally:
                self.events = writer.events_written
                self.lost = fs.ctx.buffer.totals().lost
                self.file.close()
