"""Function commands written to ``set_ftrace_filter``: ``FUNC:traceon[:N]``, ``traceoff``,
``stacktrace`` and ``dump``, each an entry user of the engine on the functions it names.

As in the kernel, ``traceon``/``traceoff`` only count when they change the state (a traceoff
that finds tracing already off is not used up), ``stacktrace`` records a stack trace event each
time, and ``dump`` writes the whole buffer's text view to stderr.
"""

from __future__ import annotations

import sys
import threading
from types import CodeType, FrameType

from rethook.engine.engine import FtraceOps
from rethook.engine.filters import FilterCommand, FunctionFilter
from rethook.tracers.base import TraceContext
from rethook.tracers.formats import PRINT, STACKTRACE
from rethook.tracers.function import stack_text


class CommandOps(FtraceOps):
    """One command on the functions its glob selects."""

    def __init__(self, ctx: TraceContext, cmd: FilterCommand, dump=None) -> None:
        super().__init__(name=f"command:{cmd.text}")
        pattern = cmd.pattern.text
        self.filter = FunctionFilter([pattern], registry=ctx.registry)
        self.ctx = ctx
        self.cmd = cmd
        self.left = cmd.count  # None: unlimited
        self.dump = dump
        self._lock = threading.Lock()

    def _use(self) -> bool:
        with self._lock:
            if self.left is None:
                return True
            if self.left <= 0:
                return False
            self.left -= 1
            return True

    def func(self, code: CodeType, frame: FrameType) -> None:
        ctx = self.ctx
        command = self.cmd.command
        buf = ctx.buffer
        if command == "traceon":
            if not buf.tracing_on and self._use():
                buf.tracing_on = True
                self._note(f"traceon by {ctx.name(code)}")
        elif command == "traceoff":
            if buf.tracing_on and self._use():
                self._note(f"traceoff by {ctx.name(code)}")
                buf.tracing_on = False
        elif command == "stacktrace":
            if buf.tracing_on and self._use():
                local = buf.local()
                local.append((STACKTRACE.id, ctx.now(), local.tid,
                              stack_text(frame, ctx.name)))
        elif command == "dump":
            if buf.tracing_on and self._use() and self.dump is not None:
                sys.stderr.write(self.dump())

    def _note(self, msg: str) -> None:
        local = self.ctx.buffer.local()
        local.append((PRINT.id, self.ctx.now(), local.tid, msg))


class Commands:
    """The live set of function commands of one trace context."""

    SUPPORTED = ("traceon", "traceoff", "stacktrace", "dump")

    def __init__(self, ctx: TraceContext, dump=None) -> None:
        self.ctx = ctx
        self.dump = dump
        self.ops: dict[tuple, CommandOps] = {}

    def sync(self) -> None:
        """Register the commands the filter now holds; unregister the ones it lost."""
        engine = self.ctx.engine
        wanted = {c.key: c for c in self.ctx.ftrace_filter.commands}
        for key in list(self.ops):
            if key not in wanted or wanted[key].count != self.ops[key].cmd.count:
                engine.unregister_ftrace_function(self.ops.pop(key))
        for key, cmd in wanted.items():
            if key in self.ops:
                continue
            if cmd.command not in self.SUPPORTED:
                raise ValueError(f"command {cmd.command!r} is not supported by function "
                                 f"filters here (supported: {', '.join(self.SUPPORTED)})")
            ops = CommandOps(self.ctx, cmd, self.dump)
            engine.register_ftrace_function(ops)
            self.ops[key] = ops

    def stop(self) -> None:
        for ops in self.ops.values():
            self.ctx.engine.unregister_ftrace_function(ops)
        self.ops.clear()
