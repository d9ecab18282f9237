"""The ``rethook`` command line: trace-cmd's commands and flags for Python programs.

``record``, ``stream`` and ``profile`` run a program (``SCRIPT ARGS`` or ``-m MODULE ARGS``)
under a trace; ``report``, ``export``, ``view``, ``hist`` and ``info`` read a recorded trace
file; ``list`` shows tracers, options and traceable functions; ``demo`` records and shows a
bundled example. See docs/cli.md.

Exit status: a command that runs a program exits with the program's status (as ``python``
would); usage errors (bad flags, unknown tracers or options, filters that match nothing, a
missing script or module) exit with 2; a damaged trace file or a failed write exits with 1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

import rethook
from rethook.cli import running
from rethook.cli.args import (
    BLOCKING_OPTION,
    OUTPUT_OPTION,
    ProgramCommand,
    attach_options,
    check_sort,
    module_option,
    program_argument,
    running_target,
    settings_from,
    trace_options,
)
from rethook.cli.exports import EXPORTERS
from rethook.printable import printable

# Start-up: importing this module loads click and nothing else of weight (``rethook --help``
# stays quick); each command imports what it uses when it runs. tests/test_startup.py checks.

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    import platform

    from rethook.engine.engine import get_engine

    core = get_engine().core
    click.echo(f"rethook {rethook.__version__} (engine: {core.name} core, "
               f"{platform.python_implementation()} {platform.python_version()})")
    note = getattr(core, "note", "")
    if note:
        click.echo(note)
    from rethook.tracers.native import users_note

    click.echo(core.capabilities.describe())
    click.echo(users_note(core.capabilities))
    from rethook.engine import clock

    click.echo(clock.note())
    ctx.exit()


def _engine(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """``--engine``: the same as RETHOOK_ENGINE, set before the engine is made."""
    if value is not None and not ctx.resilient_parsing:
        os.environ["RETHOOK_ENGINE"] = value


@click.group(context_settings=CONTEXT)
@click.option("--engine", type=click.Choice(["c", "python"]), expose_value=False,
              is_eager=True, callback=_engine,
              help="The hook engine's core: c (the default when built) or python (the pure "
                   "reference core, with the Python tracer users). Same as RETHOOK_ENGINE.")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and the hook engine, and exit.")
def cli() -> None:
    """ftrace for Python programs: trace-cmd's commands on CPython's sys.monitoring.

    \b
      rethook record prog.py ARGS      record a function_graph trace into trace.dat
      rethook report                   print it in ftrace's text format
      rethook view                     write it as an HTML page to open in a browser
      rethook stream -m pkg.tool       print events live while the program runs
      rethook profile prog.py          function profiler: hits and times per function
      rethook export --format chrome   for other tools: perfetto, chrome, speedscope, ...
      rethook info                     how a trace was recorded, what it holds
      rethook list -f 'main*' prog.py  what can be traced
      rethook demo                     record and show a bundled example

    By default only the program's own code is traced (its __main__ and the modules it
    imports from its own directory or package); choose functions with -l.
    """


# --- running programs ------------------------------------------------------------------------
@contextmanager
def _usage(ctx: click.Context) -> Iterator[None]:
    """A :class:`running.Usage` error as click shows usage errors: with the command's usage."""
    try:
        yield
    except running.Usage as e:
        raise click.UsageError(str(e), ctx) from None


@cli.command(cls=ProgramCommand, context_settings=CONTEXT)
@trace_options()
@OUTPUT_OPTION
@BLOCKING_OPTION
@attach_options()
@module_option
@program_argument
@click.pass_context
def record(ctx: click.Context, output: str, module: str | None, program: tuple[str, ...],
           **params: Any) -> None:
    """Run a program and record its trace to a file (trace.dat).

    The program runs as 'python SCRIPT ARGS' (or 'python -m MODULE ARGS') would: same
    sys.argv, __main__, output and exit status. Everything after SCRIPT, or after -m MODULE,
    is the program's, flags included. At the end a summary goes to stderr: events recorded,
    events lost, the file and its size.

    \b
    Examples:
      rethook record prog.py --its-own-flag
      rethook record -l 'parse*' -O funcgraph-retval -m mytool.cli input.txt
      rethook record -p function -l 'json.*' -o json.dat prog.py
      rethook record -P 4242 --duration 10       (a running program: docs/control.md)
    """
    pid = running_target(ctx, params, module, program)
    if pid is not None:
        from rethook.cli.ctl import record_running

        sys.exit(record_running(pid, params["children"], settings_from(params), output,
                                params["duration"]))
    with _usage(ctx):
        running.record_program(module, program, lambda: settings_from(params), output)


@cli.command(cls=ProgramCommand, context_settings=CONTEXT)
@trace_options()
@attach_options(duration=False)
@module_option
@program_argument
@click.pass_context
def stream(ctx: click.Context, module: str | None, program: tuple[str, ...],
           **params: Any) -> None:
    """Run a program and print its events live, as trace_pipe does.

    Same flags as record (but no -o): lines appear on stdout while the program runs. A
    summary line (events, lost events) goes to stderr at the end. With -P PID, the events of
    a running process, until Ctrl-C.
    """
    pid = running_target(ctx, params, module, program)
    if pid is not None:
        from rethook.cli.ctl import stream_running

        sys.exit(stream_running(pid, params["children"], settings_from(params)))
    with _usage(ctx):
        running.stream_program(module, program, lambda: settings_from(params))


@cli.command(cls=ProgramCommand, context_settings=CONTEXT)
@trace_options(graph=False)
@click.option("--per-process", is_flag=True,
              help="With child processes: one table per process instead of one merged table.")
@click.option("--sort", "sort", metavar="COLUMN", callback=check_sort,
              help="Sort by COLUMN: hit, total, self, avg, s2, name, file (or cProfile's "
                   "names: calls, cumtime, tottime, ...). Default: total (self with -O "
                   "nograph-time).")
@click.option("--limit", "limit", type=click.IntRange(min=1), metavar="N",
              help="Print only the first N functions.")
@click.option("-o", "output", metavar="FILE",
              help="Write the profile to FILE as pstats (python -m pstats, snakeviz and "
                   "gprof2dot read it) instead of printing the table.")
@attach_options()
@module_option
@program_argument
@click.pass_context
def profile(ctx: click.Context, module: str | None, program: tuple[str, ...],
            per_process: bool, sort: str | None, limit: int | None, output: str | None,
            **params: Any) -> None:
    """Run a program under the function profiler and print its table at the end.

    The table (to stdout, after the program's own output), all threads and followed child
    processes merged: Function, Hit (calls, each resumption of a generator or coroutine
    counted, as cProfile counts), Total (inclusive time, recursion counted once), Self (time
    minus the calls it made), Avg and s^2 (of one call's inclusive time, as the kernel's
    profiler; self time with -O nograph-time), File:Line. -O nosleep-time leaves out the time
    generators and coroutines spent suspended. With -o FILE the profile goes to a pstats file
    instead. With -P PID, a running process, until Ctrl-C or --duration.
    """
    if output is not None and not _writable(output):
        raise click.UsageError(f"-o {output!r}: cannot write there", ctx)
    show = running.ProfileShow(per_process, sort, limit, output)
    pid = running_target(ctx, params, module, program)
    if pid is not None:
        from rethook.cli.ctl import profile_running

        status = profile_running(pid, params["children"], settings_from(params, tracer="nop"),
                                 params["duration"], show)
        sys.exit(status or (1 if show.failed else 0))
    with _usage(ctx):
        running.profile_program(module, program, lambda: settings_from(params, tracer="nop"),
                                show)


def _writable(path: str) -> bool:
    """Whether ``path`` can be written (checked before the program runs; nothing created)."""
    if os.path.isdir(path):
        return False
    if os.path.exists(path):
        return os.access(path, os.W_OK)
    return os.access(os.path.dirname(os.path.abspath(path)), os.W_OK | os.X_OK)


@cli.command(cls=ProgramCommand, context_settings=CONTEXT)
@click.option("--no-follow", is_flag=True,
              help="Forked children of the program do not open channels of their own.")
@module_option
@program_argument
@click.pass_context
def run(ctx: click.Context, no_follow: bool, module: str | None,
        program: tuple[str, ...]) -> None:
    """Run a program with its control channel open, tracing nothing until asked.

    The program runs as 'python SCRIPT ARGS' would (as under record), at its untraced speed;
    'rethook ctl PID ...', 'rethook record -P PID' and the like then trace it while it runs
    (docs/control.md).
    """
    from rethook.control.tracefs import Tracefs
    from rethook.runner.observers import ControlObserver
    from rethook.runner.run import Session
    from rethook.runner.settings import register_program

    with _usage(ctx):
        prog = running.program_of(module, program)
        running.load(prog)
    fs = Tracefs()
    register_program(fs, prog)
    outcome = Session(prog, fs).run([ControlObserver(prog, follow_forks=not no_follow)])
    running.exit_as(outcome)


@cli.command(context_settings={**CONTEXT, "ignore_unknown_options": True})
@click.option("--children", is_flag=True,
              help="PID and the processes below it that listen (a run's followed children).")
@click.argument("words", nargs=-1, type=click.UNPROCESSED, metavar="[PID [COMMAND...]]")
def ctl(children: bool, words: tuple[str, ...]) -> None:
    """Read and write a running program's tracefs files (docs/control.md).

    \b
      rethook ctl                                 the processes that listen
      rethook ctl PID ls                          its files
      rethook ctl PID cat enabled_functions
      rethook ctl PID echo 'handle*' '>' set_ftrace_filter    (quote the '>')
      rethook ctl PID write current_tracer function_graph
      rethook ctl PID cat trace_pipe              stream until Ctrl-C
    """
    from rethook.cli.ctl import ctl_main

    args = list(words)
    pid = None
    if args and args[0].isdigit():
        pid = int(args.pop(0))
    elif args and args[0] not in ("ls",):
        raise click.UsageError(f"{args[0]!r} is not a process id: rethook ctl PID COMMAND")
    if children and pid is None:
        raise click.UsageError("--children goes with a PID")
    sys.exit(ctl_main(pid, children, args))


@cli.command(context_settings=CONTEXT)
@click.option("-o", "output", default=None, metavar="FILE",
              help="Keep the trace in FILE (default: a temporary file, removed afterwards).")
@click.pass_context
def demo(ctx: click.Context, output: str | None) -> None:
    """Record the bundled example program and print its function graph.

    The example (rethook/examples/demo.py) has recursion, a class with methods and a
    property, a generator, asyncio tasks, an exception caught a few levels up and a second
    thread. It is recorded with function_graph, its own functions only, with
    funcgraph-retval on, then reported.
    """
    import tempfile

    from rethook.cli.reporting import report_file
    from rethook.examples import demo_path
    from rethook.runner.program import Program
    from rethook.runner.settings import TraceSettings

    prog = Program(script=demo_path(), args=[])
    settings = TraceSettings(tracer="function_graph", filters=["*:mod:__main__"],
                             options=["funcgraph-retval"])
    tmpdir = None
    if output is None:
        tmpdir = tempfile.mkdtemp(prefix="rethook-demo-")
        output = os.path.join(tmpdir, "demo.dat")
    try:
        with _usage(ctx):
            outcome = running.record(prog, settings, output)
        if outcome.in_child:
            running.exit_as(outcome)
        sys.stdout.flush()
        click.echo()
        status = report_file(output, ())
    finally:
        if tmpdir is not None:
            for name in os.listdir(tmpdir):
                os.unlink(os.path.join(tmpdir, name))
            os.rmdir(tmpdir)
    sys.exit(outcome.exit_code or status)


# --- reading traces ----------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.option("-i", "input_", default="trace.dat", show_default=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False), help="The trace file to read.")
@click.option("-O", "options", multiple=True, metavar="OPTION",
              help="Override a display option for this report (e.g. -O funcgraph-proc, "
                   "-O nofuncgraph-duration). Repeatable.")
def report(input_: str, options: tuple[str, ...]) -> None:
    """Print a recorded trace in its tracer's text format (ftrace's 'trace' file).

    The file is streamed, so traces of any size print in bounded memory. A damaged file
    prints everything before the damage, then an error naming the file and the byte offset
    (exit status 1).
    """
    from rethook.cli.reporting import report_file

    sys.exit(report_file(input_, options))


@cli.command(context_settings=CONTEXT)
@click.option("-i", "input_", default="trace.dat", show_default=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False), help="The trace file to read.")
@click.option("--format", "fmt", type=click.Choice([*EXPORTERS, "html"]), required=True,
              help="; ".join(f"{name}: {e.help}" for name, e in EXPORTERS.items())
              + "; html: the page 'rethook view' writes.")
@click.option("-o", "output", default=None, metavar="OUT",
              help="Output file ('-' for stdout). Default: the input's name with "
                   + ", ".join(e.suffix for e in EXPORTERS.values()) + " or .html.")
@click.option("--per-thread", "per_thread", is_flag=True,
              help="folded: every stack starts with its thread (name-pid/tid).")
def export(input_: str, fmt: str, output: str | None, per_thread: bool) -> None:
    """Convert a trace file for other tools: Perfetto, Chrome's trace viewer, speedscope,
    flame graphs, pstats, or an HTML page."""
    from rethook.cli.reporting import export_file

    if per_thread and fmt != "folded":
        raise click.UsageError("--per-thread is for --format folded")
    sys.exit(export_file(input_, fmt, output, **({"per_thread": True} if per_thread else {})))


@cli.command(context_settings=CONTEXT)
@click.option("-i", "input_", default="trace.dat", show_default=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False), help="The trace file to read.")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
def info(input_: str, as_json: bool) -> None:
    """Print what a trace file holds: how it was recorded (command, tracer, options, filters,
    probe events, clock, versions), its processes and threads, events per format, lost
    events, time span and size."""
    from rethook.cli.summaries import info_file

    sys.exit(info_file(input_, as_json))


@cli.command(context_settings=CONTEXT)
@click.option("-i", "input_", default="trace.dat", show_default=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False), help="The trace file to read.")
@click.option("-o", "output", default=None, metavar="OUT",
              help="The page to write ('-' for stdout). Default: the input's name with .html.")
@click.option("--open", "open_page", is_flag=True,
              help="Open the page in a web browser once written.")
@click.option("--max-calls", type=click.IntRange(1, 50_000_000), default=None, metavar="N",
              help="Calls the timeline shows before it keeps only the longest (default "
                   "400,000); the flame graph counts every call whatever N is.")
def view(input_: str, output: str | None, open_page: bool, max_calls: int | None) -> None:
    """Write a trace as one self-contained HTML page (trace.html) to open in a browser.

    The page has a timeline per process and thread (calls as nested slices, probe events as
    markers), a flame graph and an icicle of the calls, the probe histograms and the trace's
    metadata, with zoom and search. It needs no network: everything is inside the file.
    Traces with more calls than --max-calls are aggregated (said on the page and here);
    'rethook export --format perfetto' keeps every event.
    """
    from rethook.cli.viewing import view_file
    from rethook.output.html import DEFAULT_MAX_SLICES

    sys.exit(view_file(input_, output, open_page=open_page,
                       max_slices=max_calls or DEFAULT_MAX_SLICES))


@cli.command(context_settings=CONTEXT)
@click.option("-i", "input_", default="trace.dat", show_default=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False), help="The trace file to read.")
@click.option("-e", "events", multiple=True, metavar="GRP/EVENT",
              help="Only this event's histograms. Repeatable.")
def hist(input_: str, events: tuple[str, ...]) -> None:
    """Print the histograms (hist triggers, -R 'hist:...') of a recorded run, in the shape of
    ftrace's events/GRP/EVENT/hist files."""
    from rethook.cli.reporting import hist_file

    sys.exit(hist_file(input_, events))


@cli.command("list", cls=ProgramCommand, context_settings=CONTEXT)
@click.option("-t", "tracers", is_flag=True, help="List the tracers.")
@click.option("-o", "options", is_flag=True,
              help="List the trace options, their defaults, and what uses them.")
@click.option("-f", "functions", is_flag=False, flag_value="*", default=None, metavar="[GLOB]",
              help="List traceable functions (matching GLOB) of the program given after "
                   "'--' (its own code and the modules it imports) or of -m MODULE.")
@module_option
@program_argument
@click.pass_context
def list_(ctx: click.Context, tracers: bool, options: bool, functions: str | None,
          module: str | None, program: tuple[str, ...]) -> None:
    """List tracers, options, or the functions a program can trace.

    \b
    Examples:
      rethook list                       tracers and options
      rethook list -f -- prog.py         functions of prog.py and what it imports
      rethook list -f 'main*' -- prog.py only those matching the glob
      rethook list -f 'dump*' -m json    functions of the module json
    """
    from rethook.cli import listing
    from rethook.runner.program import ProgramError

    if functions is None and (module is not None or program):
        functions = "*"
    if not (tracers or options or functions is not None):
        tracers = options = True
    out: list[str] = []
    if tracers:
        out += listing.tracer_lines()
    if options:
        if out:
            out.append("")
        out += listing.option_lines()
    if functions is not None:
        if module is None and not program:
            raise click.UsageError("-f lists the functions of a program: give '-- SCRIPT' "
                                   "or '-m MODULE'", ctx)
        try:
            names = listing.function_names(module, program, functions)
        except (ProgramError, listing.ListError) as e:
            raise click.UsageError(str(e), ctx) from None
        except SyntaxError as e:
            running.syntax_error(e)
        if out:
            out.append("")
        out += map(printable, names)  # the program's names: escaped
    click.echo("\n".join(out))


def main() -> None:
    """The console script ``rethook`` and ``python -m rethook``."""
    cli(prog_name="rethook")
