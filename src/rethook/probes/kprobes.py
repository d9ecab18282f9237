"""kretprobe and fprobe: the kernel's return-probe APIs as thin users of the hook engine.

Both ride on the engine's shared shadow stack (the seeds' proposal), so there is no instance
pool that can run dry: ``maxactive`` is only a limit on concurrently open instances, and a call
over it is counted in ``nmissed`` the way the kernel counts a dry pool.

kretprobe (one function)::

    rp = Kretprobe("json.loads", handler=on_return, entry_handler=on_entry, maxactive=0)
    rp.register() ... rp.unregister()
    # entry_handler(ri, frame) -> falsy to hook the return, truthy to skip it (kernel rule)
    # handler(ri, retval); ri.exc is the exception when the call raised; ri.data is the pouch

fprobe (many functions by glob)::

    fp = Fprobe("mod.* ", notfilter="mod._private*", entry_handler=..., exit_handler=...)
    # entry_handler(fp, code, frame, entry_data) -> 0/None to get the exit, non-zero to skip
    # exit_handler(fp, code, frame, retval, entry_data, exc, flags)

``flags & FLAG_UNFINISHED`` marks a call still open when its probe was unregistered.
"""

from __future__ import annotations

import threading
from types import CodeType, FrameType

from rethook.engine.engine import Engine, FgraphOps, get_engine
from rethook.engine.filters import FilterError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any


class ProbeError(ValueError):
    """A probe cannot be defined or registered as asked."""


class KretprobeInstance:
    """One open call of a kretprobed function (the kernel's ``kretprobe_instance``)."""

    __slots__ = ("rp", "code", "frame", "task", "entry_time", "data", "exc", "flags")

    def __init__(self, rp: Kretprobe, code: CodeType, frame: FrameType | None,
                 entry_time: int) -> None:
        self.rp = rp
        self.code = code
        self.frame = frame  # the probed call's frame: arguments via frame.f_locals
        self.task = threading.get_ident()
        self.entry_time = entry_time
        self.data: dict[str, Any] = {}  # the data pouch: entry_handler -> handler
        self.exc: BaseException | None = None
        self.flags = 0  # FLAG_UNFINISHED when the probe was unregistered mid-call


class _ProbeOps(FgraphOps):
    """Shared by both probes: counting and the engine hookup."""

    def __init__(self, filter: Iterable[str] | str, notrace: Iterable[str] | str, name: str,
                 engine: Engine | None) -> None:
        try:
            super().__init__(filter=filter, notrace=notrace, name=name)
        except FilterError as e:
            raise ProbeError(str(e)) from e
        self._engine = engine
        self._lock = threading.Lock()
        self.nhit = 0  # entries seen
        self._own_missed = 0  # entries refused by this probe's own limit (maxactive)
        self._reg: Any = None  # the engine registration, for its nmissed

    @property
    def nmissed(self) -> int:
        """Calls this probe could not handle: over ``maxactive``, recursion, full stack."""
        return self._own_missed + (self._reg.nmissed if self._reg is not None else 0)

    def register(self) -> None:
        engine = self._engine or get_engine()
        engine.register_ftrace_graph(self)
        self._reg = engine.registration(self)

    def unregister(self) -> None:
        if self.engine is None:
            raise ProbeError(f"{self!r} is not registered")
        self.engine.unregister_ftrace_graph(self)  # keeps self._reg: its counts stay readable

    @property
    def registered(self) -> bool:
        return self.engine is not None


class Kretprobe(_ProbeOps):
    """A return probe on one function, with the kernel's kretprobe semantics."""

    def __init__(self, symbol: str, handler: Callable[[KretprobeInstance, Any], Any] | None = None,
                 entry_handler: Callable[[KretprobeInstance, FrameType | None], Any] | None = None,
                 maxactive: int = 0, *, engine: Engine | None = None) -> None:
        if maxactive < 0:
            raise ProbeError(f"kretprobe {symbol!r}: maxactive must be >= 0, got {maxactive}")
        self.symbol = symbol
        super().__init__(symbol, (), f"kretprobe:{symbol}", engine)
        matched = self.filter.select_by_id()
        if len(matched) > 1:
            raise ProbeError(
                f"kretprobe {symbol!r} matches {len(matched)} functions; a kretprobe probes "
                "one function (use an fprobe for many)")
        self.handler = handler
        self.entry_handler = entry_handler
        self.maxactive = maxactive  # 0: no limit (the shadow stack cannot run dry)
        self.nactive = 0

    def entryfunc(self, code: CodeType, frame: FrameType | None, depth: int, t: int) -> Any:
        with self._lock:
            self.nhit += 1
            if self.maxactive and self.nactive >= self.maxactive:
                self._own_missed += 1
                return None
            self.nactive += 1
        ri = KretprobeInstance(self, code, frame, t)
        if self.entry_handler is not None and self.entry_handler(ri, frame):
            with self._lock:
                self.nactive -= 1
            return None  # a voluntary skip, not a miss
        return ri

    def retfunc(self, code: CodeType, frame: FrameType | None, depth: int,
                ri: KretprobeInstance, retval: Any, exc: BaseException | None, t0: int,
                t1: int, sleep: int, flags: int) -> None:
        with self._lock:
            self.nactive -= 1
        ri.exc = exc
        ri.flags = flags
        if self.handler is not None:
            self.handler(ri, retval)

    def __repr__(self) -> str:
        return f"<Kretprobe {self.symbol!r}>"


class Fprobe(_ProbeOps):
    """A probe on many functions by glob, with the kernel's fprobe semantics."""

    def __init__(self, filter: Iterable[str] | str, notfilter: Iterable[str] | str = (),
                 entry_handler: Callable[..., Any] | None = None,
                 exit_handler: Callable[..., Any] | None = None, *,
                 name: str | None = None, engine: Engine | None = None) -> None:
        super().__init__(filter, notfilter, name or "fprobe", engine)
        self.entry_handler = entry_handler
        self.exit_handler = exit_handler
        self.disabled = False

    def enable(self) -> None:
        self.disabled = False

    def disable(self) -> None:
        """Stop seeing new calls without unregistering (calls already entered still exit)."""
        self.disabled = True

    def entryfunc(self, code: CodeType, frame: FrameType | None, depth: int, t: int) -> Any:
        if self.disabled:
            return None
        self.nhit += 1
        entry_data: dict[str, Any] = {}
        if self.entry_handler is not None and self.entry_handler(self, code, frame, entry_data):
            return None  # non-zero: no exit handler for this call
        if self.exit_handler is None:
            return None
        return entry_data

    def retfunc(self, code: CodeType, frame: FrameType | None, depth: int, entry_data: Any,
                retval: Any, exc: BaseException | None, t0: int, t1: int, sleep: int,
                flags: int) -> None:
        # Unlike the kernel, a call entered before disable() still gets its exit, so entries
        # and exits never drift apart.
        handler = self.exit_handler
        if handler is not None:
            handler(self, code, frame, retval, entry_data, exc, flags)

    def __repr__(self) -> str:
        return f"<Fprobe {self.name!r}>"


def register_kretprobe(rp: Kretprobe) -> None:
    rp.register()


def unregister_kretprobe(rp: Kretprobe) -> None:
    rp.unregister()


def register_fprobe(fp: Fprobe) -> None:
    fp.register()


def unregister_fprobe(fp: Fprobe) -> None:
    fp.unregister()
