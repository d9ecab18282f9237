"""Locks held across ``os.fork()``, so that a child never starts with one of them taken by a
thread it does not have (or by its own thread, in the middle of nothing).

An object registered with :func:`hold` has its ``_lock`` (a ``threading.RLock``) acquired
just before every fork, rank by rank in the order the code nests them (an engine's before a
registry's), released after it in the parent, and replaced by a new lock in the child.
Holding them means no other thread is inside an engine method or a registry update at the
moment of the fork.
"""

from __future__ import annotations

import os
import threading
from _weakrefset import WeakSet  # (as weakref.WeakSet; weakref itself: ~0.5 ms of a start-up)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Ranks: the order the locks are taken in (an engine method may update the registry).
ENGINE, REGISTRY = 0, 1

_ranks: tuple[WeakSet[Any], ...] = (WeakSet(), WeakSet())
_held: list[Any] = []


def hold(obj: Any, rank: int) -> None:
    """Hold ``obj._lock`` across every fork from now on (for as long as ``obj`` lives)."""
    _ranks[rank].add(obj)


def _before_fork() -> None:
    _held[:] = [obj for rank in _ranks for obj in list(rank)]
    for obj in _held:
        obj._lock.acquire()


def _after_fork_in_parent() -> None:
    for obj in reversed(_held):
        obj._lock.release()
    _held.clear()


def _after_fork_in_child() -> None:
    for obj in _held:
        obj._lock = threading.RLock()
    _held.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
