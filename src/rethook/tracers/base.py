"""What every tracer shares: the trace context (buffer, formats, options, filters) and the
Tracer interface the control surface drives (the kernel's ``struct tracer``).
"""

from __future__ import annotations

from types import CodeType, FrameType

from rethook.buffer.events import FormatRegistry, clock_ns
from rethook.buffer.ring import TraceBuffer
from rethook.engine.engine import Engine, FtraceOps, get_engine
from rethook.engine.filters import FunctionFilter
from rethook.engine.registry import Registry
from rethook.tracers.formats import builtin_registry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: The trace options (``trace_options`` / ``options/*``) and their defaults, as in the kernel.
OPTION_DEFAULTS: dict[str, bool] = {
    "print-parent": True,  # function: show ``<-parent``
    "sym-offset": False,  # show the caller's line as ``parent+LINE``
    "overwrite": True,  # full buffer drops the oldest events (off: the newest)
    "func_stack_trace": False,  # function: a stack trace after every event
    "sleep-time": True,  # durations include time suspended (generators, coroutines)
    "graph-time": True,  # profiler: time includes children (off: self time)
    "funcgraph-overrun": False,
    "funcgraph-cpu": True,  # the thread column (the kernel's CPU column)
    "funcgraph-overhead": True,  # the + ! # * @ $ duration marks
    "funcgraph-proc": False,  # thread name-tid column
    "funcgraph-duration": True,
    "funcgraph-abstime": False,
    "funcgraph-tail": False,  # ``} /* func */`` on every close
    "funcgraph-retval": False,  # return values (and exceptions)
    "funcgraph-args": False,  # arguments at entry
}

_repr: Any = None  # made at the first use: reprlib is not loaded at start-up (~0.3 ms)


def bounded_reprs() -> Any:
    """The limits of the reprs recorded for return values and arguments, made once (a tracer
    that records them calls this as it starts, not in its first handler)."""
    global _repr
    if _repr is None:
        import reprlib

        r = reprlib.Repr()
        r.maxstring = 60
        r.maxother = 60
        r.maxlong = 40
        r.maxlevel = 3
        _repr = r
    return _repr


def bounded_repr(value: Any) -> str:
    """A short repr that never raises (the traced program's __repr__ may)."""
    try:
        return bounded_reprs().repr(value)
    except Exception as e:  # noqa: BLE001 - any failure of user code is reported, not raised
        return f"<repr failed: {type(e).__name__}>"


def format_args(code: CodeType, frame: FrameType | None) -> str:
    """``a=1, b='x'`` for the call's parameters, read from its frame at entry."""
    if frame is None:
        return ""
    n = code.co_argcount + code.co_kwonlyargcount
    n += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
    local = frame.f_locals
    return ", ".join(f"{name}={bounded_repr(local[name])}"
                     for name in code.co_varnames[:n] if name in local)


class OptionError(ValueError):
    """An unknown option or a bad value."""


class Options:
    """The trace options: ``options/NAME`` files and the ``trace_options`` file."""

    def __init__(self, values: dict[str, bool] | None = None) -> None:
        self._values = dict(OPTION_DEFAULTS)
        for name, value in (values or {}).items():
            self.set(name, value)

    def __getitem__(self, name: str) -> bool:
        try:
            return self._values[name]
        except KeyError:
            raise OptionError(self._unknown(name)) from None

    def set(self, name: str, value: bool) -> None:
        if name not in self._values:
            raise OptionError(self._unknown(name))
        self._values[name] = bool(value)

    def write(self, text: str) -> None:
        """``echo NAME > trace_options`` sets, ``echo noNAME`` clears."""
        for word in text.split():
            on = not (word.startswith("no") and word[2:] in self._values)
            self.set(word if on else word[2:], on)

    def read(self) -> str:
        """What ``cat trace_options`` shows: one option per line, ``no`` for off."""
        return "".join(f"{'' if v else 'no'}{k}\n" for k, v in sorted(self._values.items()))

    def as_dict(self) -> dict[str, bool]:
        return dict(self._values)

    @staticmethod
    def names() -> list[str]:
        return sorted(OPTION_DEFAULTS)

    def _unknown(self, name: str) -> str:
        return f"unknown trace option {name!r} (known: {', '.join(self.names())})"


class TraceContext:
    """One trace instance's state, shared by its tracers (a tracefs instance directory)."""

    def __init__(self, engine: Engine | None = None, registry: Registry | None = None,
                 buffer_size_kb: int = 1408) -> None:
        self.engine = engine or get_engine()
        self.registry = registry or self.engine.registry
        self.options = Options()
        self.buffer = TraceBuffer(buffer_size_kb, overwrite=True)
        self.formats: FormatRegistry = builtin_registry()
        # set_ftrace_filter / set_ftrace_notrace: the functions tracers hook.
        self.ftrace_filter = FunctionFilter(registry=self.registry)
        # set_graph_function / set_graph_notrace: where function_graph starts and stops.
        self.graph_function = FunctionFilter(registry=self.registry)
        self.graph_notrace = FunctionFilter(registry=self.registry)
        self.max_graph_depth = 0  # 0: no limit
        self.tracing_thresh_ns = 0  # 0: off
        # The built-in tracers' users in C where they can run (tracers/native.py decides).
        self.native_users = True

    def name(self, code: CodeType) -> str:
        return self.registry.name(code)

    def now(self) -> int:
        return clock_ns()


class Tracer:
    """A tracer the control surface can switch to (``current_tracer``)."""

    name = "nop"
    #: Options this tracer reads (for ``rethook list -o``).
    uses_options: tuple[str, ...] = ()

    def start(self, ctx: TraceContext) -> None:
        """Begin tracing into ``ctx.buffer`` (register engine users)."""

    def stop(self) -> None:
        """Stop tracing (unregister engine users). Events stay in the buffer."""

    def update_filters(self) -> None:
        """The context's filters changed: apply them (default: restart)."""
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            self.stop()
            self.start(ctx)


class OpsTracer(Tracer):
    """A tracer that is one engine user, made by ``make_ops`` when tracing starts."""

    def __init__(self) -> None:
        self.ops: Any = None
        self.ctx: TraceContext | None = None

    def make_ops(self, ctx: TraceContext) -> Any:
        raise NotImplementedError

    def start(self, ctx: TraceContext) -> None:
        self.ctx = ctx
        ops = self.make_ops(ctx)
        try:
            if isinstance(ops, FtraceOps):
                ctx.engine.register_ftrace_function(ops)
            else:
                ctx.engine.register_ftrace_graph(ops)
        except BaseException:
            closing = getattr(ops, "close", None)
            if closing is not None:
                closing()
            raise
        self.ops = ops  # only once registered: stop() unregisters what start() registered

    def stop(self) -> None:
        ops, self.ops = self.ops, None
        if ops is None:
            return
        closing = getattr(ops, "close", None)
        if closing is not None:
            closing()
        if isinstance(ops, FtraceOps):
            self.ctx.engine.unregister_ftrace_function(ops)
        else:
            self.ctx.engine.unregister_ftrace_graph(ops)


class NopTracer(Tracer):
    """``nop``: traces nothing (probe events and commands still work)."""
