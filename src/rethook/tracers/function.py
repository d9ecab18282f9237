"""The ``function`` tracer: one event per call, the function and its caller (``func <-parent``)."""

from __future__ import annotations

import threading
from types import CodeType, FrameType

from rethook.engine.engine import FtraceOps
from rethook.tracers.base import OpsTracer, TraceContext
from rethook.tracers.formats import FUNCTION, STACKTRACE
from rethook.tracers.native import install_handlers, native_unavailable, native_user


def stack_text(frame: FrameType | None, name_of, limit: int = 64) -> str:
    """The call stack from ``frame`` outwards, one ``name+LINE`` per line (innermost first).

    It ends where rethook's own code begins: below a program run by ``rethook record`` are
    only the recorder's frames."""
    lines = []
    while (frame is not None and len(lines) < limit
           and not frame.f_globals.get("__name__", "").startswith("rethook.")):
        lines.append(f"{name_of(frame.f_code)}+{frame.f_lineno}")
        frame = frame.f_back
    if frame is not None and len(lines) >= limit:
        lines.append("...")
    return "\n".join(lines)


class _ThreadState:
    __slots__ = ("append", "tid")

    def __init__(self, buffer) -> None:
        buf = buffer.local()
        self.append = buf.append
        self.tid = buf.tid


class FunctionOps(FtraceOps):
    def __init__(self, ctx: TraceContext) -> None:
        super().__init__(name="function")
        self.filter = ctx.ftrace_filter
        self.ctx = ctx
        self.name_of = ctx.registry.name
        self.stacks = ctx.options["func_stack_trace"]
        self.now = ctx.now
        self._local = threading.local()

    def func(self, code: CodeType, frame: FrameType) -> None:
        try:
            st = self._local.st
        except AttributeError:
            st = self._local.st = _ThreadState(self.ctx.buffer)
        parent = frame.f_back
        t = self.now()
        if parent is None:
            st.append((1, t, st.tid, self.name_of(code), "", 0))
        else:
            st.append((1, t, st.tid, self.name_of(code), self.name_of(parent.f_code),
                       parent.f_lineno or 0))
        if self.stacks:
            st.append((STACKTRACE.id, t, st.tid, stack_text(frame, self.name_of)))


class FunctionTracer(OpsTracer):
    """``function``: every call of the filtered functions, with its caller."""

    name = "function"
    uses_options = ("print-parent", "sym-offset", "func_stack_trace")
    formats = (FUNCTION, STACKTRACE)

    def make_ops(self, ctx: TraceContext) -> FunctionOps:
        ops = FunctionOps(ctx)
        if native_unavailable(ctx, "function") is None:
            user = native_user("function", ctx)
            install_handlers(ops, user, ("func",))
            ops.wants_frame = False  # it reads the caller without frame objects
            ops.direct = user.direct()  # the C core calls it directly where it is alone
        return ops
