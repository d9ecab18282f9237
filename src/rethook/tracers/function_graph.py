"""The ``function_graph`` tracer: an entry and an exit event per call, on the shared return hook.

One graph user (FgraphOps) hooks the functions of ``set_ftrace_filter``/``set_ftrace_notrace``.
Per thread it keeps its own depth (only the calls it records count, as in the kernel, where a
declined entry leaves no trace on the shadow stack) and two nesting counters for
``set_graph_function`` (record only inside these) and ``set_graph_notrace`` (record neither
these nor what they call). ``max_graph_depth`` declines deeper calls; ``tracing_thresh``
records only exits slower than it, and then no entries (so they print as ``} /* func */``,
like the kernel). Generators and coroutines get suspend/resume events: the await points.
"""

from __future__ import annotations

import threading
from types import CodeType, FrameType

from rethook.engine.core import FLAG_UNFINISHED
from rethook.engine.engine import FgraphOps
from rethook.tracers.base import OpsTracer, TraceContext, bounded_repr, bounded_reprs, format_args
from rethook.tracers.formats import (
    EXIT_RAISED,
    FUNCGRAPH_ENTRY,
    FUNCGRAPH_EXIT,
    FUNCGRAPH_RESUME,
    FUNCGRAPH_SUSPEND,
)
from rethook.tracers.native import (
    GRAPH_HANDLERS,
    install_handlers,
    native_unavailable,
    native_user,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# What the entry data's kind says the exit has to do.
_RECORD = 0  # a traced call: record its exit
_NOTRACE = 1  # a set_graph_notrace function: only leave its nesting
_ROOT = 2  # a traced call that is also a set_graph_function root


class _ThreadState:
    """The tracer's view of one thread."""

    __slots__ = ("depth", "graph", "notrace", "append", "tid")

    def __init__(self, buffer: Any) -> None:
        buf = buffer.local()
        self.append = buf.append
        self.tid = buf.tid
        self.depth = 0  # calls this tracer is recording, open on this thread
        self.graph = 0  # open set_graph_function roots
        self.notrace = 0  # open set_graph_notrace functions


class GraphOps(FgraphOps):
    """The engine user behind the tracer; all per-call work is here."""

    def __init__(self, ctx: TraceContext) -> None:
        super().__init__(name="function_graph")
        self.filter = ctx.ftrace_filter  # hooked: set_ftrace_filter minus set_ftrace_notrace
        self.ctx = ctx
        opts = ctx.options
        # (registered so far: the others join as they are registered, see _new_functions)
        roots, skip = ctx.graph_function, ctx.graph_notrace
        self.roots = None if roots.is_empty else roots.select_by_id(complete=False)
        self.skip = None if skip.is_empty else skip.select_by_id(complete=False)
        self.max_depth = ctx.max_graph_depth
        self.thresh = ctx.tracing_thresh_ns
        self.sleep_time = opts["sleep-time"]
        self.retval = opts["funcgraph-retval"]
        self.args = opts["funcgraph-args"]
        if self.retval or self.args:
            bounded_reprs()
        self.overrun = opts["funcgraph-overrun"]
        self.wants_frame = self.args
        self.name_of = ctx.registry.name
        self._local = threading.local()
        # Roots and notrace functions registered later (imports, discovery) join then.
        self.close = ctx.registry.subscribe(self._new_functions)

    def _new_functions(self, infos: list) -> None:
        ctx = self.ctx
        for info in infos:
            if self.roots is not None and ctx.graph_function.matches(info):
                self.roots[id(info.code)] = info.code
            if self.skip is not None and ctx.graph_notrace.matches(info):
                self.skip[id(info.code)] = info.code

    def _state(self) -> _ThreadState:
        try:
            return self._local.st
        except AttributeError:
            self._local.st = st = _ThreadState(self.ctx.buffer)
            return st

    def entryfunc(self, code: CodeType, frame: FrameType | None, depth: int, t: int) -> Any:
        try:
            st = self._local.st
        except AttributeError:
            st = self._state()
        if st.notrace:
            return None
        kind = _RECORD
        if self.skip is not None and id(code) in self.skip:
            st.notrace += 1
            return [st, 0, _NOTRACE, ""]
        if self.roots is not None and not st.graph:
            if id(code) not in self.roots:
                return None
            kind = _ROOT
        d = st.depth
        if self.max_depth and d >= self.max_depth:
            return None
        if kind == _ROOT:
            st.graph += 1
        st.depth = d + 1
        name = self.name_of(code)
        if not self.thresh:
            st.append((2, t, st.tid, d, name, format_args(code, frame) if self.args else ""))
        return [st, d, kind, name]

    def retfunc(self, code: CodeType, frame: FrameType | None, depth: int, data: Any,
                retval: Any, exc: BaseException | None, t0: int, t1: int, sleep: int,
                flags: int) -> None:
        st, d, kind, name = data
        if kind == _NOTRACE:
            st.notrace -= 1
            return
        st.depth = d
        if kind == _ROOT:
            st.graph -= 1
        duration = t1 - t0 if self.sleep_time else t1 - t0 - sleep
        if self.thresh and duration <= self.thresh:
            return
        if exc is not None:
            flags |= EXIT_RAISED
        text = ""
        if self.retval and not flags & FLAG_UNFINISHED:
            text = bounded_repr(exc if exc is not None else retval)
        overrun = self._overruns() if self.overrun else 0
        # A return delivered from another thread (teardown) goes into that thread's buffer,
        # stamped with the thread the call ran in.
        try:
            here = self._local.st
        except AttributeError:
            here = self._state()
        here.append((3, t1, st.tid, d, name, t1 - duration, overrun, sleep, flags, text))

    def suspendfunc(self, code: CodeType, frame: FrameType | None, depth: int, data: Any,
                    t: int) -> None:
        st, d, kind, name = data
        if kind == _NOTRACE:
            st.notrace -= 1
            return
        st.depth = d
        if kind == _ROOT:
            st.graph -= 1
        if not self.thresh:
            st.append((4, t, st.tid, d, name))

    def resumefunc(self, code: CodeType, frame: FrameType | None, depth: int, data: Any,
                   t: int) -> None:
        st = self._state()  # possibly another thread than the one it suspended in
        kind = data[2]
        data[0] = st
        if kind == _NOTRACE:
            st.notrace += 1
            return
        if kind == _ROOT:
            st.graph += 1
        d = data[1] = st.depth
        st.depth = d + 1
        if not self.thresh:
            st.append((5, t, st.tid, d, data[3]))

    def _overruns(self) -> int:
        ts = self.ctx.engine.core.current_thread_state()
        return ts.overrun if ts is not None else 0


class NativeGraphOps(GraphOps):
    """The same user with its per-call work in C (tracers/native.py, _native.c)."""

    def __init__(self, ctx: TraceContext) -> None:
        super().__init__(ctx)
        # roots and skip are shared with the C side: _new_functions' additions reach it
        user = native_user("function_graph", ctx, roots=self.roots, skip=self.skip,
                           max_depth=self.max_depth, thresh=self.thresh,
                           sleep_time=self.sleep_time, exit_raised=EXIT_RAISED,
                           overrun_of=self._overruns if self.overrun else None)
        install_handlers(self, user, GRAPH_HANDLERS)
        self.direct = user.direct()  # the C core calls it directly where it is alone


class FunctionGraphTracer(OpsTracer):
    """``function_graph``: calls as a nested graph with durations."""

    name = "function_graph"
    uses_options = ("sleep-time", "funcgraph-overrun", "funcgraph-cpu", "funcgraph-overhead",
                    "funcgraph-proc", "funcgraph-duration", "funcgraph-abstime",
                    "funcgraph-tail", "funcgraph-retval", "funcgraph-args")
    formats = (FUNCGRAPH_ENTRY, FUNCGRAPH_EXIT, FUNCGRAPH_SUSPEND, FUNCGRAPH_RESUME)

    def make_ops(self, ctx: TraceContext) -> GraphOps:
        if native_unavailable(ctx, "function_graph") is None:
            return NativeGraphOps(ctx)
        return GraphOps(ctx)
