"""What every hook core is: the interface the engine drives, and what a core can do.

A *core* is the hot path (the ``sys.monitoring`` callbacks and the per-thread shadow stacks).
Two implement :class:`HookCore`: the pure-Python reference (:class:`rethook.engine.core.PyCore`)
and the C core (:class:`rethook.engine.select.CCore`); :func:`rethook.engine.select.choose_core`
picks one. Whatever differs between them that the rest of rethook may depend on is in the
core's :class:`Capabilities`, read in one place each: ``rethook --version`` prints them, the
built-in tracers choose their native users from them (tracers/native.py), and the tests' core
matrix (which cores to run the suite on, which tests need native users) comes from
:func:`rethook.engine.select.available_cores`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, ClassVar, Protocol, runtime_checkable

from rethook.frozen import Frozen


class Capabilities(Frozen):
    """What a hook core can do, beyond the contract every core keeps (core.py's docstring)."""

    __slots__ = ("name", "direct_calls", "native_users")

    #: ``"c"`` or ``"python"``: what ``RETHOOK_ENGINE`` names it by
    name: str
    #: It calls C users' hooks directly, with no Python object per call
    #: (engine/fgraph_direct.h); the engine builds direct entries only for such a core.
    direct_calls: bool
    #: The built-in tracers' users written in C (tracers/_native.c) run on it: they share
    #: the core's C thread cache, clock and direct calls.
    native_users: bool

    def __init__(self, name: str, direct_calls: bool, native_users: bool) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "direct_calls", direct_calls)
        object.__setattr__(self, "native_users", native_users)

    def describe(self) -> str:
        """One line for ``rethook --version``."""
        what = [n for n, on in (("direct calls", self.direct_calls),
                                ("native users", self.native_users)) if on]
        return f"core capabilities: {', '.join(what) or 'reference only (no C)'}"


@runtime_checkable
class HookCore(Protocol):
    """The interface the engine drives (``Engine.core``); both cores implement it."""

    name: str
    note: str
    capabilities: ClassVar[Capabilities]
    tool_id: int | None
    LOCAL_CALL_EVENTS: ClassVar[int]
    LOCAL_RETURN_EVENTS: ClassVar[int]
    GLOBAL_EVENTS: ClassVar[int]
    Registration: ClassVar[type]
    EntryRegistration: ClassVar[type]
    notrace: ClassVar[type]

    def install(self, tool_id: int) -> None: ...
    def uninstall(self) -> None: ...
    def publish(self, table: dict[int, tuple]) -> None: ...
    def set_max_depth(self, depth: int) -> None: ...
    def set_sweeping(self, on: bool) -> None: ...
    def set_overflow(self, hook: Callable[[], None] | None, limit: int) -> None: ...
    def sweep_lock(self) -> threading.RLock: ...
    def internal_errors(self) -> int: ...
    def dead_counts(self) -> tuple[int, int]: ...
    def thread_states(self) -> list[Any]: ...
    def current_thread_state(self) -> Any | None: ...
    def parked(self) -> dict[FrameType, list]: ...
    def after_fork_in_child(self) -> None: ...
    def drain_wait(self, seconds: float, first: bool) -> bool: ...
    def drain_end(self) -> None: ...
    def drain_wake(self) -> None: ...
    def drain_blocking(self, seconds: float) -> None: ...
    def deliver(self, rec: Any, depth: int, retval: Any, exc: BaseException | None, t: int,
                flags: int, ts: Any = None) -> None: ...
    def handler_failed(self, reg: Any, exc: BaseException) -> None: ...


__all__ = ["Capabilities", "HookCore"]
