"""The event formats the built-in tracers record (the kernel's ``events/ftrace/*/format``).

They are defined once, with the native records' types and the flag bits, in
:mod:`rethook.buffer.schema` (the buffer's layer, which the C ring and the trace file read);
this module is the tracers' name for it.
"""

from rethook.buffer.schema import (
    BUILTIN,
    EXIT_FLAGS,
    EXIT_RAISED,
    FIRST_DYNAMIC_ID,
    FUNCGRAPH_ENTRY,
    FUNCGRAPH_EXIT,
    FUNCGRAPH_RESUME,
    FUNCGRAPH_SUSPEND,
    FUNCTION,
    PRINT,
    STACKTRACE,
    builtin_registry,
)

__all__ = ["BUILTIN", "EXIT_FLAGS", "EXIT_RAISED", "FIRST_DYNAMIC_ID", "FUNCGRAPH_ENTRY",
           "FUNCGRAPH_EXIT", "FUNCGRAPH_RESUME", "FUNCGRAPH_SUSPEND", "FUNCTION", "PRINT",
           "STACKTRACE", "builtin_registry"]
