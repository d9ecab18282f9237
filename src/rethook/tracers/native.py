"""Which users the built-in tracers run: native (C, ``_native.c``) or pure Python.

The ``function`` and ``function_graph`` tracers and the function profiler each exist twice:
the Python users in function.py, function_graph.py and profiler.py (the reference), and
native users whose handlers are written in C and write fixed-size records into the calling
thread's C ring (buffer/cring.h). Both make the same events; readers turn the records into
the same tuples, so every view and file is the same.

:func:`native_unavailable` is the one place that decides: native users run when the
engine's core can run them (its ``capabilities.native_users``: the C core's;
``RETHOOK_ENGINE=python`` forces the pure core, and with it these Python users), both
extensions are built, the context allows them (``TraceContext.native_users``) and the options
ask for nothing only Python can do: ``funcgraph-args`` and ``funcgraph-retval`` format the
program's values with ``repr``, ``func_stack_trace`` walks frames.
"""

from __future__ import annotations

from rethook.engine.capabilities import Capabilities
from rethook.tracers.base import TraceContext

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:
    from rethook.tracers import _native
except ImportError as e:  # not built: the Python users run
    _native: Any = None
    _WHY_NOT_BUILT = f"the native users are not built ({e})"
else:
    _WHY_NOT_BUILT = ""

#: Options whose work only the Python users do, per tracer.
PYTHON_ONLY_OPTIONS = {
    "function": ("func_stack_trace",),
    "function_graph": ("funcgraph-args", "funcgraph-retval"),
    "profile": (),
}


def native_unavailable(ctx: TraceContext, kind: str) -> str | None:
    """Why the ``kind`` tracer's native user cannot run in ``ctx``, or None if it can."""
    if _native is None:
        return _WHY_NOT_BUILT
    if not ctx.engine.core.capabilities.native_users:
        return f"the engine's {ctx.engine.core.name} core runs no native users"
    if not ctx.native_users:
        return "native users are turned off for this trace (TraceContext.native_users)"
    if kind != "profile" and not ctx.buffer.native_available():
        return "the C ring buffer is not built"
    on = [name for name in PYTHON_ONLY_OPTIONS[kind] if ctx.options[name]]
    if on:
        return f"option {', '.join(on)} needs the Python user"
    return None


def users_note(caps: Capabilities) -> str:
    """One line for ``rethook --version``: which users the built-in tracers run."""
    if _native is None:
        return f"tracers: Python users ({_WHY_NOT_BUILT})"
    if not caps.native_users:
        return f"tracers: Python users (the engine's {caps.name} core runs no native users)"
    return ("tracers: native users (function, function_graph, profiler in C; "
            "Python users for funcgraph-args, funcgraph-retval, func_stack_trace)")


def native_user(kind: str, ctx: TraceContext | None = None, **params: Any) -> Any:
    """A ``_native.NativeUser`` of ``kind`` writing into ``ctx.buffer`` (not for the profiler)."""
    if ctx is not None:
        params.update(buffer=ctx.buffer, name_of=ctx.registry.name)
    return _native.NativeUser(kind, **params)


def install_handlers(ops: Any, user: Any, names: tuple[str, ...]) -> None:
    """Put the native user's C handlers where the engine reads them, on the ops object."""
    ops.native = user
    for name in names:
        setattr(ops, name, user.handler(name))


GRAPH_HANDLERS = ("entryfunc", "retfunc", "suspendfunc", "resumefunc")
