"""One traced run of a program, in every process it becomes: observers started, tracing on
exactly while the program's code runs, then everything finished -- however the process ends
(:mod:`~rethook.runner.exits`) -- and, in the first process, the children gathered
(:mod:`~rethook.runner.follow`)."""

from __future__ import annotations

import atexit
import os
import sys
import types

from rethook.control.tracefs import Tracefs
from rethook.engine import clock
from rethook.engine.core import notrace
from rethook.runner import exits, follow
from rethook.runner.follow import Follow
from rethook.runner.observers import Observer, ProfileObserver, Recorder
from rethook.runner.program import Outcome, Program, install_main, run_main
from rethook.runner.settings import configure_leniently

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


class Session:
    """Runs a loaded :class:`Program` once, with ``fs`` tracing it, and says how it ended.

    With ``children`` (a :class:`~rethook.runner.follow.Follow`), the processes it starts
    are traced too, and the first process gathers them when it finishes."""

    def __init__(self, program: Program | None, fs: Tracefs,
                 children: Follow | None = None) -> None:
        if program is not None and program.code is None:
            raise ValueError("load() the program first")
        self.program = program
        self.fs = fs
        self.children = children
        self.observers: list[Observer] = []
        self.pid = os.getpid()
        self.first = children is None or children.root == self.pid
        self.how = "main"
        self.dormant = False  # records nothing itself; its fork children do (start_in_child)
        self._finished = False

    def run(self, observers: Sequence[Observer] = ()) -> Outcome:
        """Run the program to its end; returns how it ended (``in_child``: this process is
        a fork child of the program that came back here)."""
        assert self.program is not None
        globals_ = install_main(self.program)
        self.begin(observers, tracing=False)
        outcome = Outcome()
        run_main(self.program, globals_, outcome, lambda: self.fs.write("tracing_on", "1"))
        outcome.in_child = os.getpid() != self.pid or not self.first
        self.finish()
        return outcome

    def begin(self, observers: Sequence[Observer], tracing: bool = True) -> None:
        """Start the observers and the guards of the process's end; tracing on if asked."""
        # rethook's own work: the standard library it calls is not discovered (registered
        # and hooked, under -l '*') for it; the program's first call of it does that
        with notrace():
            self.observers = list(observers)
            for obs in self.observers:
                obs.start(self.fs)
            exits.guard(self._finish_abruptly)
            if self.children is not None:
                follow.install(self.children, self._before_exec)
            os.register_at_fork(after_in_child=self._after_fork_in_child)
        if tracing:
            self.fs.write("tracing_on", "1")

    def finish(self, why: str | None = None) -> None:
        """Stop tracing (calls still open are delivered as unfinished), finish the observers,
        and let them report. Runs once, whichever way the process ends."""
        if self._finished or os.getpid() != self.pid:
            return
        self._finished = True
        exits.finishing()
        try:
            self._finish(why)
        finally:
            exits.release()

    def _finish(self, why: str | None) -> None:
        fs = self.fs
        with notrace():
            for obs in self.observers:
                obs.stop(fs)
        if why != "exec":  # (an exec that fails goes on running the program)
            fs.ctx.engine.for_exit()  # the process ends: no function needs un-hooking
        fs.close()
        fs.write("tracing_on", "0")
        with notrace():
            for obs in self.observers:
                obs.finish(fs)
            abrupt = why is not None and why != "os._exit"
            if self.first:
                self._report_hook(abrupt)
            for obs in self.observers:
                obs.report(fs, abrupt)
            if self.first and self.children is not None:
                self._report_children(abrupt=why is not None)
        # Nothing is traced from here on: the names go now rather than be walked by each
        # of the collections the interpreter makes as it ends (~10 ms for sqlglot's).
        fs.ctx.registry.release()

    def _finish_abruptly(self, why: str) -> None:
        self.finish(why)

    def _report_hook(self, abrupt: bool) -> None:
        """Say so if another tool took the hook from under the run (Tracefs.check_hook)."""
        from rethook.runner.observers import emit

        self.fs.check_hook()
        lost = self.fs.ctx.engine.lost
        if lost is not None:
            emit(2, f"rethook: warning: {lost}. Tracing stopped when rethook noticed; the trace "
                 "is kept, but calls from then on may be missing or incomplete", abrupt)

    def _report_children(self, abrupt: bool) -> None:
        from rethook.runner.observers import emit

        children = self.children
        assert children is not None
        for line in children.untraced():
            emit(2, f"rethook: {line}", abrupt)
        children.finish()

    # --- processes ----------------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        """This process is a fork child: record (or profile) into its own file, or, when
        children are not followed, record nothing (the parent's file is not ours to write)."""
        if self._finished or os.getpid() == self.pid:
            return
        exits.disarm()  # the parent's run is not this process's to finish
        with notrace():
            parent = self.pid
            self.pid = os.getpid()
            self.first = False
            self.how = "fork"
            old, self.observers = self.observers, []
            for obs in old:
                obs.forget()
            if self.children is None:
                self._finished = True  # the parent's trace: nothing to do here
                exits.release()
                return
            self.observers = child_observers(self.children, self.fs, parent, "fork", forked=True)
            for obs in self.observers:
                obs.start(self.fs)
            exits.guard(self._finish_abruptly)
            if self.dormant:  # a worker of multiprocessing's fork server: traced from here
                self.dormant = False
                atexit.register(self.finish)
                self.fs.write("tracing_on", "1")

    def _before_exec(self, argv: list[str]) -> None:
        """The process is about to be replaced by another program: write what it recorded
        (if exec fails, the run goes on)."""
        for obs in self.observers:
            if isinstance(obs, Recorder):
                obs.flush(self.fs, {"exec_argv": argv})
        if self.first:
            self.finish("exec")  # the first process's trace ends here, gathered


def child_observers(children: Follow, fs: Tracefs, parent: int, how: str,
                    forked: bool) -> list[Observer]:
    """What a child process runs: a recorder of its own file (record and stream: the first
    process follows the file), or the profiler saving its table."""
    if children.mode == "profile":
        return [ProfileObserver(save=children.process_file(".profile"), forked=forked)]
    meta = child_meta(fs, parent, how)
    return [Recorder(children.process_file(), meta, quiet=True,
                     blocking_ms=children.settings.blocking_ms)]


def child_meta(fs: Tracefs, parent: int, how: str) -> dict[str, Any]:
    from rethook.runner.observers import process_meta

    meta = process_meta(fs)
    meta.update(ppid=parent, how=how, argv=list(sys.argv), **clock.start_times())
    return meta


def start_in_child(children: Follow, main_code: types.CodeType, dormant: bool = False) -> None:
    """Trace a Python program a traced run started, from its ``__main__`` code on (called by
    the start-up hook as that code starts): the run's settings, this process's file, and the
    trace finished when the interpreter exits. ``dormant``: this process records nothing,
    only the processes it forks do (multiprocessing's fork server)."""
    fs = Tracefs()
    fs.ctx.registry.add_code(main_code, "__main__")
    configure_leniently(fs, children.settings, tracer=children.mode != "profile")
    session = Session(None, fs, children)
    session.first = False
    session.how = "exec"
    if dormant:
        session.dormant = True
        session.begin([], tracing=False)
        return
    with notrace():  # rethook's own work (see begin)
        observers = child_observers(children, fs, os.getppid(), "exec", forked=False)
    session.begin(observers)
    atexit.register(session.finish)
