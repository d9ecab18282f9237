"""One traced run of a program: observers started, tracing on exactly while the program's code
runs, then everything finished and the outcome handed back."""

from __future__ import annotations

import os
from collections.abc import Sequence

from rethook.control.tracefs import Tracefs
from rethook.runner.observers import Observer
from rethook.runner.program import Outcome, Program, install_main, run_main


class Session:
    """Runs a loaded :class:`Program` once, with ``fs`` tracing it, and says how it ended."""

    def __init__(self, program: Program, fs: Tracefs) -> None:
        if program.code is None:
            raise ValueError("load() the program first")
        self.program = program
        self.fs = fs

    def run(self, observers: Sequence[Observer] = ()) -> Outcome:
        program, fs = self.program, self.fs
        pid = os.getpid()
        globals_ = install_main(program)
        for obs in observers:
            obs.start(fs)
        outcome = Outcome()
        run_main(program, globals_, outcome, lambda: fs.write("tracing_on", "1"))
        if os.getpid() == pid:
            for obs in observers:
                obs.stop(fs)
        fs.close()  # calls still open now (daemon threads) are delivered as unfinished
        fs.write("tracing_on", "0")
        if os.getpid() != pid:
            outcome.in_child = True
            return outcome
        for obs in observers:
            obs.finish(fs)
        return outcome
