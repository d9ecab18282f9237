"""The event formats the built-in tracers record (the kernel's ``events/ftrace/*/format``).

One place, because tracers write these events, and renderers, the trace file reader and the
exporters read them back by name. Ids are fixed so that every trace file of this version
numbers them alike; probe events (registered at run time) take ids from ``FIRST_DYNAMIC_ID``.
"""

from __future__ import annotations

from rethook.buffer.events import EventFormat, FormatRegistry

#: ``func <-parent``: one per call seen by the function tracer.
FUNCTION = EventFormat(1, "function", (
    ("func", "str"), ("parent", "str"), ("parent_line", "u64")))

#: A function_graph entry. ``args`` is empty unless funcgraph-args is set.
FUNCGRAPH_ENTRY = EventFormat(2, "funcgraph_entry", (
    ("depth", "u64"), ("func", "str"), ("args", "str")))

#: A function_graph exit. ``calltime`` is the entry's timestamp (the event's own is the exit's);
#: ``sleep`` the ns spent suspended; ``flags`` the engine's FLAG_* plus EXIT_RAISED;
#: ``retval`` a bounded repr of the value or exception when funcgraph-retval is set.
FUNCGRAPH_EXIT = EventFormat(3, "funcgraph_exit", (
    ("depth", "u64"), ("func", "str"), ("calltime", "u64"), ("overrun", "u64"),
    ("sleep", "u64"), ("flags", "u64"), ("retval", "str")))

#: A generator or coroutine suspended (``yield``/``await``) or resumed: the await points.
FUNCGRAPH_SUSPEND = EventFormat(4, "funcgraph_suspend", (("depth", "u64"), ("func", "str")))
FUNCGRAPH_RESUME = EventFormat(5, "funcgraph_resume", (("depth", "u64"), ("func", "str")))

#: A stack trace (the ``stacktrace`` command and option): innermost first, one per line.
STACKTRACE = EventFormat(6, "kernel_stack", (("stack", "str"),))

#: A message from the tracing machinery itself (``traceon``/``traceoff`` fired, ...).
PRINT = EventFormat(7, "print", (("msg", "str"),))

BUILTIN = (FUNCTION, FUNCGRAPH_ENTRY, FUNCGRAPH_EXIT, FUNCGRAPH_SUSPEND, FUNCGRAPH_RESUME,
           STACKTRACE, PRINT)
FIRST_DYNAMIC_ID = 100

#: ``funcgraph_exit.flags`` bits beyond the engine's FLAG_UNFINISHED (1) and FLAG_CLOSED (2).
EXIT_RAISED = 4  # the call ended with an exception; ``retval`` holds its repr


def builtin_registry() -> FormatRegistry:
    """A format registry holding the built-in formats, for a new trace."""
    return FormatRegistry(BUILTIN)
