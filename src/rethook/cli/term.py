"""The terminal: colour, rich tables and progress bars, only where a person is looking.

Output that goes to a pipe or a file is plain text (ftrace's formats, character for
character). A stream gets rich output when ``rich`` says it is a terminal, which follows the
usual conventions: ``FORCE_COLOR`` (non-empty: treat it as a terminal) and ``TTY_COMPATIBLE``,
``NO_COLOR`` (non-empty: no colour, tables still drawn), ``TERM=dumb`` (no colour, and plain
tables). ``rich`` is imported only when a stream passes the first, cheap check, so commands
writing to pipes never load it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import IO, Any

#: Traces with fewer events than this are read without a progress bar (about a second).
PROGRESS_MIN_EVENTS = 100_000

#: Events between two progress bar updates.
PROGRESS_STEP = 8192


def _maybe_terminal(stream: IO[Any]) -> bool:
    """Whether ``stream`` could be a terminal for rich, without importing rich."""
    env = os.environ
    if env.get("TTY_COMPATIBLE") == "1" or env.get("FORCE_COLOR"):
        return True
    if env.get("TTY_COMPATIBLE") == "0":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def console(stream: IO[Any]) -> Any | None:
    """A ``rich.console.Console`` writing to ``stream`` if it is a terminal that is not dumb,
    else None (write plain text)."""
    if not _maybe_terminal(stream):
        return None
    from rich.console import Console

    con = Console(file=stream, highlight=False, soft_wrap=False)
    if not con.is_terminal or con.is_dumb_terminal:
        return None
    return con


def colours(stream: IO[Any]) -> Any | None:
    """A console for ``stream`` if colour may be written to it (a terminal, NO_COLOR unset),
    else None."""
    con = console(stream)
    if con is None or con.no_color or con.color_system is None:
        return None
    return con


def paint(con: Any, style: str, text: str) -> str:
    """``text`` with the escape sequences of rich style ``style`` for ``con``'s terminal."""
    from rich.style import Style

    return Style.parse(style).render(text, color_system=con.color_system)


def text_paint(con: Any) -> dict[str, tuple[str, str]]:
    """The escape sequences the text views put around duration marks, lost events and
    exceptions (rethook.output.text's ``paint``), for ``con``'s terminal."""
    from rich.style import Style

    from rethook.output.durations import MARK_STYLES
    from rethook.output.text import PAINTED

    out = {}
    for what, style in (*MARK_STYLES.items(), *PAINTED.items()):
        before, _, after = Style.parse(style).render("\0", color_system=con.color_system
                                                     ).partition("\0")
        out[what] = (before, after)
    return out


def error(text: str) -> None:
    """``rethook: error: TEXT`` on stderr, the prefix in red on a colour terminal."""
    err = sys.stderr
    con = colours(err)
    prefix = "rethook: error:" if con is None else paint(con, "bold red", "rethook: error:")
    err.write(f"{prefix} {text}\n")
    err.flush()


class ProgressReader:
    """A trace reader that moves a progress bar as events are read: stands in for the
    :class:`~rethook.buffer.traceread.TraceReader` it wraps (every attribute but ``events``
    and ``ordered_events`` is the reader's). ``passes`` is how many times the caller will
    read the events (the exports that rebuild slices read them twice); more passes extend
    the bar."""

    def __init__(self, reader: Any, bar: Any, task: Any, total: int, passes: int) -> None:
        self._reader = reader
        self._bar = bar
        self._task = task
        self._total = max(1, total)
        self._passes = passes
        self._started = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    def events(self, lost: bool = False) -> Iterator[Any]:
        return self._counted(self._reader.events(lost=lost))

    def ordered_events(self, lost: bool = False, lookahead: bool = False) -> Iterator[Any]:
        return self._counted(self._reader.ordered_events(lost=lost, lookahead=lookahead))

    def _counted(self, items: Iterable[Any]) -> Iterator[Any]:
        """One pass over the events, moving the bar."""
        self._started += 1
        if self._started > self._passes:
            self._passes = self._started
            self._bar.update(self._task, total=self._total * self._passes)
        done = self._total * (self._started - 1)
        n = 0
        bar, task = self._bar, self._task
        for ev in items:
            yield ev
            n += 1
            if n % PROGRESS_STEP == 0:
                bar.update(task, completed=done + n)
        bar.update(task, completed=done + self._total)


@contextmanager
def progress(reader: Any, what: str, passes: int = 1,
             quiet_stdout: bool = False) -> Iterator[Any]:
    """The reader to read from: ``reader`` itself, or a :class:`ProgressReader` drawing a bar
    on stderr while the events are read, when the trace is long (PROGRESS_MIN_EVENTS) and
    stderr is a terminal. ``quiet_stdout``: no bar when stdout is that terminal too (the
    output itself shows the progress, and the bar would draw over it)."""
    events = reader.event_count if _maybe_terminal(sys.stderr) else 0
    con = console(sys.stderr) if events >= PROGRESS_MIN_EVENTS else None
    if con is not None and quiet_stdout and console(sys.stdout) is not None:
        con = None
    if con is None:
        yield reader
        return
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeRemainingColumn

    with Progress("[progress.description]{task.description}", BarColumn(),
                  TaskProgressColumn(), TimeRemainingColumn(), console=con,
                  transient=True) as bar:
        task = bar.add_task(f"{what} {events:,} events", total=events * passes)
        yield ProgressReader(reader, bar, task, events, passes)
