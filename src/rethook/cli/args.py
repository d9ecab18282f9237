"""Command-line parsing shared by the commands that run a program.

trace-cmd's rule is that everything from the program on belongs to the program:
``rethook record -l main prog.py -x --y`` passes ``-x --y`` to ``prog.py``, and
``rethook record -m pkg.tool -v`` passes ``-v`` to the module. Click would read those as its
own options, so :class:`ProgramCommand` finds where the program starts before Click sees the
arguments and hands the rest over behind a ``--``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from rethook import limits
from rethook.tracers import TRACER_NAMES

if TYPE_CHECKING:  # the runner loads the engine: only the command that runs a program needs it
    from rethook.runner.settings import TraceSettings

#: Default ``-b`` of record and stream (KiB per thread): about 64k events.
RECORD_BUFFER_KB = 8192
#: record's --blocking-timeout: longer than a drain thread is ever descheduled on a busy
#: machine, short enough that a drain stuck for good (a full disk) stalls the program once
RECORD_BLOCKING_MS = 1000

#: Options that name a module to run; what follows them is the module's arguments.
MODULE_OPTS = ("-m", "--module")


def split_program_args(args: list[str], takes_value: set[str],
                       optional_value: set[str] = frozenset()) -> tuple[list[str], list[str]]:
    """Split ``args`` into (rethook's own, the program's).

    The program starts at the first positional argument (the script), after ``--``, or after
    ``-m MODULE`` (which stays with rethook's own, so Click records the module name).
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


def probe_groups(args: list[str]) -> list[tuple[str, list[str], list[str]]]:
    """trace-cmd's ``-e EVENT [-f FILTER] [-R TRIGGER]...``: each -f/-R applies to the -e
    before it, which Click's per-option lists cannot tell, so the order is read here."""
    groups: list[tuple[str, list[str], list[str]]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            break
        for flag in ("-e", "-f", "-R"):
            if arg == flag or (arg.startswith(flag) and not arg.startswith("--")):
                value = arg[2:] if len(arg) > 2 else (args[i + 1] if i + 1 < len(args) else "")
                i += 0 if len(arg) > 2 else 1
                if flag == "-e":
                    groups.append((value, [], []))
                elif not groups:
                    raise click.UsageError(f"{flag} {value!r} must follow the -e it applies to")
                else:
                    groups[-1][1 if flag == "-f" else 2].append(value)
                break
        i += 1
    return groups


class ProgramCommand(click.Command):
    """A command whose trailing arguments are a program and its arguments, untouched."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value: set[str] = set()
        optional_value: set[str] = set()
        for param in self.get_params(ctx):
            if not isinstance(param, click.Option) or param.is_flag or param.count:
                continue
            names = {*param.opts, *param.secondary_opts}
            if getattr(param, "_flag_needs_value", False):
                optional_value |= names
            else:
                takes_value |= names
        own, program = split_program_args(list(args), takes_value, optional_value)
        if any(isinstance(p, click.Option) and p.name == "events" for p in self.params):
            ctx.meta["probe_events"] = probe_groups(own)
        if program or "--" in args:
            own = [*own, "--", *program]
        return super().parse_args(ctx, own)


def program_argument(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.argument("program", nargs=-1, type=click.UNPROCESSED,
                          metavar="[--] SCRIPT [ARGS]... | -m MODULE [ARGS]...")(f)


def module_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("-m", "--module", "module", metavar="MODULE",
                        help="Run library module MODULE as a script, like python -m; "
                             "the arguments after it are the module's.")(f)


def _tracer_option() -> Callable[..., Any]:
    return click.option("-p", "tracer", type=click.Choice(TRACER_NAMES), default="function_graph",
                        show_default=True, metavar="TRACER",
                        help=f"The tracer (current_tracer): {', '.join(TRACER_NAMES)}.")


_FILTER_OPTIONS = [
    click.option("-l", "filters", multiple=True, metavar="FILTER",
                 help="Trace only functions matching FILTER (set_ftrace_filter, appended; "
                      "ftrace syntax: 'name', 'glob*', '*:mod:MODULE', '!glob'). Repeatable. "
                      "Default: the program's own code (its __main__ and the modules it "
                      "imports from its own directory or package)."),
    click.option("-n", "notrace", multiple=True, metavar="FILTER",
                 help="Do not trace functions matching FILTER (set_ftrace_notrace). "
                      "Repeatable."),
]

_GRAPH_OPTIONS = [
    click.option("-g", "graph_functions", multiple=True, metavar="FILTER",
                 help="function_graph: graph only calls under functions matching FILTER "
                      "(set_graph_function). They must be traced too (see -l). Repeatable."),
    click.option("--graph-notrace", "graph_notrace", multiple=True, metavar="FILTER",
                 help="function_graph: leave out functions matching FILTER and everything "
                      "they call (set_graph_notrace). Repeatable."),
]

_EVENT_OPTION = click.option(
    "-e", "events", multiple=True, metavar="PROBE",
    help="Define a probe event and enable it (dynamic_events syntax: "
         "'p:GRP/NAME FUNC ARG=FETCH...' at entry, 'r:GRP/NAME FUNC ret=$retval' at return, "
         "'f:...'). Repeatable.")

_EVENT_FILTER_OPTIONS = [
    click.option("-f", "event_filters", multiple=True, metavar="FILTER",
                 help="Filter for the preceding -e event (events/GRP/EVENT/filter syntax: "
                      "'ret > 0 && comm == \"worker\"'). Repeatable, one per -e."),
    click.option("-R", "event_triggers", multiple=True, metavar="TRIGGER",
                 help="Trigger for the preceding -e event: traceon, traceoff, stacktrace "
                      "(':COUNT', ' if FILTER') or 'hist:keys=...'. Repeatable."),
]

_OPTION_OPTION = click.option(
    "-O", "options", multiple=True, metavar="OPTION",
    help="Set trace option OPTION, or clear it with noOPTION (e.g. -O funcgraph-retval, "
         "-O nofuncgraph-duration). Repeatable; see 'rethook list -o'.")

class Bounded(click.ParamType):
    """An integer option with its range (from :mod:`rethook.limits`), read without ``int()``'s
    digit limit: out of range is a usage error that says the range."""

    name = "integer"

    def __init__(self, bounds: tuple[int, int]) -> None:
        self.bounds = bounds

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        try:
            return limits.checked_int(str(value), self.bounds)
        except limits.NumberError as e:
            self.fail(str(e), param, ctx)


_LIMIT_OPTIONS = [
    click.option("--max-graph-depth", type=Bounded(limits.MAX_GRAPH_DEPTH), metavar="N",
                 help="function_graph: record calls only down to depth N (0: no limit)."),
    click.option("--tracing-thresh", type=Bounded(limits.TRACING_THRESH_US), metavar="USECS",
                 help="function_graph: record only calls longer than USECS microseconds."),
    click.option("-b", "buffer_kb", type=Bounded(limits.BUFFER_KB), metavar="KB",
                 default=RECORD_BUFFER_KB, show_default=True,
                 help="Ring buffer size per thread, in KiB (buffer_size_kb). Larger than the "
                      "kernel's 1408: the thread that saves events shares the GIL with the "
                      "program, so the buffer must absorb longer bursts."),
]


BLOCKING_OPTION = click.option(
    "--blocking-timeout", "blocking_ms", type=Bounded(limits.BLOCKING_MS), metavar="MS",
    default=RECORD_BLOCKING_MS, show_default=True,
    help="When a thread's buffer is three quarters full, the program's threads wait for "
         "rethook to write it out, up to MS milliseconds, rather than lose events (LTTng's "
         "blocking-timeout). 0: never wait; what does not fit is lost, and counted.")


_FOLLOW_OPTION = click.option(
    "--no-follow", "follow", is_flag=True, flag_value=False, default=True,
    help="Do not trace the processes the program starts (by default forks, multiprocessing "
         "workers and the Python programs it runs are traced too, into the same result).")


def trace_options(graph: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The trace flags, in trace-cmd's order: record and stream take them all (``graph``),
    profile only the filters and -O."""
    chosen = ([_tracer_option(), *_FILTER_OPTIONS, *_GRAPH_OPTIONS, _EVENT_OPTION,
               *_EVENT_FILTER_OPTIONS, _OPTION_OPTION, *_LIMIT_OPTIONS, _FOLLOW_OPTION]
              if graph else [*_FILTER_OPTIONS, _OPTION_OPTION, _FOLLOW_OPTION])

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for deco in reversed(chosen):
            f = deco(f)
        return f

    return decorate


def settings_from(params: dict[str, Any], tracer: str | None = None) -> TraceSettings:
    """TraceSettings from a command's Click parameters."""
    from rethook.runner.settings import TraceSettings

    ctx = click.get_current_context(silent=True)
    groups = ctx.meta.get("probe_events") if ctx is not None else None
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


def check_sort(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--sort``: a column of the profile table (or cProfile's name for it)."""
    if value is None:
        return None
    from rethook.output.profile import SORT_COLUMNS, SORT_KEYS

    if value not in SORT_KEYS:
        aliases = ", ".join(k for k in SORT_KEYS if k not in SORT_COLUMNS)
        raise click.BadParameter(f"{value!r} is not a column: {', '.join(SORT_COLUMNS)} "
                                 f"(or cProfile's {aliases})")
    return value


def attach_options(duration: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option("--children", is_flag=True,
                         help="With -P: the processes below PID that listen too (a run's "
                              "followed children).")(f)
        if duration:
            f = click.option("--duration", type=click.FloatRange(min=0, min_open=True),
                             metavar="SECS",
                             help="With -P: stop after SECS seconds (default: at Ctrl-C, or "
                                  "when the program ends).")(f)
        return click.option("-P", "pid", type=click.IntRange(min=1), metavar="PID",
                            help="Trace the running process PID instead of starting a program "
                                 "(it listens: 'rethook run', or opted in; docs/control.md)."
                            )(f)
    return decorate


def running_target(ctx: click.Context, params: dict[str, Any], module: str | None,
                   program: tuple[str, ...]) -> int | None:
    """The -P PID, checked against the other arguments (None without -P)."""
    pid = params.pop("pid", None)
    children = params.get("children", False)
    duration = params.get("duration")
    if pid is None:
        if children or duration is not None:
            raise click.UsageError("--children and --duration go with -P PID", ctx)
        return None
    if module is not None or program:
        raise click.UsageError("-P PID traces a running process: give no program", ctx)
    return int(pid)
