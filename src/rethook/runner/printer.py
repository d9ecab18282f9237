"""The printer of ``rethook stream``: a process of its own that prints a trace file while
it grows (the recording process's Streamer writes it), with the files of the run's other
processes, in the tracer's text format.

Run as ``python -m rethook.runner.printer FILE [RUNDIR]``, with the recording process holding
the other end of its stdin: end of file there means the file will not grow any more (the
recording finished, failed, or the process died), and the printer prints what is left and
exits. It ignores Ctrl-C, which the terminal sends to the whole process group: the stream
ends when the recording does.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from typing import Any

from rethook.buffer.traceread import TraceTail
from rethook.output.text import Threads, probe_describer, renderer_for, switch_lines

#: How long the printer waits for the file to grow before looking again.
POLL_SECONDS = 0.02


class Printer:
    """Prints the items of several growing trace files (one per process) to a descriptor,
    with ftrace's context-switch block where the process changes."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.threads = Threads({}, {})
        self._renderers: dict[int, Any] = {}  # id(tail) -> its renderer
        self._last_tid: int | None = None

    def print_tail(self, tail: TraceTail, pid: int | None = None) -> bool:
        """Print what ``tail`` has that was not printed yet; whether there was anything."""
        items = tail.read()
        if not items:
            return False
        if pid is None:
            pid = tail.meta.get("pid", 0)
        renderer = self._renderers.get(id(tail))
        if renderer is None:
            meta = tail.meta
            renderer = self._renderers[id(tail)] = renderer_for(
                meta.get("tracer", "function_graph"), tail.formats, self.threads,
                meta.get("options", {}), describe=probe_describer(meta.get("probe_events")))
        self.threads.names.update(tail.threads)
        for tid in tail.threads:
            self.threads.pids[tid] = pid
        lines = [line for item in items for line in renderer.feed(item)]
        first = next((item[2] for item in items if isinstance(item, tuple)), None)
        if first is not None:
            last = self._last_tid
            if last is not None and self.threads.pids.get(last) != pid:
                lines = [*switch_lines(self.threads, last, first), *lines]
            self._last_tid = next(item[2] for item in reversed(items)
                                  if isinstance(item, tuple))
        self._write(lines)
        return True

    def flush(self) -> None:
        """The lines renderers hold back (a graph entry waiting for its exit)."""
        for renderer in self._renderers.values():
            self._write(list(renderer.flush()))

    def _write(self, lines: list[str]) -> None:
        data = "".join(line + "\n" for line in lines).encode("utf-8", "backslashreplace")
        while data:
            data = data[os.write(self.fd, data):]


def _children(rundir: str, own: str, tails: dict[str, TraceTail]) -> list[TraceTail]:
    """The trace files of the run's other processes (``PID.dat``), oldest first."""
    try:
        names = sorted(os.listdir(rundir))
    except OSError:
        names = []
    for name in names:
        path = os.path.join(rundir, name)
        if name.endswith(".dat") and path != own and path not in tails:
            tails[path] = TraceTail(path)
    return list(tails.values())


def run(path: str, rundir: str | None, fd: int = 1, control: int = 0) -> None:
    """Print ``path`` (and the files in ``rundir``) until ``control`` reaches end of file."""
    printer = Printer(fd)
    own = TraceTail(path)
    tails: dict[str, TraceTail] = {}
    over = False
    while True:
        progressed = printer.print_tail(own)
        if rundir is not None:
            for tail in _children(rundir, path, tails):
                progressed |= printer.print_tail(tail)
        if over:
            break  # one last pass after the recording said it was over
        if progressed:
            continue
        ready, _, _ = select.select([control], [], [], POLL_SECONDS)
        if ready and not os.read(control, 4096):
            over = True
    printer.flush()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run(argv[1], argv[2] if len(argv) > 2 else None)
    except BrokenPipeError:  # the reader of the stream went away (| head): nothing to do
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
