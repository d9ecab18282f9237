"""The cyclic GC paused while rethook's command line sets itself up.

Importing the engine and the trace writer and configuring them makes tens of thousands of
objects and no cyclic garbage worth collecting, yet sets off a dozen young and one
middle-generation collection (~10 ms of a recording's start). The commands that run a
program pause the collector (:func:`paused`) from when they start until the program's first
line (:func:`rethook.runner.program.run_main` resumes it), or until they fail before it: the
program finds it enabled, with Python's thresholds. The ``rethook`` entry point pauses it
while it imports click and the command line (:func:`rethook.cli.entry`). Nothing else pauses
it (a command that runs for long, such as ``view``'s server, collects as usual).

In a process that is the ``rethook`` command (:func:`own_process`), resuming as the program
starts also freezes (``gc.freeze()``) what exists by then: rethook's modules and set-up, and
the interpreter's own start-up. Those objects live until the process ends, yet every full
collection walks them: the program's own, and the interpreter's last two as it exits, which
under ``record -l '*'`` of a one-line script were ~20 M of rethook's ~145 M instructions
(``bench/bench_instructions.py``). Frozen, no collection walks them. The program sees a
larger ``gc.get_freeze_count()`` and a ``gc.get_objects()`` without them; ``gc.unfreeze()``
gives them back to the collector. Not before the program starts: the registry's scan of
the heap (``gc.get_objects()``) at set-up must see the functions already loaded. A process
that only calls the command line in-process (tests, embedders) is not frozen: its objects
must stay collectable.

This module imports nothing of rethook's: every layer may use it.
"""

from __future__ import annotations

import gc

_paused = False
_freeze = False


def own_process() -> None:
    """The process is the ``rethook`` command: :func:`resume` freezes what exists as the
    program starts (above)."""
    global _freeze
    _freeze = True


def pause() -> None:
    """Stop the cyclic GC, if it runs, until :func:`resume`."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume(program_starts: bool = False) -> None:
    """Turn the cyclic GC back on if :func:`pause` stopped it; otherwise nothing. What was
    made meanwhile is frozen when the program starts in rethook's own process (above);
    otherwise it goes to the oldest generation at once (freeze and unfreeze move it there
    without a collection), so the first young collections do not go through it, unless
    objects are frozen already (3.12 freezes a few hundred as it starts), which unfreezing
    would thaw."""
    global _paused
    if _paused:
        _paused = False
        if program_starts and _freeze:
            gc.freeze()
        elif gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        gc.enable()


class paused:  # noqa: N801 (used as a function: ``with gcpause.paused():``)
    """:func:`pause` for the block; :func:`resume` at its end if nothing did before. (A class,
    not contextlib's decorator: contextlib is ~1 ms of start-up most programs do not pay.)"""

    def __enter__(self) -> None:
        pause()

    def __exit__(self, *exc: object) -> None:
        resume()
