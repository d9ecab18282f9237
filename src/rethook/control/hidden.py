"""Threads the traced program does not see, and how they step aside around ``os.fork()``.

rethook's own threads (the control channel's server and its connections) are raw
:mod:`_thread` threads, not :class:`threading.Thread`: ``threading.enumerate()`` and
``active_count()`` stay the program's. A thread that would make a single-threaded program
fork as a multi-threaded one is stopped before the fork and started again after it
(:class:`HiddenThread`); Python 3.13+ counts threads only after the at-fork hooks have
restarted it, so that one warning is hushed until the restarted thread runs
(:func:`hush_fork_warning`).

rethook's own threads block the signals sent to the process
(:func:`leave_signals_to_the_program`): the kernel hands such a signal to any thread that does
not block it, and one that lands on a background thread does not interrupt the main thread
where it waits (a pool worker blocked on a lock, a ``time.sleep``): its Python handler would
not run until that wait ended by itself.
"""

from __future__ import annotations

import _signal  # (signal.py makes enums of every signal it returns: ~1 ms a start-up)
import _thread
import os
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: Python's warning on ``os.fork()`` in a process with several threads.
_FORK_WARNING = r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead"
_hushed: list[tuple] = []


#: Signals the kernel raises in the thread that caused them: never blocked (a blocked one
#: would still kill the process, without Python's fault handler).
_SYNCHRONOUS = frozenset(getattr(_signal, name) for name in
                         ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGABRT")
                         if hasattr(_signal, name))


def leave_signals_to_the_program() -> None:
    """Block, in the calling thread (one of rethook's own), every signal sent to the process,
    so that the kernel delivers them to the program's threads as it would untraced."""
    if hasattr(_signal, "pthread_sigmask"):
        _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals() - _SYNCHRONOUS)


def _settle() -> None:
    """A hidden thread's first step: the program's signals and fork warning as they were."""
    leave_signals_to_the_program()
    unhush_fork_warning()


class HiddenThread:
    """A ``_thread`` thread with a join: ``target(*args)`` runs once per :meth:`start`."""

    def __init__(self, target: Callable[..., Any], *args: Any) -> None:
        self._target = target
        self._args = args
        self._done: Any = None  # held while the thread runs: joining is acquiring it
        self.native_id = 0

    @property
    def alive(self) -> bool:
        return self._done is not None and self._done.locked()

    def start(self) -> None:
        done = self._done = _thread.allocate_lock()
        done.acquire()
        # made with the signals blocked (a thread starts with its maker's mask): from its
        # first instruction, not from when it first gets the GIL to block them itself
        blocked = None
        if hasattr(_signal, "pthread_sigmask"):
            blocked = _signal.pthread_sigmask(_signal.SIG_BLOCK,
                                             _signal.valid_signals() - _SYNCHRONOUS)
        try:
            _thread.start_new_thread(self._run, (done,))
        finally:
            if blocked is not None:
                _signal.pthread_sigmask(_signal.SIG_SETMASK, blocked)

    def _run(self, done: Any) -> None:
        self.native_id = threading.get_native_id()
        # rethook's own work, not the program's (-l '*'); the channel imports no engine
        core = sys.modules.get("rethook.engine.core")
        if core is None:
            _settle()
        else:
            with core.notrace():
                _settle()
        try:
            self._target(*self._args)
        finally:
            done.release()

    def join(self, timeout: float | None = None, until_gone: bool = False) -> bool:
        """Wait for the thread to end (``until_gone``: until the OS no longer lists it, as
        Python's fork warning counts OS threads). False if it is still running."""
        done = self._done
        if done is None:
            return True
        if not done.acquire(timeout=-1 if timeout is None else timeout):
            return False
        done.release()
        if until_gone and self.native_id:
            _wait_thread_gone(self.native_id)
        return True


def os_threads() -> int | None:
    """How many threads the OS says this process has (Linux), as Python's fork warning
    counts them; None where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[17])
    except (OSError, ValueError, IndexError):
        return None


def hush_fork_warning() -> None:
    """The program forks with only its one thread: Python 3.13+ would still warn, because it
    counts threads after the at-fork hooks, which restart rethook's. Hide that one warning
    (the restarted thread lifts the filter as soon as it runs)."""
    if sys.version_info >= (3, 13) and os_threads() == 1:
        import warnings  # (not at start-up: ~0.3 ms)

        warnings.filterwarnings("ignore", message=_FORK_WARNING, category=DeprecationWarning)
        _hushed.append(warnings.filters[0])


def unhush_fork_warning() -> None:
    warnings = sys.modules.get("warnings")  # (hush_fork_warning loaded it)
    while warnings is not None and _hushed:
        entry = _hushed.pop()
        try:
            warnings.filters.remove(entry)
        except ValueError:
            continue  # the program reset the filters meanwhile
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:
            mutated()  # as filterwarnings() does: cached decisions are stale


def _wait_thread_gone(native_id: int, limit: float = 0.2) -> None:
    """Wait (briefly) until a thread that has finished its function is gone from the OS too."""
    task = f"/proc/self/task/{native_id}"
    deadline = time.monotonic() + limit
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.0005)
