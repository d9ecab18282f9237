"""Command-line parsing shared by the commands that run a program.

trace-cmd's rule is that everything from the program on belongs to the program:
``rethook record -l main prog.py -x --y`` passes ``-x --y`` to ``prog.py``, and
``rethook record -m pkg.tool -v`` passes ``-v`` to the module. Click would read those as its
own options, so :class:`ProgramCommand` finds where the program starts before Click sees the
arguments and hands the rest over behind a ``--``. The flags themselves are declared once, as
data, in :mod:`rethook.cli.options`; :func:`click_option` makes their click options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from rethook.cli import options
from rethook.cli.options import (
    BLOCKING,
    MANY,
    MODULE,
    OPTIONS,
    OUTPUT,
    PROFILE_FLAGS,
    SWITCH,
    TRACE_FLAGS,
    Flag,
    split_program_args,
)

if TYPE_CHECKING:  # the runner loads the engine: only the command that runs a program needs it
    from rethook.runner.settings import TraceSettings


def probe_groups(args: list[str],
                 takes_value: set[str] = frozenset()) -> list[tuple[str, list[str], list[str]]]:
    """trace-cmd's ``-e EVENT [-f FILTER] [-R TRIGGER]...``: each -f/-R applies to the -e
    before it, which Click's per-option lists cannot tell, so the order is read here.
    ``takes_value``: the other flags that take the next argument as their value (``-l -f``
    filters on a function named '-f')."""
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
        else:
            if arg in takes_value:
                i += 1
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
            ctx.meta["probe_events"] = probe_groups(own, takes_value)
        if program or "--" in args:
            own = [*own, "--", *program]
        return super().parse_args(ctx, own)


def program_argument(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.argument("program", nargs=-1, type=click.UNPROCESSED,
                          metavar="[--] SCRIPT [ARGS]... | -m MODULE [ARGS]...")(f)


def module_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click_option(MODULE)(f)


def click_option(flag: Flag) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click option of one flag of :mod:`rethook.cli.options`' table."""
    kw: dict[str, Any] = {"metavar": flag.metavar, "help": flag.help,
                          "show_default": flag.show_default}
    if flag.takes == SWITCH:
        kw.update(is_flag=True, flag_value=flag.flag_value, default=flag.default)
    else:
        kw.update(multiple=flag.takes == MANY, default=flag.default)
        if flag.bounds is not None:
            kw["type"] = Bounded(flag)
        elif flag.choices is not None:
            kw["type"] = click.Choice(flag.choices)
    return click.option(*flag.decls, flag.dest, **kw)


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


class Bounded(click.ParamType):
    """An integer flag with its range (from :mod:`rethook.limits`), read as the flag reads it
    (:meth:`Flag.convert`: without ``int()``'s digit limit): out of range is a usage error that
    says the range."""

    name = "integer"

    def __init__(self, flag: Flag) -> None:
        self.flag = flag

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        try:
            return self.flag.convert(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


BLOCKING_OPTION = click_option(BLOCKING)
OUTPUT_OPTION = click_option(OUTPUT)


def trace_options(graph: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The trace flags, in trace-cmd's order: record and stream take them all (``graph``),
    with the probe events after -O; profile only the filters and -O."""
    flags = TRACE_FLAGS if graph else PROFILE_FLAGS
    chosen = [click_option(flag) for flag in flags]
    if graph:
        at = flags.index(OPTIONS)
        chosen[at:at] = [_EVENT_OPTION, *_EVENT_FILTER_OPTIONS]

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for deco in reversed(chosen):
            f = deco(f)
        return f

    return decorate


def settings_from(params: dict[str, Any], tracer: str | None = None) -> TraceSettings:
    """TraceSettings from a command's click parameters (the probe events in their order on
    the command line, as :class:`ProgramCommand` read them)."""
    ctx = click.get_current_context(silent=True)
    groups = ctx.meta.get("probe_events") if ctx is not None else None
    return options.settings_from(params, tracer, groups)


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
