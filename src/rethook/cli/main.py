"""The ``rethook`` command line: trace-cmd's commands and flags for Python programs.

``record``, ``stream`` and ``profile`` run a program (``SCRIPT ARGS`` or ``-m MODULE ARGS``)
under a trace; ``report`` and ``export`` read a recorded trace file; ``list`` shows tracers,
options and traceable functions; ``demo`` records and shows a bundled example. See docs/cli.md.

Exit status: a command that runs a program exits with the program's status (as ``python``
would); usage errors (bad flags, unknown tracers or options, filters that match nothing, a
missing script or module) exit with 2; a damaged trace file or a failed write exits with 1.
"""

from __future__ import annotations

import os
import platform
import signal
import sys
import tempfile
from typing import Any, NoReturn

import click

import rethook
from rethook.cli.args import (
    ProgramCommand,
    module_option,
    program_argument,
    settings_from,
    trace_options,
)
from rethook.cli.ctl import attach_options, running_target
from rethook.control.tracefs import Tracefs
from rethook.session import (
    Outcome,
    ProfileObserver,
    Program,
    ProgramError,
    Recorder,
    Session,
    SettingError,
    Streamer,
    TraceSettings,
    configure,
    trace_meta,
)

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from rethook.engine.engine import get_engine

    core = get_engine().core
    click.echo(f"rethook {rethook.__version__} (engine: {core.name} core, "
               f"{platform.python_implementation()} {platform.python_version()})")
    note = getattr(core, "note", "")
    if note:
        click.echo(note)
    from rethook.tracers.native import users_note

    click.echo(users_note(core.name))
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
      rethook stream -m pkg.tool       print events live while the program runs
      rethook profile prog.py          function profiler: hits and times per function
      rethook list -f 'main*' prog.py  what can be traced
      rethook demo                     record and show a bundled example

    By default only the program's own code is traced (its __main__ and the modules it
    imports from its own directory or package); choose functions with -l.
    """


# --- running programs ------------------------------------------------------------------------
def _program(ctx: click.Context, module: str | None, program: tuple[str, ...]) -> Program:
    if module is not None:
        return Program(module=module, args=program)
    if not program:
        raise click.UsageError("missing program: give SCRIPT [ARGS]... or -m MODULE [ARGS]...",
                               ctx)
    return Program(script=program[0], args=program[1:])


def _load(ctx: click.Context, program: Program) -> None:
    try:
        program.load()
    except ProgramError as e:
        raise click.UsageError(str(e), ctx) from None
    except SyntaxError as e:
        _syntax_error(e)


def _syntax_error(e: SyntaxError) -> NoReturn:
    """As python reports a script that does not compile: no traceback, status 1."""
    e.__traceback__ = None
    sys.excepthook(type(e), e, None)
    sys.exit(1)


def _prepare(ctx: click.Context, program: Program, settings: TraceSettings,
             tracer: bool = True) -> tuple[Tracefs, list[str]]:
    """Load the program, register its code, and configure a Tracefs for it (tracing off)."""
    _load(ctx, program)
    fs = Tracefs()
    assert program.code is not None
    # Before the filters are written, so that -l names the script's functions (__main__.f).
    fs.ctx.registry.add_code(program.code, "__main__")
    try:
        filters = configure(fs, settings, program, tracer=tracer)
    except SettingError as e:
        fs.close()
        raise click.UsageError(str(e), ctx) from None
    return fs, filters


def _exit(outcome: Outcome) -> NoReturn:
    """Leave the way the program would have."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream: nothing left to say
            pass
    if outcome.interrupted and not outcome.in_child:
        # Python ends a program killed by an uncaught KeyboardInterrupt with SIGINT itself, so
        # the shell sees 130 and stops a script that ran it.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(outcome.exit_code)


def _stderr(text: str) -> None:
    err = sys.__stderr__ or sys.stderr
    try:
        err.write(text + "\n")
        err.flush()
    except Exception:  # noqa: BLE001 - the program closed stderr: the summary is lost with it
        pass


@cli.command(cls=ProgramCommand, context_settings=CONTEXT)
@trace_options()
@click.option("-o", "output", default="trace.dat", show_default=True, metavar="FILE",
              help="Write the trace to FILE.")
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
    prog = _program(ctx, module, program)
    settings = settings_from(params)
    outcome = _record(ctx, prog, settings, output)
    _exit(outcome)


def _record(ctx: click.Context, prog: Program, settings: TraceSettings, output: str) -> Outcome:
    fs, filters = _prepare(ctx, prog, settings)
    try:
        recorder = Recorder(output, trace_meta(fs, prog, filters, settings))
    except OSError as e:
        fs.close()
        raise click.UsageError(f"-o {output!r}: cannot write: {e.strerror}", ctx) from None
    outcome = Session(prog, fs).run([recorder])
    if outcome.in_child:
        return outcome
    if recorder.error is not None:
        _stderr(f"rethook: error writing {output}: {recorder.error}")
        outcome.exit_code = outcome.exit_code or 1
    _stderr(recorder.summary())
    return outcome


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
    prog = _program(ctx, module, program)
    settings = settings_from(params)
    fs, _ = _prepare(ctx, prog, settings)
    streamer = Streamer(sys.stdout)
    outcome = Session(prog, fs).run([streamer])
    if not outcome.in_child:
        totals = fs.ctx.buffer.totals()
        _stderr(f"rethook: {totals.written - totals.lost:,} events ({totals.lost:,} lost) "
                "streamed")
    _exit(outcome)


@cli.command(cls=ProgramCommand, context_settings=CONTEXT)
@trace_options(graph=False)
@attach_options()
@module_option
@program_argument
@click.pass_context
def profile(ctx: click.Context, module: str | None, program: tuple[str, ...],
            **params: Any) -> None:
    """Run a program under the function profiler and print its table at the end.

    The table (to stdout, after the program's own output) has ftrace's columns: Function,
    Hit, Time, Avg, s^2, all threads merged, longest time first. Time includes the calls a
    function makes; -O nograph-time gives self time. -O nosleep-time leaves out the time
    generators and coroutines spent suspended. With -P PID, a running process, until Ctrl-C
    or --duration.
    """
    pid = running_target(ctx, params, module, program)
    if pid is not None:
        from rethook.cli.ctl import profile_running

        sys.exit(profile_running(pid, params["children"], settings_from(params, tracer="nop"),
                                 params["duration"]))
    prog = _program(ctx, module, program)
    settings = settings_from(params, tracer="nop")
    fs, _ = _prepare(ctx, prog, settings, tracer=False)
    outcome = Session(prog, fs).run([ProfileObserver()])
    if not outcome.in_child:
        try:
            sys.stdout.flush()
            out = sys.__stdout__ or sys.stdout
            out.write(fs.profile_table())
            out.flush()
        except BrokenPipeError:
            pass
    _exit(outcome)


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
    from rethook.cli.ctl import ControlObserver

    prog = _program(ctx, module, program)
    _load(ctx, prog)
    fs = Tracefs()
    assert prog.code is not None
    fs.ctx.registry.add_code(prog.code, "__main__")
    outcome = Session(prog, fs).run([ControlObserver(prog, follow_forks=not no_follow)])
    _exit(outcome)


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
    from rethook.cli.reporting import report_file
    from rethook.examples import demo_path

    prog = Program(script=demo_path(), args=[])
    settings = TraceSettings(tracer="function_graph", filters=["*:mod:__main__"],
                             options=["funcgraph-retval"])
    tmpdir = None
    if output is None:
        tmpdir = tempfile.mkdtemp(prefix="rethook-demo-")
        output = os.path.join(tmpdir, "demo.dat")
    try:
        outcome = _record(ctx, prog, settings, output)
        if outcome.in_child:
            _exit(outcome)
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
@click.option("--format", "fmt", type=click.Choice(["perfetto", "folded"]), required=True,
              help="perfetto: a native Perfetto trace (open it in ui.perfetto.dev); "
                   "folded: folded stacks for flame graphs (flamegraph.pl, speedscope).")
@click.option("-o", "output", default=None, metavar="OUT",
              help="Output file ('-' for stdout). Default: the input's name with "
                   ".perfetto-trace or .folded.")
def export(input_: str, fmt: str, output: str | None) -> None:
    """Convert a trace file for other tools: Perfetto or folded stacks."""
    from rethook.cli.reporting import export_file

    sys.exit(export_file(input_, fmt, output))


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
            _syntax_error(e)
        if out:
            out.append("")
        out += names
    click.echo("\n".join(out))


def main() -> None:
    """The console script ``rethook`` and ``python -m rethook``."""
    cli(prog_name="rethook")
