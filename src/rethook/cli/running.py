"""The work of the commands that run a program, apart from how their arguments were parsed.

``record``, ``stream``, ``profile``, ``run`` and ``demo`` (:mod:`rethook.cli.main`, click) and
the quick ``record``, ``stream`` and ``profile`` (:mod:`rethook.cli.quick`, no click) share
these steps: make the
:class:`~rethook.runner.program.Program`, load it, configure a Tracefs for it, follow its
children, run it, and leave the way it would have. A usage error found on the way (no such
script, a filter that matches nothing) is raised as :class:`Usage`, which each parser shows
with its command's usage line (status 2).

This module imports no click.
"""

from __future__ import annotations

import os
import sys

from rethook import gcpause

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

    from rethook.control.tracefs import Tracefs
    from rethook.runner.follow import Follow
    from rethook.runner.program import Outcome, Program
    from rethook.runner.settings import TraceSettings


class Usage(Exception):
    """A usage error met after the arguments were parsed: shown with the command's usage."""


def program_of(module: str | None, program: tuple[str, ...] | list[str]) -> Program:
    """The program to run: ``-m MODULE ARGS`` or ``SCRIPT ARGS``."""
    from rethook.runner.program import Program

    if module is not None:
        return Program(module=module, args=program)
    if not program:
        raise Usage("missing program: give SCRIPT [ARGS]... or -m MODULE [ARGS]...")
    return Program(script=program[0], args=program[1:])


def load(program: Program) -> None:
    from rethook.runner.program import ProgramError

    try:
        program.load()
    except ProgramError as e:
        raise Usage(str(e)) from None
    except SyntaxError as e:
        syntax_error(e)


def syntax_error(e: SyntaxError) -> NoReturn:
    """As python reports a script that does not compile: no traceback, status 1."""
    e.__traceback__ = None
    sys.excepthook(type(e), e, None)
    sys.exit(1)


def prepare(program: Program, settings: TraceSettings,
            tracer: bool = True) -> tuple[Tracefs, list[str]]:
    """Load the program, register its code, and configure a Tracefs for it (tracing off)."""
    from rethook.control.tracefs import Tracefs
    from rethook.engine import toolid
    from rethook.runner.settings import SettingError, configure, register_program

    try:
        toolid.require_free()
    except toolid.ToolIdError as e:  # another tool (a sitecustomize, a debugger) has them all
        stderr(f"rethook: error: {e}")
        sys.exit(2)
    load(program)
    fs = Tracefs()
    register_program(fs, program)  # before the filters are written: -l names its functions
    try:
        filters = configure(fs, settings, program, tracer=tracer)
    except SettingError as e:
        fs.close()
        raise Usage(str(e)) from None
    return fs, filters


def exit_as(outcome: Outcome) -> NoReturn:
    """Leave the way the program would have."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream: nothing left to say
            pass
    if outcome.interrupted and not outcome.in_child:
        # Python ends a program killed by an uncaught KeyboardInterrupt with SIGINT itself, so
        # the shell sees 130 and stops a script that ran it.
        import signal  # (here: --help does without it, ~1 ms)

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(outcome.exit_code)


def stderr(text: str) -> None:
    err = sys.__stderr__ or sys.stderr
    try:
        err.write(text + "\n")
        err.flush()
    except Exception:  # noqa: BLE001 - the program closed stderr: the summary is lost with it
        pass


def record(prog: Program, settings: TraceSettings, output: str) -> Outcome:
    """Run ``prog`` and record its trace into ``output``."""
    from rethook.engine.core import notrace
    from rethook.runner.observers import Recorder, trace_meta
    from rethook.runner.run import Session
    from rethook.runner.settings import SettingError

    fs, filters = prepare(prog, settings)
    try:
        with notrace():  # rethook's own work: what it calls is not discovered for it
            children = follow("record", settings, filters, output)
            sections = children.append_sections if children is not None else None
            recorder = Recorder(output, trace_meta(fs, prog, filters, settings), sections,
                                blocking_ms=settings.blocking_ms)
    except OSError as e:
        fs.close()
        raise Usage(f"-o {output!r}: cannot write: {e.strerror}") from None
    try:
        outcome = Session(prog, fs, children).run([recorder])
    except SettingError as e:  # the recorder could not start: the program did not run
        fs.close()
        raise Usage(str(e)) from None
    if not outcome.in_child and recorder.error is not None:
        outcome.exit_code = outcome.exit_code or 1
    return outcome


def record_program(module: str | None, program: tuple[str, ...] | list[str],
                   settings: Callable[[], TraceSettings], output: str) -> NoReturn:
    """``rethook record [FLAGS] PROGRAM``: ``settings`` makes the run's settings (with the
    collector paused, as the whole set-up is)."""
    with gcpause.paused():  # rethook's set-up (run_main resumes it as the program starts)
        prog = program_of(module, program)
        outcome = record(prog, settings(), output)
    exit_as(outcome)


def stream_program(module: str | None, program: tuple[str, ...] | list[str],
                   settings: Callable[[], TraceSettings]) -> NoReturn:
    """``rethook stream [FLAGS] PROGRAM``: its events printed as they happen."""
    from rethook.runner.observers import Streamer
    from rethook.runner.run import Session

    with gcpause.paused():  # rethook's set-up (run_main resumes it as the program starts)
        prog = program_of(module, program)
        chosen = settings()
        fs, filters = prepare(prog, chosen)
        children = follow("stream", chosen, filters)
        outcome = Session(prog, fs, children).run([Streamer(sys.stdout, children)])
    exit_as(outcome)


class ProfileShow:
    """How ``rethook profile`` shows its tables (``per_process``, ``sort``, ``limit``, the
    pstats file ``output``); ``failed`` once the file could not be written."""

    def __init__(self, per_process: bool = False, sort: str | None = None,
                 limit: int | None = None, output: str | None = None) -> None:
        self.per_process, self.sort, self.limit, self.output = per_process, sort, limit, output
        self.failed = False

    def __call__(self, tables: list[tuple[int, list[Any]]], abrupt: bool,
                 graph_time: bool) -> None:
        from rethook.cli.summaries import show_profile

        if not show_profile(tables, output=self.output, sort=self.sort, limit=self.limit,
                            graph_time=graph_time, per_process=self.per_process,
                            abrupt=abrupt):
            self.failed = True


def profile_program(module: str | None, program: tuple[str, ...] | list[str],
                    settings: Callable[[], TraceSettings], show: ProfileShow) -> NoReturn:
    """``rethook profile [FLAGS] PROGRAM``: the function profiler's table at the end."""
    from rethook.runner.observers import ProfileObserver
    from rethook.runner.run import Session

    with gcpause.paused():  # rethook's set-up (run_main resumes it as the program starts)
        prog = program_of(module, program)
        chosen = settings()
        fs, filters = prepare(prog, chosen, tracer=False)
        children = follow("profile", chosen, filters)
        graph_time = fs.ctx.options["graph-time"]
        outcome = Session(prog, fs, children).run(
            [ProfileObserver(children,
                             show=lambda tables, abrupt: show(tables, abrupt, graph_time))])
    if show.failed:
        outcome.exit_code = outcome.exit_code or 1
    exit_as(outcome)


def follow(mode: str, settings: TraceSettings, filters: list[str],
           output: str | None = None) -> Follow | None:
    """The run's child processes (None with --no-follow): they trace what this one does.
    The default filter goes to them resolved (the parent program's own modules), with the
    names multiprocessing gives the parent's __main__ in spawned children."""
    from rethook.runner.follow import Follow

    if not settings.follow:
        return None
    chosen = list(filters) or list(settings.filters)
    if not settings.filters:
        chosen += [p for p in ("*:mod:__main__", "*:mod:__mp_main__") if p not in chosen]
    return Follow.create(mode, settings.replace(filters=chosen), output)
