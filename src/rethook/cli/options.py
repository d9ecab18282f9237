"""The trace flags of the commands that run a program, as data.

One table (:data:`TRACE_FLAGS`, and ``record``'s :data:`OUTPUT`) says each flag's spellings,
the parameter it sets, how it takes a value, its default and its help. The click commands are
built from it (:mod:`rethook.cli.args`), and :mod:`rethook.cli.quick` parses ``rethook record``
with it without importing click. :func:`split_program_args` tells rethook's own arguments from
the program's, and :func:`settings_from` turns the parsed parameters into TraceSettings.

This module imports no click: the quick path must not load it.
"""

from __future__ import annotations

from rethook import limits
from rethook.frozen import Frozen
from rethook.tracers import TRACER_NAMES

TYPE_CHECKING = False
if TYPE_CHECKING:  # the runner loads the engine: only the command that runs a program needs it
    from typing import Any

    from rethook.runner.settings import TraceSettings

#: Default ``-b`` of record and stream (KiB per thread): about 64k events.
RECORD_BUFFER_KB = 8192
#: record's --blocking-timeout: longer than a drain thread is ever descheduled on a busy
#: machine, short enough that a drain stuck for good (a full disk) stalls the program once
RECORD_BLOCKING_MS = 1000

#: Options that name a module to run; what follows them is the module's arguments.
MODULE_OPTS = ("-m", "--module")

#: How a flag takes its value: one (the last given wins), a list (repeatable), or none (a
#: switch that sets ``flag_value``).
ONE, MANY, SWITCH = "one", "many", "switch"


class Flag(Frozen):
    """One flag: ``decls`` its spellings, ``dest`` the parameter it sets, ``takes`` ONE, MANY
    or SWITCH, ``bounds`` an integer's range (:mod:`rethook.limits`), ``choices`` the values
    allowed, ``flag_value`` what a SWITCH sets."""

    __slots__ = ("decls", "dest", "takes", "default", "metavar", "help", "bounds", "choices",
                 "flag_value", "show_default")

    def __init__(self, decls: tuple[str, ...], dest: str, takes: str, help: str, *,
                 default: Any = None, metavar: str | None = None,
                 bounds: tuple[int, int] | None = None, choices: tuple[str, ...] | None = None,
                 flag_value: Any = None, show_default: bool = False) -> None:
        for name, value in (("decls", decls), ("dest", dest), ("takes", takes),
                            ("default", () if takes == MANY else default),
                            ("metavar", metavar), ("help", help), ("bounds", bounds),
                            ("choices", choices), ("flag_value", flag_value),
                            ("show_default", show_default)):
            object.__setattr__(self, name, value)

    def convert(self, text: str) -> Any:
        """The value ``text`` gives this flag; ValueError (with the reason) if it is not one."""
        if self.bounds is not None:
            try:
                return limits.checked_int(text, self.bounds)
            except limits.NumberError as e:
                raise ValueError(str(e)) from None
        if self.choices is not None and text not in self.choices:
            raise ValueError(f"{text!r} is not one of {', '.join(map(repr, self.choices))}")
        return text


TRACER = Flag(("-p",), "tracer", ONE, f"The tracer (current_tracer): {', '.join(TRACER_NAMES)}.",
              default="function_graph", metavar="TRACER", choices=TRACER_NAMES,
              show_default=True)

FILTERS = (
    Flag(("-l",), "filters", MANY, metavar="FILTER",
         help="Trace only functions matching FILTER (set_ftrace_filter, appended; "
              "ftrace syntax: 'name', 'glob*', '*:mod:MODULE', '!glob'). Repeatable. "
              "Default: the program's own code (its __main__ and the modules it "
              "imports from its own directory or package)."),
    Flag(("-n",), "notrace", MANY, metavar="FILTER",
         help="Do not trace functions matching FILTER (set_ftrace_notrace). Repeatable."),
)

GRAPH = (
    Flag(("-g",), "graph_functions", MANY, metavar="FILTER",
         help="function_graph: graph only calls under functions matching FILTER "
              "(set_graph_function). They must be traced too (see -l). Repeatable."),
    Flag(("--graph-notrace",), "graph_notrace", MANY, metavar="FILTER",
         help="function_graph: leave out functions matching FILTER and everything "
              "they call (set_graph_notrace). Repeatable."),
)

OPTIONS = Flag(("-O",), "options", MANY, metavar="OPTION",
               help="Set trace option OPTION, or clear it with noOPTION (e.g. -O "
                    "funcgraph-retval, -O nofuncgraph-duration). Repeatable; see "
                    "'rethook list -o'.")

LIMITS = (
    Flag(("--max-graph-depth",), "max_graph_depth", ONE, bounds=limits.MAX_GRAPH_DEPTH,
         metavar="N", help="function_graph: record calls only down to depth N (0: no limit)."),
    Flag(("--tracing-thresh",), "tracing_thresh", ONE, bounds=limits.TRACING_THRESH_US,
         metavar="USECS", help="function_graph: record only calls longer than USECS "
                               "microseconds."),
    Flag(("-b",), "buffer_kb", ONE, bounds=limits.BUFFER_KB, metavar="KB",
         default=RECORD_BUFFER_KB, show_default=True,
         help="Ring buffer size per thread, in KiB (buffer_size_kb). Larger than the "
              "kernel's 1408: the thread that saves events shares the GIL with the "
              "program, so the buffer must absorb longer bursts."),
)

FOLLOW = Flag(("--no-follow",), "follow", SWITCH, flag_value=False, default=True,
              help="Do not trace the processes the program starts (by default forks, "
                   "multiprocessing workers and the Python programs it runs are traced too, "
                   "into the same result).")

BLOCKING = Flag(("--blocking-timeout",), "blocking_ms", ONE, bounds=limits.BLOCKING_MS,
                metavar="MS", default=RECORD_BLOCKING_MS, show_default=True,
                help="When a thread's buffer is three quarters full, the program's threads "
                     "wait for rethook to write it out, up to MS milliseconds, rather than "
                     "lose events (LTTng's blocking-timeout). 0: never wait; what does not "
                     "fit is lost, and counted.")

OUTPUT = Flag(("-o",), "output", ONE, default="trace.dat", show_default=True, metavar="FILE",
              help="Write the trace to FILE.")

MODULE = Flag(MODULE_OPTS, "module", ONE, metavar="MODULE",
              help="Run library module MODULE as a script, like python -m; the arguments "
                   "after it are the module's.")

#: The trace flags every program command of record's kind takes (-e, -f and -R, the probe
#: events, are click's alone: their order matters, see args.probe_groups).
TRACE_FLAGS = (TRACER, *FILTERS, *GRAPH, OPTIONS, *LIMITS, FOLLOW)
#: profile's: the filters and -O.
PROFILE_FLAGS = (*FILTERS, OPTIONS, FOLLOW)


def split_program_args(args: list[str], takes_value: set[str],
                       optional_value: set[str] = frozenset()) -> tuple[list[str], list[str]]:
    """Split ``args`` into (rethook's own, the program's).

    The program starts at the first positional argument (the script), after ``--``, or after
    ``-m MODULE`` (which stays with rethook's own, so the parser records the module name).
    """
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args[:i], args[i + 1:]
        if arg in MODULE_OPTS:
            return args[:i + 2], args[i + 2:]
        if arg.startswith("--module=") or (arg.startswith("-m") and not arg.startswith("--")):
            return args[:i + 1], args[i + 1:]
        if not arg.startswith("-") or arg == "-":
            return args[:i], args[i:]
        if arg in takes_value:
            i += 2
        elif arg in optional_value and i + 1 < len(args) and not args[i + 1].startswith("-"):
            i += 2
        else:
            i += 1  # a flag, --name=value, or -xVALUE
    return args, []


def settings_from(params: dict[str, Any], tracer: str | None = None,
                  groups: list[tuple[str, list[str], list[str]]] | None = None
                  ) -> TraceSettings:
    """TraceSettings from a command's parameters; ``groups``: the probe events, each with
    its filters and triggers (default: ``params["events"]`` alone)."""
    from rethook.runner.settings import TraceSettings

    if groups is None:
        groups = [(e, [], []) for e in params.get("events", ())]
    return TraceSettings(
        tracer=tracer or params.get("tracer") or "function_graph",
        filters=list(params.get("filters", ())),
        notrace=list(params.get("notrace", ())),
        graph_functions=list(params.get("graph_functions", ())),
        graph_notrace=list(params.get("graph_notrace", ())),
        events=[e for e, _, _ in groups],
        event_filters={e: f for e, f, _ in groups if f},
        event_triggers={e: r for e, _, r in groups if r},
        options=list(params.get("options", ())),
        max_graph_depth=params.get("max_graph_depth"),
        tracing_thresh=params.get("tracing_thresh"),
        buffer_kb=params.get("buffer_kb"),
        follow=params.get("follow", True),
        blocking_ms=params.get("blocking_ms"),
    )
