"""The cyclic GC paused while rethook's command line sets itself up.

Importing the engine and the trace writer and configuring them makes tens of thousands of
objects and no cyclic garbage worth collecting, yet sets off a dozen young and one
middle-generation collection (~10 ms of a recording's start). The commands that run a
program pause the collector (:func:`paused`) from when they start until the program's first
line (:func:`rethook.runner.program.run_main` resumes it), or until they fail before it: the
program finds it as Python left it. The ``rethook`` entry point pauses it while it imports
click and the command line (:func:`rethook.cli.entry`). Nothing else pauses it (a command
that runs for long, such as ``view``'s server, collects as usual).

This module imports nothing of rethook's: every layer may use it.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

_paused = False


def pause() -> None:
    """Stop the cyclic GC, if it runs, until :func:`resume`."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Turn the cyclic GC back on if :func:`pause` stopped it; otherwise nothing. What was
    made meanwhile goes to the oldest generation at once (freeze and unfreeze move it there
    without a collection), so the program's first young collections do not go through it;
    not where objects are frozen already (3.12 freezes a few hundred as it starts), which
    unfreezing would thaw."""
    global _paused
    if _paused:
        _paused = False
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        gc.enable()


@contextmanager
def paused() -> Iterator[None]:
    """:func:`pause` for the block; :func:`resume` at its end if nothing did before."""
    pause()
    try:
        yield
    finally:
        resume()
