"""No exit loses what was recorded: the ways a traced process can end, and what runs first.

* SIGTERM, SIGHUP, SIGQUIT: while a run records, each of them whose disposition is the
  default gets a handler that finishes the trace (calls still open delivered as unfinished,
  the file's end written, children gathered, the summary printed) and then lets the signal
  take its normal effect: the handler is reset to the default and the signal sent again, so
  the process ends by it exactly as it would have (same exit status, core dump for SIGQUIT).
  A signal the program ignores, or handles itself (installed before or after), stays the
  program's business: its own handler runs, as untraced.
* ``os._exit()`` (what a fork child of multiprocessing ends with, and what some programs
  call): ``os._exit`` is wrapped to finish the trace first.
* SIGKILL, a crash: nothing can run. The recorder writes whole chunks as it drains the rings
  (at least every :data:`~rethook.runner.observers.DRAIN_POLL_SECONDS`), so the file holds
  everything up to the last drain round; the readers accept a file without its end.

One finishing routine is current per process (:func:`guard`); a fork child installs its own.
"""

from __future__ import annotations

import os
import signal
import threading
import traceback
from collections.abc import Callable

from rethook.engine.core import notrace

#: The signals whose default action ends the process and that a program is commonly ended by.
FATAL_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGQUIT")
                      if hasattr(signal, name))

_real_exit = os._exit
_finisher: Callable[[str], None] | None = None  # this process's, once
_installed: list[int] = []  # signals whose handler is ours


def guard(finish: Callable[[str], None]) -> None:
    """Make ``finish(why)`` run before this process ends by a fatal signal or ``os._exit``
    (at most once; :func:`release` when the run finished the normal way)."""
    global _finisher
    _finisher = finish
    if threading.current_thread() is threading.main_thread():
        for sig in FATAL_SIGNALS:
            try:
                if signal.getsignal(sig) is signal.SIG_DFL:
                    signal.signal(sig, _on_signal)
                    _installed.append(sig)
            except (OSError, ValueError):
                continue
    os._exit = _exit


def release() -> None:
    """The run is finished: nothing left to do at exit; default dispositions back where the
    handler is still ours."""
    global _finisher
    _finisher = None
    while _installed:
        sig = _installed.pop()
        try:
            if signal.getsignal(sig) is _on_signal:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            continue


def disarm() -> None:
    """Nothing to finish for now (a fork child setting up its own run)."""
    global _finisher
    _finisher = None


def finish_now(why: str) -> None:
    """Run the current finishing routine (once), reporting its failure instead of raising."""
    global _finisher
    finish, _finisher = _finisher, None
    if finish is None:
        return
    with notrace():
        try:
            finish(why)
        except BaseException:  # noqa: BLE001 - the process is ending: say why, end anyway
            try:
                traceback.print_exc()
            except Exception:  # noqa: BLE001 - stderr closed
                pass


def _on_signal(signum: int, frame: object) -> None:
    with notrace():
        finish_now(signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # the default action ends the process here


def _exit(status: int) -> None:
    """``os._exit``, after finishing the trace."""
    finish_now("os._exit")
    _real_exit(status)


_exit.__doc__ = _real_exit.__doc__
_exit.__name__ = "_exit"
