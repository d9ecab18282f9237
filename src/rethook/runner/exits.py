"""No exit loses what was recorded: the ways a traced process can end, and what runs first.

* SIGTERM, SIGHUP, SIGQUIT: while a run records, each of them whose disposition is the
  default gets a handler that finishes the trace (calls still open delivered as unfinished,
  the file's end written, children gathered, the summary printed) and then lets the signal
  take its normal effect: the handler is reset to the default and the signal sent again, so
  the process ends by it exactly as it would have (same exit status, core dump for SIGQUIT).
  A signal the program ignores, or handles itself (installed before or after), stays the
  program's business: its own handler runs, as untraced. A signal that comes while the main
  thread is inside rethook's own work (discovering a function, a handler) is sent again a
  moment later: finishing there would wait for locks that very thread holds (during the
  interpreter's shutdown, when no thread can start, the finish at exit ends by it). One that comes
  while the trace is being finished (a pool terminating workers that are already ending)
  takes effect once the end is written. One whose handler CPython never runs (it came just
  before the main thread blocked for good) is raised again by the drain (:func:`check_signals`).
* ``os._exit()`` (what a fork child of multiprocessing ends with, and what some programs
  call): ``os._exit`` is wrapped to finish the trace first.
* SIGKILL, a crash: nothing can run. The recorder writes whole chunks as it drains the rings
  (at least every :data:`~rethook.runner.observers.DRAIN_POLL_SECONDS`), so the file holds
  everything up to the last drain round; the readers accept a file without its end.

One finishing routine is current per process (:func:`guard`); a fork child installs its own.
"""

from __future__ import annotations

import _signal  # (signal.py makes enums of every signal and handler: ~1 ms a start-up)
import _thread
import os
import threading
import time

from rethook.buffer.tracefile import read_held as _read_held
from rethook.control.hidden import leave_signals_to_the_program
from rethook.engine.core import in_own_work, notrace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

#: The signals whose default action ends the process and that a program is commonly ended by.
_FATAL_NAMES = {getattr(_signal, name): name for name in ("SIGTERM", "SIGHUP", "SIGQUIT")
                if hasattr(_signal, name)}
FATAL_SIGNALS = tuple(_FATAL_NAMES)

#: How long a signal that came during rethook's own work waits to be sent again.
RESEND_SECONDS = 0.005
#: How long a fatal signal CPython received may stay without its handler run before it is
#: raised again in the main thread (see check_signals).
STUCK_SECONDS = 0.05
#: How often check_signals reads the wakeup pipe at most: in a call storm the drain's rounds
#: come every millisecond or so.
CHECK_SECONDS = STUCK_SECONDS / 2
_checked_at = 0.0  # when check_signals last read the pipe
#: After this many deferrals (2 s) the signal takes its effect, the trace unfinished.
MAX_DEFERRALS = 400
_deferred = 0

_real_exit = os._exit
_finisher: Callable[[str], None] | None = None  # this process's, once
_finishing = False  # the run is being finished: a fatal signal waits for release()
_pending: int | None = None  # the fatal signal that came while finishing
_installed: list[int] = []  # signals whose handler is ours
_wakeup: tuple[int, int] | None = None  # the signal wakeup pipe this process set (r, w)
_arrived: dict[int, float] = {}  # fatal signal -> when check_signals saw it come
_handled_at = 0.0  # when _on_signal last ran (time.monotonic)


def guard(finish: Callable[[str], None]) -> None:
    """Make ``finish(why)`` run before this process ends by a fatal signal or ``os._exit``
    (at most once; :func:`release` when the run finished the normal way)."""
    global _finisher
    _finisher = finish
    if threading.current_thread() is threading.main_thread():
        for sig in FATAL_SIGNALS:
            try:
                if _signal.getsignal(sig) is _signal.SIG_DFL:
                    _signal.signal(sig, _on_signal)
                    _installed.append(sig)
            except (OSError, ValueError):
                continue
        _arm_wakeup()
    os._exit = _exit


def finishing() -> None:
    """The run is being finished (once): from now on a fatal signal waits for
    :func:`release`, so that it cannot cut the trace's end short."""
    global _finisher, _finishing
    _finisher = None
    _finishing = True


def release() -> None:
    """The run is finished: nothing left to do at exit; default dispositions back where the
    handler is still ours, and a fatal signal that came while finishing takes effect now."""
    global _finisher, _finishing, _pending
    _finisher = None
    _finishing = False
    while _installed:
        sig = _installed.pop()
        try:
            if _signal.getsignal(sig) is _on_signal:
                _signal.signal(sig, _signal.SIG_DFL)
        except (OSError, ValueError):
            continue
    _disarm_wakeup()
    pending, _pending = _pending, None
    if pending is not None:
        _signal.signal(pending, _signal.SIG_DFL)
        os.kill(os.getpid(), pending)  # the process ends by it, as it would have untraced


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
                import traceback  # (not at start-up: ~2 ms)

                traceback.print_exc()
            except Exception:  # noqa: BLE001 - stderr closed
                pass


def _on_signal(signum: int, frame: object) -> None:
    global _deferred, _pending, _handled_at
    _handled_at = time.monotonic()
    if _finishing:  # the trace's end is being written: the signal takes effect after it
        _pending = signum
        return
    if in_own_work() and _deferred < MAX_DEFERRALS:
        # The signal came while this thread was inside rethook (registering a function it
        # met, say), holding locks that finishing needs: finish once out of it.
        _deferred += 1
        try:
            _thread.start_new_thread(_send_again, (signum,))
            return
        except RuntimeError:  # the interpreter is shutting down: no new thread
            if _finisher is not None:  # the finish at exit is to come: it ends by the signal
                _pending = signum
                return
    with notrace():
        if _deferred < MAX_DEFERRALS:  # else stuck inside rethook: end without finishing
            finish_now(_FATAL_NAMES.get(signum, f"signal {signum}"))
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # the default action ends the process here


def _send_again(signum: int) -> None:
    """A deferred signal, sent again a moment later (rethook's own work is short)."""
    leave_signals_to_the_program()
    time.sleep(RESEND_SECONDS)
    os.kill(os.getpid(), signum)


def _exit(status: int) -> None:
    """``os._exit``, after finishing the trace."""
    finish_now("os._exit")
    _real_exit(status)


_exit.__doc__ = _real_exit.__doc__
_exit.__name__ = "_exit"


# --- a signal whose handler does not run --------------------------------------------------------
# CPython runs a Python signal handler when the main thread next checks for signals; one that
# lands just before the main thread blocks in a call that does not return by itself (a pool
# worker waiting on a semaphore) is noted and never handled, and the process, which would
# have died of it untraced, waits forever. The signal wakeup fd shows every signal CPython
# receives; rethook's drain thread looks at it each round (check_signals) and raises a fatal
# signal whose handler has not run again in the main thread, which interrupts the wait.

def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _arm_wakeup() -> None:
    """Set a wakeup fd (main thread), unless this process has one already (ours, or the
    program's). A fork child starts without one (_after_fork_in_child)."""
    global _wakeup
    if _wakeup is not None:
        return
    try:
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
    except OSError:
        return
    try:
        old = _signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (OSError, ValueError):
        _close(r, w)
        return
    if old != -1:
        _signal.set_wakeup_fd(old)  # the program's: it stays
        _close(r, w)
        return
    _wakeup = (r, w)


def _disarm_wakeup() -> None:
    """Take the wakeup fd back (main thread), unless the program has set its own since."""
    global _wakeup
    if _wakeup is None or threading.current_thread() is not threading.main_thread():
        return
    r, w = _wakeup
    _wakeup = None
    try:
        current = _signal.set_wakeup_fd(-1)
        if current != w:
            _signal.set_wakeup_fd(current)
    except (OSError, ValueError):
        return
    _close(r, w)


# os.fork(): the wakeup pipe is inherited, and a signal the child receives before it has a pipe
# of its own would be written into the parent's (whose drain would raise it in the parent).
# The forking thread blocks the fatal signals across the fork; the child drops the inherited
# pipe (guard() makes it one of its own) before unblocking them.
_blocked_for_fork: list[set[int]] = []


def _before_fork() -> None:
    if _wakeup is not None and hasattr(_signal, "pthread_sigmask"):
        _blocked_for_fork.append(_signal.pthread_sigmask(_signal.SIG_BLOCK, FATAL_SIGNALS))


def _unblock_after_fork() -> None:
    while _blocked_for_fork:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, _blocked_for_fork.pop())


def _after_fork_in_child() -> None:
    global _wakeup
    inherited, _wakeup = _wakeup, None
    if inherited is not None:
        try:
            _signal.set_wakeup_fd(-1)
        except (OSError, ValueError):
            pass
        _close(*inherited)
    _unblock_after_fork()


os.register_at_fork(before=_before_fork, after_in_parent=_unblock_after_fork,
                    after_in_child=_after_fork_in_child)


def check_signals() -> None:
    """Called by rethook's own threads (a drain round): a fatal signal CPython received whose
    handler has not run after :data:`STUCK_SECONDS` is raised again in the main thread. Looks
    every :data:`CHECK_SECONDS` at most."""
    global _checked_at
    wakeup = _wakeup
    if wakeup is None:
        return
    now = time.monotonic()
    if now - _checked_at < CHECK_SECONDS:
        return
    _checked_at = now
    try:
        data = _read_held(wakeup[0], 256)
    except OSError:  # nothing there (non-blocking), or closed meanwhile
        data = b""
    for sig in set(data):
        if sig in FATAL_SIGNALS and sig not in _arrived:
            _arrived[sig] = now
    for sig, when in list(_arrived.items()):
        if _handled_at >= when or _signal.getsignal(sig) is not _on_signal:
            del _arrived[sig]
        elif now - when >= STUCK_SECONDS:
            _arrived[sig] = now
            try:
                _signal.pthread_kill(threading.main_thread().ident, sig)
            except (OSError, ValueError):
                del _arrived[sig]
