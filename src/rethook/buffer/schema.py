"""The event schema: every built-in record type, its field order and its flag bits, defined once.

Python tracers append these events; the native users write C records of the same types
(buffer/cring.h's ``RH_*`` are these ids); the ring's decoders (``_cring.c``, :mod:`.native`),
the fused drain (``_tfenc.c``), the trace file, renderers and exporters read them back by
name. The C modules export their numbers and are checked against this module when imported
(:func:`rethook.buffer.native.check_c_schema`, tracefile.py against ``_tfenc.RING_LAYOUTS``),
so a C twin that disagrees is not used. Ids are fixed so that every trace file of this version
numbers them alike; probe events (registered at run time) take ids from ``FIRST_DYNAMIC_ID``.
``rethook.tracers.formats`` re-exports this module for the tracers.
"""

from __future__ import annotations

from rethook.buffer.events import EventFormat, FormatRegistry
from rethook.engine.core import FLAG_CLOSED, FLAG_UNFINISHED

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

#: ``funcgraph_exit.flags``: the engine's return-handler flags, plus the tracers' own bit.
EXIT_FLAGS = {
    "unfinished": FLAG_UNFINISHED,  # still open at teardown (unregister, stop, thread end)
    "closed": FLAG_CLOSED,  # a suspended generator closed or collected without an event
    "raised": 4,  # the call ended with an exception; ``retval`` holds its repr
}
EXIT_RAISED = EXIT_FLAGS["raised"]

#: The formats the native users' C records become (cring.h's ``RH_*`` = these ids), and the
#: order of the values a raw record has (``Ring.events()``/``Ring.consume()`` without a
#: name function, and :func:`rethook.buffer.native.decode`'s input).
NATIVE_FORMATS = (FUNCTION, FUNCGRAPH_ENTRY, FUNCGRAPH_EXIT, FUNCGRAPH_SUSPEND, FUNCGRAPH_RESUME)
#: A native function record's ``flags`` bit: its ``depth`` is the caller's instruction offset
#: (bytes), not its line; readers turn it into the line (the writer leaves that work to them).
#: Raw records and events always carry the line.
CALLER_OFFSET = 1 << 30
RAW_RECORD_FIELDS = ("type", "ts", "code", "parent", "depth", "calltime", "sleep", "flags",
                     "overrun")


def builtin_registry() -> FormatRegistry:
    """A format registry holding the built-in formats, for a new trace."""
    return FormatRegistry(BUILTIN)
