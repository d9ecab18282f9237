"""The hook engine's control side: users, slots, per-code dispatch, live changes and teardown.

Users (the kernel's ``ftrace_ops`` and ``fgraph_ops``) register here with a filter. The engine
resolves every filter against the function registry once, builds one dispatch entry per hooked
code object (the kernel's per-function trampoline), publishes the whole table with one reference
swap, and turns ``sys.monitoring`` local events on for exactly the code objects some user wants.
Code nobody wants has no events and runs at full speed after its first call (discovery, in
:mod:`rethook.engine.core`, sees each code object once). The hot path that uses the table is in
:mod:`rethook.engine.core`; this module never runs per call.

Functions that appear later (a module imported, code seen for the first time) are matched
against the users' filters as they come; those hooked only add their own entries to the
published table (:meth:`Engine._hook_new`), so enabling them costs in proportion to the new
functions, not to every hooked one.

Changing users while other threads run hooked code
--------------------------------------------------
Adding is simple: turn events on, then publish (a call entering in between is not in the table
yet and is left alone), then re-arm what discovery had disabled (:meth:`Engine._rearm`).
Removing a user or a function needs the
*sweep*, the engine's ``synchronize_rcu``: publish the table without it, wait until every other
thread has been seen outside the core (``ThreadState.busy`` clear, or held at a transition's
start by ``sweep_lock``), then, holding the lock, take the retired registrations' claims off
every shadow stack and parked record and deliver them as ``FLAG_UNFINISHED``, and wait once
more so no delivery to a retired user is still running when ``unregister`` returns. A code
object that leaves every filter while calls of it are still open keeps its return events
("draining") until those calls end, so they still get their normal return.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from _collections_abc import Mapping  # (collections.abc imports collections: ~1.7 ms)
from types import CodeType, FrameType

from rethook.engine import clock, forklocks, toolid
from rethook.engine import core as _core
from rethook.engine.core import (
    DEFAULT_MAX_DEPTH,
    FLAG_CLOSED,
    FLAG_UNFINISHED,
    GENERATOR,
    REC_CODE,
    REC_FRAME,
    REC_HEADER,
    REC_SLEEP,
    REC_TIME,
    WANT_FRAME,
    WANT_TIME,
    EntryKind,
    claims,
    direct_registration,
    entry_code,
    entry_kind,
    make_direct,
    make_marker,
)
from rethook.engine.filters import FunctionFilter
from rethook.engine.registry import (
    NON_FUNCTION_KINDS,
    FunctionInfo,
    Registry,
    codes_by_id,
    default_registry,
    is_own_module,
)
from rethook.engine.select import choose_core

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

#: Number of graph-user slots (the kernel's FGRAPH_ARRAY_SIZE is 16).
FGRAPH_ARRAY_SIZE = 64
#: Parked records that trigger a search for closed/collected generators (doubles as they grow).
PARKED_HIGH_WATER = 1024
#: A sweep that waits longer than this for a thread to leave its handler says so.
QUIESCE_WARN_SECONDS = 2.0

#: co_flags of code whose calls suspend: generators, coroutines, async generators.
SUSPENDING = 0x20 | 0x80 | 0x100 | 0x200


def _dispatch_of(code: CodeType, parts: tuple) -> tuple:
    """A function's dispatch entry ``(entry users, graph users, flags, marker, direct)``
    from what its users share (:meth:`Engine._shared_dispatch`): a generator's or
    coroutine's flags, a plain function's marker, the direct entry of a C user."""
    entry, graph, flags, _, capsule = parts
    suspending = code.co_flags & SUSPENDING
    if suspending:
        flags |= GENERATOR | WANT_FRAME
    marker = make_marker(code) if graph and not suspending else None
    # (the capsule is the one graph user's, or, without graph users, the one entry user's)
    direct = make_direct(code, (graph or entry)[0], capsule) if capsule is not None else None
    return (entry, graph, flags, marker, direct)


class EngineError(RuntimeError):
    """A user cannot be registered or unregistered."""


def _untraced(method: Callable) -> Callable:
    """Run an engine method under ``notrace``: the stdlib code it calls while holding the
    engine's lock must not run handlers (which could call back into the engine)."""

    def wrapper(self: Engine, *args: Any, **kwargs: Any) -> Any:
        with _core.notrace():
            try:
                return method(self, *args, **kwargs)
            finally:
                # functions another thread found while this one held the lock
                if self._late and not self._lock._is_owned():  # type: ignore[attr-defined]
                    self._hook_late()

    wrapper.__name__ = method.__name__
    wrapper.__qualname__ = method.__qualname__
    wrapper.__doc__ = method.__doc__
    return wrapper


def _decline(code: CodeType, frame: FrameType | None, depth: int, t: int) -> None:
    return None


def _ignore(code: CodeType, frame: FrameType | None) -> None:
    return None


def _leave_events(tool_id: int, code: CodeType, events: int) -> None:
    """set_local_events for a tool id that is not rethook's any more: nothing to do."""


def _own_code(info: FunctionInfo) -> bool:
    """rethook never hooks itself (the kernel's ``notrace`` on the tracing code)."""
    return is_own_module(info.module)


def _selectable(info: FunctionInfo) -> bool:
    """A registered function a filter can select: not a module or class body, not rethook's."""
    return info.kind not in NON_FUNCTION_KINDS and not _own_code(info)


class _EveryRegistered(Mapping):
    """The selection of a user whose filter takes every function (``-l '*'``): ``id(code) ->
    code`` of every function the registry has registered, rethook's own excepted, read from
    the registry's own dict as it grows. A module's functions are then selected by being
    registered, with no dict of ids filled a module at a time (~1 us a function, most of them
    never called: sqlglot's import registers ~7,000); the cores hand each to
    :meth:`Engine._arm` at its first call (``set_arm_known``). Read only."""

    __slots__ = ("_by_id",)

    def __init__(self, by_id: dict[int, FunctionInfo]) -> None:
        self._by_id = by_id

    def __contains__(self, key: object) -> bool:
        info = self._by_id.get(key)  # type: ignore[call-overload]
        return info is not None and _selectable(info)

    def __getitem__(self, key: int) -> CodeType:
        info = self._by_id.get(key)
        if info is None or not _selectable(info):
            raise KeyError(key)
        return info.code

    def __iter__(self) -> Iterator[int]:
        return iter([key for key, info in list(self._by_id.items()) if _selectable(info)])

    def __len__(self) -> int:
        return sum(1 for info in list(self._by_id.values()) if _selectable(info))


class _Ops:
    """What entry and graph users share: a name, a filter and the engine they are on."""

    def __init__(self, filter: Iterable[str] | str = (), notrace: Iterable[str] | str = (),
                 name: str | None = None, registry: Registry | None = None) -> None:
        if isinstance(filter, str):
            filter = filter.split()
        if isinstance(notrace, str):
            notrace = notrace.split()
        self.name = name or type(self).__name__
        self.filter = FunctionFilter(filter, notrace, registry=registry)
        self.engine: Engine | None = None

    def set_filter(self, text: str, append: bool = False) -> None:
        """``echo text > set_ftrace_filter`` (or ``>>`` with ``append``), applied at once."""
        self.filter.write_filter(text, append=append)
        if self.engine is not None:
            self.engine.update(self)

    def set_notrace(self, text: str, append: bool = False) -> None:
        """``echo text > set_ftrace_notrace`` (or ``>>``), applied at once."""
        self.filter.write_notrace(text, append=append)
        if self.engine is not None:
            self.engine.update(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class FtraceOps(_Ops):
    """An entry user, the kernel's ``ftrace_ops``: ``func(code, frame)`` on every matching call.

    ``frame`` is the called function's frame, so ``frame.f_back`` is the caller (the kernel's
    ``parent_ip``) and ``frame.f_locals`` holds the arguments. Pass ``func`` or override it.
    A user that needs no frame sets ``wants_frame`` to ``False``: where every user of a
    function says so, ``frame`` is ``None`` (a native user reads the caller from the
    interpreter's own frames, engine/pyframe.h).

    A user written in C may also set ``direct`` to a capsule of a C hook that the C core calls
    instead of ``func``, without making Python objects, on functions where it is the only user
    and wants no frame (engine/fgraph_direct.h, "Direct calls of an entry user").
    """

    wants_frame = True
    direct: Any = None

    def __init__(self, func: Callable[[CodeType, FrameType], Any] | None = None, *,
                 filter: Iterable[str] | str = (), notrace: Iterable[str] | str = (),
                 name: str | None = None, registry: Registry | None = None) -> None:
        super().__init__(filter, notrace, name, registry)
        if func is not None:
            self.func = func  # type: ignore[method-assign]

    def func(self, code: CodeType, frame: FrameType) -> None:
        raise NotImplementedError("pass func= or override FtraceOps.func")


class FgraphOps(_Ops):
    """A graph user, the kernel's ``fgraph_ops``, on the shared per-thread shadow stack.

    ``entryfunc(code, frame, depth, t_entry)`` runs at entry; ``None`` or ``False`` declines,
    anything else accepts and is the call's *entry data*, handed back to this user's
    ``retfunc(code, frame, depth, data, retval, exc, t_entry, t_exit, sleep, flags)`` exactly
    once: on return (``exc`` is ``None``), on an exception (``exc`` is it, ``retval`` is
    ``None``), or at teardown with ``flags & FLAG_UNFINISHED``. ``sleep`` is the time in ns a
    generator or coroutine spent suspended; ``t_exit - t_entry`` is the wall duration.
    Optional ``suspendfunc``/``resumefunc(code, frame, depth, data, t)`` see yields and
    resumes (the await points). Without an ``entryfunc`` every call is accepted with data
    ``True``.

    A user that needs no frame or no timestamps sets ``wants_frame``/``wants_time`` to
    ``False``; functions whose users all say so skip that work (handlers then get ``None``/0).

    A user written in C may also set ``direct`` to a capsule of C hooks that the C core calls
    without making Python objects, on functions, generators and coroutines where it is the
    only user and no user wants the frame (engine/fgraph_direct.h states the contract).
    """

    wants_frame = True
    wants_time = True
    direct: Any = None

    def __init__(self, entryfunc: Callable[..., Any] | None = None,
                 retfunc: Callable[..., Any] | None = None, *,
                 suspendfunc: Callable[..., Any] | None = None,
                 resumefunc: Callable[..., Any] | None = None,
                 filter: Iterable[str] | str = (), notrace: Iterable[str] | str = (),
                 name: str | None = None, registry: Registry | None = None) -> None:
        super().__init__(filter, notrace, name, registry)
        if entryfunc is not None:
            self.entryfunc = entryfunc
        elif not hasattr(self, "entryfunc"):
            self.entryfunc = _core._accept_all
        if retfunc is not None:
            self.retfunc = retfunc
        if suspendfunc is not None:
            self.suspendfunc = suspendfunc
        if resumefunc is not None:
            self.resumefunc = resumefunc
        self._task = threading.local()

    def task_var(self) -> dict[str, Any]:
        """This user's private variables for the calling thread (``fgraph_get_task_var``)."""
        try:
            return self._task.vars
        except AttributeError:
            self._task.vars = d = {}
            return d

    def parent_data(self, depth: int = 1) -> Any:
        """Entry data this user stored on its ``depth``-th enclosing call on this thread.

        From inside an entry or return handler, ``depth=1`` is the nearest caller this user
        accepted (the kernel's ``fgraph_retrieve_parent_data``). ``None`` if there is none.
        """
        if self.engine is None:
            return None
        return self.engine.parent_data(self, depth)


class Engine:
    """One process-wide hook: every user shares its tool id, its callbacks and shadow stacks."""

    def __init__(self, registry: Registry | None = None,
                 max_depth: int = DEFAULT_MAX_DEPTH,
                 core: str | _core.PyCore | None = None) -> None:
        """``core``: ``"c"``, ``"python"`` or a core object; default: the C core when built
        (``RETHOOK_ENGINE=python`` forces the pure one; see :mod:`rethook.engine.select`)."""
        self.registry = registry or default_registry()
        self.core = core if isinstance(core, _core.PyCore) else choose_core(core)
        self.max_depth = max_depth
        self.tool_id: int | None = None
        self._lock = threading.RLock()
        self._late: list[FunctionInfo] = []  # found while another thread held _lock
        self._late_lock = threading.Lock()  # held only to add to or take _late
        forklocks.hold(self, forklocks.ENGINE)  # not left locked in a fork child
        self._slots: list[_core.Registration | None] = [None] * FGRAPH_ARRAY_SIZE
        self._graph: dict[FgraphOps, _core.Registration] = {}
        self._entry: dict[FtraceOps, _core.EntryRegistration] = {}
        # id(code) -> code per user: code objects compare by value, so never a set of them
        self._selection: dict[_Ops, Mapping[int, CodeType]] = {}
        self._events: dict[int, tuple[CodeType, int]] = {}  # local events we have set
        self._table: dict[int, tuple] = {}
        # id(code) -> code: new functions the users selected, hooked at their first call (the
        # cores' discovery hands them to _arm), shared with the core
        self._unarmed: dict[int, CodeType] = {}
        self._implicit = False  # a user's selection is _EveryRegistered (see _selected)
        # _build's users' indices -> their _shared_dispatch, and the users in dispatch order,
        # while the users stay the same (both forgotten by _reconcile and _stop)
        self._shared: dict[tuple[int, ...], tuple] = {}
        self._users: list[tuple[_Ops, Any, bool]] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._parked_limit = PARKED_HIGH_WATER
        self._closed_deliveries = 0
        self._unfinished_deliveries = 0
        #: What another tool did to the hook (see check_hook), kept after stop() for the
        #: report; None while it is intact.
        self.lost: str | None = None
        self._for_exit = False  # see for_exit()
        #: The process ends with this run (for_exit() was called): what it allocated goes
        #: back with it, which its users may count on rather than free it piece by piece.
        self.ending = False
        # (tool id, codes) whose local events a stop for exit left set, cleared by a start
        self._left_set: tuple[int, list[CodeType]] | None = None

    # --- lifecycle ------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.tool_id is not None

    @_untraced
    def start(self) -> None:
        """Claim a tool id and install the callbacks (done by the first registration)."""
        with self._lock:
            if self.running:
                return
            global _active
            if _active is not None and _active is not self:
                raise EngineError("another rethook engine is running in this process")
            self.tool_id = toolid.acquire()
            self.lost = None
            left, self._left_set = self._left_set, None
            if left is not None and left[0] == self.tool_id:  # the process went on after all
                for code in left[1]:
                    sys.monitoring.set_local_events(self.tool_id, code, 0)
            self.core.set_max_depth(self.max_depth)
            self._publish({})
            self.core.install(self.tool_id)
            self.core.set_overflow(self._parked_overflow, self._parked_limit)
            self._unsubscribe = self.registry.subscribe(self._on_new_functions)
            # code the import hook never sees (exec, other import hooks): on its first call
            self.core.set_discovery(self.registry.discover, self.registry.known_ids(),
                                    self.registry.known_bodies(), self._unarmed, self._arm)
            _active = self

    def check_hook(self) -> str | None:
        """Whether another tool has taken the hook from under rethook (the program freed the
        tool id, or changed its events: see ``core.hook_lost``); once it has, the reason
        stays, for whoever reports the run. Cheap: a drain thread asks every round. Not
        while another thread starts or stops the engine (its hook is half made then)."""
        if self.lost is None and self.running and self._lock.acquire(blocking=False):
            try:
                if self.running:
                    self.lost = self.core.hook_lost()
            finally:
                self._lock.release()
        return self.lost

    def _owns_hook(self) -> bool:
        return sys.monitoring.get_tool(self.tool_id) == toolid.TOOL_NAME

    def for_exit(self) -> None:
        """The process ends once the users are gone (the command line's run is over): the
        last user's unregister stops the engine at once, and stopping delivers the open calls
        and removes the callbacks but leaves each hooked function's local events set, with
        nothing left to call. Un-hooking function by function (publishing every function's
        draining dispatch, then turning its events off: ~40 ms for sqlglot's ~5,000 under
        ``-l '*'``) is for a process that goes on running them."""
        self._for_exit = True
        self.ending = True

    def _last_user_left(self, retired: list[Any]) -> bool:
        """In :meth:`for_exit` mode, stop now if no user is left (``retired``: the one that
        just left, whose open calls the stop delivers). Caller holds the lock."""
        if not self._for_exit or self._graph or self._entry:
            return False
        self._stop(retired)
        return True

    @_untraced
    def stop(self) -> None:
        """Unregister every user (open calls get FLAG_UNFINISHED) and give the tool id back.

        If the program freed the tool id meanwhile, its events and callbacks are still set
        (CPython keeps them): the id is taken back for the time it takes to remove them. An id
        another tool holds now is not touched."""
        self._stop([])

    def _stop(self, left: list[Any]) -> None:
        """:meth:`stop`; ``left``: registrations that already left, whose open calls are
        delivered with the rest."""
        with self._lock:
            if not self.running:
                return
            global _active
            self._arm_in_core(False)
            self.check_hook()
            if sys.monitoring.get_tool(self.tool_id) is None:
                try:
                    sys.monitoring.use_tool_id(self.tool_id, toolid.TOOL_NAME)
                except ValueError:  # taken meanwhile: then it is not ours
                    pass
            if self._owns_hook():
                self.core.set_discovery(None)
            self.collect_parked()
            retired = left + list(self._graph.values())
            self._graph.clear()
            self._entry.clear()
            self._selection.clear()
            self._implicit = False  # (the core's flag went with its discovery, above)
            self._unarmed.clear()
            self._shared.clear()
            self._users = None
            self._slots = [None] * FGRAPH_ARRAY_SIZE
            if self._for_exit:
                # Nothing new is pushed (an empty table); exits still pop what is open until
                # the sweep has delivered it, and the callbacks go below.
                self._publish({})
                self._sweep(retired, everything=True)
                self._left_set = (self.tool_id, [code for code, _ in self._events.values()])
                self._for_exit = False
            else:
                self._reconcile(retired, everything=True)
                if self._owns_hook():
                    for code, _ in self._events.values():
                        sys.monitoring.set_local_events(self.tool_id, code, 0)
            self._events.clear()
            self._publish({})
            self.core.set_overflow(None, PARKED_HIGH_WATER)
            replaced = self.core.uninstall()
            if replaced is not None:
                self.lost = f"{self.lost}; {replaced}" if self.lost else replaced
            for ts in self.core.thread_states():
                ts.stack.clear()
            self.core.parked().clear()
            if self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None
            toolid.release(self.tool_id)
            self.tool_id = None
            _active = None
        _core.report_deferred()

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- users ----------------------------------------------------------------------------
    @_untraced
    def register_ftrace_function(self, ops: FtraceOps) -> None:
        """Start calling ``ops.func`` on entry of every function its filter matches."""
        with self._lock:
            if ops in self._entry:
                raise EngineError(f"{ops!r} is already registered")
            self.start()
            self._entry[ops] = _core.EntryRegistration(ops)
            self._selection[ops] = self._select(ops)
            self._selected()
            ops.engine = self
            self._reconcile([])

    @_untraced
    def unregister_ftrace_function(self, ops: FtraceOps) -> None:
        with self._lock:
            ereg = self._entry.pop(ops, None)
            if ereg is None:
                raise EngineError(f"{ops!r} is not registered")
            self._selection.pop(ops, None)
            self._selected()
            ops.engine = None
            if not self._last_user_left([]):
                self._reconcile([], removing=True)
            ereg.func = _ignore
            self._maybe_stop()

    @_untraced
    def register_ftrace_graph(self, ops: FgraphOps) -> None:
        """Give ``ops`` a slot and hook every function its filter matches."""
        with self._lock:
            if ops in self._graph:
                raise EngineError(f"{ops!r} is already registered")
            try:
                index = self._slots.index(None)
            except ValueError:
                users = ", ".join(repr(r.ops) for r in self._slots if r is not None)
                raise EngineError(
                    f"all {FGRAPH_ARRAY_SIZE} fgraph slots are in use ({users}); "
                    f"unregister one before registering {ops!r}") from None
            self.start()
            reg = _core.Registration(ops, index)
            self._slots[index] = reg
            self._graph[ops] = reg
            self._selection[ops] = self._select(ops)
            self._selected()
            ops.engine = self
            self._reconcile([])

    @_untraced
    def unregister_ftrace_graph(self, ops: FgraphOps) -> None:
        """Stop hooking for ``ops``; its open calls get their return now, FLAG_UNFINISHED.

        When this returns, ``ops``' handlers are not running and will not be called again.
        """
        with self._lock:
            reg = self._graph.pop(ops, None)
            if reg is None:
                raise EngineError(f"{ops!r} is not registered")
            self._slots[reg.index] = None
            self._selection.pop(ops, None)
            self._selected()
            ops.engine = None
            if not self._last_user_left([reg]):  # (which collects the parked calls first)
                self.collect_parked()  # closed generators get FLAG_CLOSED, not FLAG_UNFINISHED
                self._reconcile([reg], removing=True)
            # An entry still in this user's handler (it unregistered itself) is discarded
            # like a declined one: nothing calls this registration again.
            reg.retfunc = reg.suspendfunc = reg.resumefunc = None
            reg.entryfunc = _decline
            self._maybe_stop()

    @_untraced
    def update(self, ops: _Ops) -> None:
        """Re-resolve ``ops``' filter after it changed and apply it to every thread."""
        with self._lock:
            if ops not in self._selection:
                return
            old = self._selection[ops]
            new = self._select(ops)
            self._selection[ops] = new
            self._selected()
            self._reconcile([], removing=bool(old.keys() - new.keys()))

    @_untraced
    def set_max_depth(self, depth: int | None) -> None:
        """Shadow-stack depth past which calls are counted as overruns (None: the default)."""
        self.max_depth = DEFAULT_MAX_DEPTH if depth is None else int(depth)
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be at least 1, got {depth!r}")
        self.core.set_max_depth(self.max_depth)

    def registration(self, ops: _Ops) -> Any:
        """The engine's record of a registered user (its counters: ``nmissed``, ``errors``)."""
        if isinstance(ops, FtraceOps):
            return self._entry.get(ops)
        return self._graph.get(ops)

    @property
    def users(self) -> list[_Ops]:
        return [*self._entry, *self._graph]

    def _maybe_stop(self) -> None:
        if not self._graph and not self._entry:
            self.stop()

    # --- resolution -----------------------------------------------------------------------
    def _select(self, ops: _Ops) -> Mapping[int, CodeType]:
        # Registered functions only: a module the registry's scan found and has not
        # registered yet is registered when one of its functions first runs (discovery) or a
        # listing needs it, and _on_new_functions hooks what matches then. Code that never
        # runs costs nothing (-l '*' over the modules loaded before the program).
        if ops.filter.takes_every:
            return _EveryRegistered(self.registry.known_ids())
        return {id(info.code): info.code for info in ops.filter.select_infos(complete=False)
                if not _own_code(info)}

    def _selected(self) -> None:
        """The users' selections changed: the cores hand every known function to _arm at its
        first call while one of them is implicit (_EveryRegistered)."""
        self._implicit = any(type(sel) is _EveryRegistered for sel in self._selection.values())
        if self.running:
            self._arm_in_core(False)  # (until the users are settled: _reconcile)
            self.core.set_arm_known(self._implicit)

    def _arm_in_core(self, on: bool = True) -> None:
        """While one set of users takes every known function (``-l '*'``), hand the C core
        what :meth:`_arm` would build for a first call (what those users share, from
        :meth:`_shared_dispatch`), and it arms such calls itself (_ccore.c, "A first call
        armed in C"); anything else, or ``on`` False, takes that back. Caller holds the
        lock."""
        set_fast_arm = getattr(self.core, "set_fast_arm", None)
        if set_fast_arm is None:
            return
        users = self._current_users() if on and self.running else []
        if len(users) != 1 or type(self._selection.get(users[0][0])) is not _EveryRegistered:
            set_fast_arm(None)
            return
        entry, graph, flags, mask, capsule = self._shared_parts((0,), users)
        set_fast_arm((self._events, entry, graph, flags, mask, capsule,
                      sys.monitoring.set_local_events, self.tool_id,
                      sys.monitoring.restart_events, self._hook_late, self))

    @_untraced
    def _on_new_functions(self, infos: list[FunctionInfo]) -> None:
        """Registry callback (imports, code seen for the first time): hook what existing
        filters now match. Costs in proportion to the new functions, not to the hooked ones.

        Code is often seen for the first time inside a callback (discovery), where this
        thread counts as inside the core: if another thread holds the engine's lock (a sweep
        may be waiting for this very thread to leave the core), waiting for it could wait
        forever. The functions then wait in ``_late`` for that thread, which hooks them once
        its own work is done (``_untraced``); a call of one of them missed meanwhile is
        re-armed when it is hooked (``_rearm``)."""
        with self._late_lock:
            self._late += infos  # (rethook's own are left out there, where a user looks)
        self._hook_late()

    def _hook_late(self) -> None:
        """Hook the functions waiting in ``_late``, if the engine's lock is free (or this
        thread's): see :meth:`_on_new_functions`."""
        while self._late and self._lock.acquire(blocking=False):
            try:
                with self._late_lock:
                    infos, self._late = self._late, []
                if not self.running:
                    continue
                added: dict[int, CodeType] = {}
                for ops, sel in self._selection.items():
                    if type(sel) is not _EveryRegistered:  # (selected by being registered)
                        codes_by_id([i for i in ops.filter.matching(infos) if not _own_code(i)],
                                    (sel, added))
                disabled = self.core.disabled() if self._implicit else None
                if disabled:  # (implicitly selected code whose first call is gone: _defer)
                    for info in infos:
                        key = id(info.code)
                        if key in disabled and _selectable(info):
                            added[key] = info.code
                if added:
                    self._defer(added)
            finally:
                self._lock.release()

    def _defer(self, codes: dict[int, CodeType]) -> None:
        """Hook new functions at their first call: a module's functions are registered as it
        loads (or at the first call of one of them), and most never run (sqlglot's rounds call
        ~1,100 of the ~5,500 its import registers), while hooking one costs as much as
        registering it. Discovery's global PY_START reaches each first call; the core hands
        the code to :meth:`_arm`. Code whose PY_START discovery disabled before is hooked
        now (its first call would not come back). Caller holds the lock."""
        disabled = self.core.disabled()
        # (new code has seldom run yet: the batch almost never meets the set, a test made in
        # C, and then waits whole, added in C too)
        if not disabled or disabled.isdisjoint(codes):
            self._unarmed.update(codes)
            return
        now = {k: c for k, c in codes.items() if k in disabled}
        self._unarmed.update((k, c) for k, c in codes.items() if k not in now)
        self._hook_new(now)

    def _arm(self, code: CodeType) -> bool:
        """The first call of a function :meth:`_defer` left, or of any function an implicit
        selection takes (the core's discovery, in that call's PY_START, the thread marked
        busy: no handler runs meanwhile, as under ``notrace``): hook it, if the engine's lock
        is free (another thread's sweep may wait for this very thread: then the next call
        asks again). False when no user selects it: the core disables it then. (Whether one
        does is found as its dispatch is built: each lookup of a first call's id misses the
        cache, ~0.5 us, and sqlglot makes ~1,400 first calls.)"""
        key = id(code)
        if not self._lock.acquire(blocking=False):
            return True
        try:
            if self._unarmed:
                self._unarmed.pop(key, None)
            hooked = key in self._table or not self.running or self._hook_one(key, code)
        finally:
            self._lock.release()
        if self._late:  # (as _untraced: what another thread found while this one held it)
            self._hook_late()
        return hooked

    def _waiting(self) -> list[int]:
        """Ids of the selected functions not hooked yet (hooked at their first call)."""
        keys = set(self._unarmed)
        for sel in self._selection.values():
            if type(sel) is _EveryRegistered:
                keys.update(k for k in sel if k not in self._events)
        return list(keys)

    # --- building and publishing ----------------------------------------------------------
    def _build(self, only: Iterable[int] | None = None) -> dict[int, tuple[CodeType, int, tuple]]:
        """``id(code) -> (code, local events, dispatch entry)`` for the current users: of every
        code object they select, or of the ids in ``only``.

        Codes selected by the same users share everything but their marker and direct entry
        (see :meth:`_shared_dispatch`): that is worked out once per set of users, so a
        module's worth of new functions costs a few tuples each."""
        users = self._current_users()
        keys = None if only is None else list(only)
        codes: dict[int, CodeType] = {}
        selected_by: dict[int, tuple[int, ...]] = {}  # code -> the indices of its users
        if len(users) == 1:  # (the common case: every code's users are that one)
            sel = self._selection[users[0][0]]
            codes = sel if keys is None else {k: sel[k] for k in keys if k in sel}
        else:
            for i, (ops, _, _) in enumerate(users):
                sel = self._selection[ops]
                for key, code in (sel.items() if keys is None
                                  else ((k, sel[k]) for k in keys if k in sel)):
                    codes[key] = code
                    selected_by[key] = selected_by.get(key, ()) + (i,)
        # (a partial build keeps what its users share until the users change: _reconcile)
        shared = self._shared if keys is not None else {}
        interned: dict[tuple, tuple] = {}
        out = {}
        for key, code in codes.items():
            who = selected_by.get(key, (0,))
            parts = self._shared_parts(who, users, shared)
            dispatch = _dispatch_of(code, parts)
            _, _, _, marker, direct = dispatch
            if marker is None and direct is None:  # nothing of its own: share one tuple
                dispatch = interned.setdefault(dispatch, dispatch)
            _, _, _, mask, _ = parts
            out[key] = (code, mask, dispatch)
        return out

    def _current_users(self) -> list[tuple[_Ops, Any, bool]]:
        """``(ops, registration, is_entry_user)`` of every user, entry users first, graph
        users in slot order (the entry order); kept until the users change (_reconcile)."""
        users = self._users
        if users is None:
            users = [(ops, ereg, True) for ops, ereg in self._entry.items()]
            users += [(reg.ops, reg, False) for reg in self._slots if reg is not None]
            self._users = users
        return users

    def _build_one(self, key: int, code: CodeType) -> tuple[int, tuple] | None:
        """``(local events, dispatch entry)`` of one function for the current users (what
        :meth:`_build` gives for it), None if none selects it: a function's first call
        (:meth:`_arm`), without a batch's dicts."""
        users = self._current_users()
        if len(users) == 1:
            who: tuple[int, ...] = (0,) if key in self._selection[users[0][0]] else ()
        else:
            who = tuple(i for i, (ops, _, _) in enumerate(users) if key in self._selection[ops])
        if not who:
            return None
        parts = self._shared_parts(who, users)
        _, _, _, mask, _ = parts
        return mask, _dispatch_of(code, parts)

    def _shared_parts(self, who: tuple[int, ...], users: list[tuple[_Ops, Any, bool]],
                      shared: dict[tuple[int, ...], tuple] | None = None) -> tuple:
        """What the users of indices ``who`` share, worked out once per set of users: kept in
        ``shared`` (default: until the users change, ``_shared``)."""
        shared = self._shared if shared is None else shared
        parts = shared.get(who)
        if parts is None:
            parts = shared[who] = self._shared_dispatch([users[i] for i in who])
        return parts

    def _shared_dispatch(self, users: list[tuple[_Ops, Any, bool]]) -> tuple:
        """What the dispatch of every code these users select shares: ``(entry users, graph
        users, flags, local events, direct capsule or None)``."""
        entry = tuple(reg for _, reg, is_entry in users if is_entry)
        graph = tuple(reg for _, reg, is_entry in users if not is_entry)
        wants_frame = any(ops.wants_frame for ops, _, _ in users)
        flags = (WANT_FRAME if wants_frame else 0) | \
            (WANT_TIME if any(r.ops.wants_time for r in graph) else 0)
        mask = self.core.LOCAL_CALL_EVENTS | (self.core.LOCAL_RETURN_EVENTS if graph else 0)
        # One graph user written in C, alone, wanting no frame: its direct hooks
        # (engine/fgraph_direct.h). A plain function's calls share the direct entry; a
        # generator's or coroutine's each get a direct record (the core keeps the frame
        # it parks them by: WANT_FRAME stays on), or ordinary records when the user's
        # capsule has no generator hooks (the C core decides that when it publishes).
        # One entry user written in C, alone, wanting no frame: its direct hook, called at
        # PY_START with no Python object made (the kernel's ftrace direct call).
        capsule = None
        if self.core.capabilities.direct_calls and not wants_frame:
            if not entry and len(graph) == 1 and graph[0].ops.direct is not None:
                capsule = graph[0].ops.direct
            elif not graph and len(entry) == 1 and entry[0].ops.direct is not None:
                capsule = entry[0].ops.direct
        return entry, graph, flags, mask, capsule

    def _draining(self, code: CodeType, dispatch: tuple | None) -> tuple:
        """Dispatch for a function whose return events are going away while calls of it may
        be open: it keeps its entry users, and its entries still push the marker so those
        calls' exits stay matched (core rule 2)."""
        entry = dispatch[0] if dispatch else ()
        if code.co_flags & SUSPENDING:
            return (entry, (), GENERATOR | WANT_FRAME, None, None)
        frame = WANT_FRAME if entry and any(e.ops.wants_frame for e in entry) else 0
        return (entry, (), frame, make_marker(code), None)

    def _publish(self, table: dict[int, tuple], added: dict[int, tuple] | None = None) -> None:
        self._table = table
        self.core.publish(table, added)

    def _rearm(self, keys: Iterable[int]) -> None:
        """After publishing: if discovery disabled PY_START of code just hooked, re-arm it
        (only ``restart_events()`` can; see core.py's Discovery). At most once per update."""
        disabled = self.core.disabled()
        if disabled and not disabled.isdisjoint(keys):
            disabled.clear()
            sys.monitoring.restart_events()

    def _hook_new(self, codes: dict[int, CodeType]) -> None:
        """Hook functions no user had selected before (new in the registry): only their
        dispatch is built, and the published table grows in place by their entries."""
        if not (self._table.keys().isdisjoint(codes) and self._events.keys().isdisjoint(codes)):
            self._reconcile([])  # reported twice, or still draining: the general path
            return
        built = self._build(codes)
        set_local = sys.monitoring.set_local_events
        # Events first, then the table (as in _reconcile).
        for key, (code, mask, _) in built.items():
            set_local(self.tool_id, code, mask)
            self._events[key] = (code, mask)
        added = {key: dispatch for key, (_, _, dispatch) in built.items()}
        self._table.update(added)
        self._publish(self._table, added)
        self._rearm(added)

    def _hook_one(self, key: int, code: CodeType) -> bool:
        """:meth:`_hook_new` for one function (its first call): the same steps. False when no
        user selects it."""
        if key in self._table or key in self._events:
            self._reconcile([])  # reported twice, or still draining: the general path
            return True
        built = self._build_one(key, code)
        if built is None:
            return False
        mask, dispatch = built
        sys.monitoring.set_local_events(self.tool_id, code, mask)  # events first, then the
        self._events[key] = (code, mask)  # table (as in _reconcile)
        self._table[key] = dispatch
        self._publish(self._table, {key: dispatch})
        self._rearm((key,))
        return True

    def _reconcile(self, retired: list[_core.Registration], removing: bool = False,
                   everything: bool = False) -> None:
        """Publish the dispatch for the current users; sweep what left (see module doc).
        The C core arms first calls itself again only once that is done (_arm_in_core)."""
        self._arm_in_core(False)
        try:
            self._reconcile_now(retired, removing, everything)
        finally:
            self._arm_in_core()

    def _reconcile_now(self, retired: list[_core.Registration], removing: bool,
                       everything: bool) -> None:
        core = self.core
        tool = self.tool_id
        returns = core.LOCAL_RETURN_EVENTS
        # on an id another tool took (or the program freed) the events are not rethook's
        set_local = sys.monitoring.set_local_events if self._owns_hook() else _leave_events
        self._shared.clear()  # (the users, or what they want, may have changed)
        self._users = None
        built = self._build()
        self._unarmed.clear()  # (built: every code selected, hooked below)
        table = {key: dispatch for key, (_, _, dispatch) in built.items()}
        # Functions losing their return events: drain them (see _draining) until no call of
        # them is open; functions with only entry users leave at once.
        draining: dict[int, tuple[CodeType, int]] = {}
        for key, (code, mask) in list(self._events.items()):
            want = built[key][1] if key in built else 0
            if mask & returns and not want & returns:
                draining[key] = (code, want)
                table[key] = self._draining(code, table.get(key))
            elif key not in built:
                set_local(tool, code, 0)
                del self._events[key]
        # Functions gaining events get them before the table that hooks them: a call entering
        # in between is not in the table, so nothing is pushed that no return event would pop
        # (discovery's global PY_START reaches code whose local events are not on yet).
        gained = []
        for key, (code, mask, _) in built.items():
            if key not in draining and self._events.get(key, (None, 0))[1] != mask:
                set_local(tool, code, mask)
                self._events[key] = (code, mask)
                gained.append(key)
        self._publish(table)
        self._rearm(gained)
        if not (retired or removing or draining or everything):
            return
        open_codes = self._sweep(retired, everything)
        done = {k: v for k, v in draining.items() if k not in open_codes}
        if not done:
            return
        # Two steps, so a marker pushed between the sweep and the switch-off cannot be
        # stranded: publish the final dispatch, wait for every thread, look again, then
        # turn the return events off.
        table = dict(table)
        for key in done:
            if key in built:
                table[key] = built[key][2]
            else:
                del table[key]
        self._publish(table)
        still_open = self._sweep([], False)
        table = dict(table)
        for key, (code, want) in done.items():
            if key in still_open:
                table[key] = self._draining(code, table.get(key))
            else:
                set_local(tool, code, want)
                if want:
                    self._events[key] = (code, want)
                else:
                    del self._events[key]
        self._publish(table)

    def _quiesce(self) -> None:
        """Wait until every other thread has been seen outside the core (or held by a sweep)."""
        me = self.core.current_thread_state()
        for ts in self.core.thread_states():
            if ts is me:
                continue
            t0 = time.monotonic()
            warned = False
            while ts.busy & 1 and not ts.waiting:  # NOTRACE alone: not in the core
                time.sleep(0.0002)
                if not warned and time.monotonic() - t0 > QUIESCE_WARN_SECONDS:
                    warned = True
                    import warnings  # (not at start-up: ~0.3 ms)

                    warnings.warn(f"rethook: waiting for thread {ts.tid} to leave a handler",
                                  RuntimeWarning, stacklevel=3)

    def _sweep(self, retired: list[_core.Registration], everything: bool) -> set[int]:
        """Take retired claims off every entry; return ids of codes with open entries."""
        core = self.core
        gone = set(map(id, retired))
        todo: list[tuple[Any, int, _core.Registration, Any]] = []
        open_codes: set[int] = set()
        me = core.current_thread_state()
        with core.sweep_lock():
            core.set_sweeping(True)
            try:
                self._quiesce()
                entries: list[tuple[Any, int, Any]] = []
                for ts in core.thread_states():
                    entries.extend((rec, d, ts) for d, rec in enumerate(list(ts.stack)))
                if me is not None:  # records this thread is delivering right now
                    entries.extend((rec, 0, me) for rec in me.inflight)
                entries.extend((rec, 0, None) for rec in list(core.parked().values()))
                for rec, depth, ts in entries:
                    code = entry_code(rec)
                    open_codes.add(id(code))
                    kind = entry_kind(rec)
                    if kind is EntryKind.MARKER:
                        continue
                    if kind is EntryKind.DIRECT:  # its entry data is the user's own
                        reg = direct_registration(rec)
                        if everything or id(reg) in gone:
                            todo.append((rec, depth, reg, ts))  # data: the call's thread
                            ts.stack[depth] = make_marker(code)  # the exit stays matched
                        continue
                    # a record with no claims: swept, or its entry handlers are running
                    if not (gone or everything) or len(rec) == REC_HEADER:
                        continue
                    kept = []
                    for reg, data in claims(rec):
                        if everything or id(reg) in gone:
                            todo.append((rec, depth, reg, data))
                        else:
                            kept += (reg, data)
                    rec[REC_HEADER:] = kept
            finally:
                core.set_sweeping(False)
        if todo:
            self._deliver_unfinished(todo)
            self._quiesce()  # deliveries other threads had already begun are over too
        return open_codes

    def _deliver_unfinished(self, todo: list[tuple[Any, int, _core.Registration, Any]]) -> None:
        me = self.core.current_thread_state()
        was_busy = me.busy if me is not None else False
        if me is not None:
            me.busy = True
        t = clock.now_ns()
        try:
            # Newest first, so each user sees its unfinished returns in reverse entry order.
            for rec, depth, reg, data in reversed(todo):
                fn = reg.retfunc
                if fn is None:  # no return handler, or an entry its user discarded
                    continue
                self._unfinished_deliveries += 1
                if entry_kind(rec) is EntryKind.DIRECT:  # its data is the call's thread
                    _core.deliver_direct(rec, depth, None, None, t, FLAG_UNFINISHED, data)
                    continue
                try:
                    fn(rec[REC_CODE], rec[REC_FRAME], depth, data, None, None, rec[REC_TIME],
                       t if rec[REC_TIME] else 0, rec[REC_SLEEP], FLAG_UNFINISHED)
                except Exception as e:
                    self.core.handler_failed(reg, e)
        finally:
            if me is not None:
                me.busy = was_busy

    # --- generators closed or collected while suspended ----------------------------------
    @_untraced
    def collect_parked(self) -> int:
        """Deliver the parked calls of generators that were closed or collected silently.

        CPython 3.13 fires no event when a suspended generator without a ``try`` around its
        ``yield`` is closed or collected (CPython issue 140373), so such calls would stay parked
        for ever. A parked frame nobody else references belongs to a collected generator; one
        referenced only by a finished generator belongs to a closed one. Each gets its return
        with ``FLAG_CLOSED`` and a ``GeneratorExit``, timed at its last suspension. Runs at
        stop, at unregister, and when the parked table passes a high-water mark.
        """
        dead = _dead_parked_frames(self.core.parked(), self.core.finished_frames)
        if not dead:
            return 0
        me = self.core.current_thread_state()
        was_busy = me.busy if me is not None else False
        if me is not None:
            me.busy = True
        # (counted: the returns really delivered, not claims of users that discarded their
        # entry, unregistered from inside it: their retfunc is gone)
        counts = [0, 0]
        try:
            self.core.close_parked(dead, counts)
        finally:
            self._closed_deliveries += counts[1]
            if me is not None:
                me.busy = was_busy
        return counts[0]

    def _parked_overflow(self) -> None:
        self.collect_parked()
        self._parked_limit = max(PARKED_HIGH_WATER, 2 * len(self.core.parked()))
        self.core.set_overflow(self._parked_overflow, self._parked_limit)

    # --- introspection --------------------------------------------------------------------
    def parent_data(self, ops: FgraphOps, depth: int = 1) -> Any:
        reg = self._graph.get(ops)
        ts = self.core.current_thread_state()
        if reg is None or ts is None:
            return None
        for rec in reversed(ts.stack):
            if entry_kind(rec) is not EntryKind.RECORD:
                continue
            for claimant, data in claims(rec):
                if claimant is reg:
                    depth -= 1
                    if depth <= 0:
                        return data
        return None

    @_untraced
    def enabled_functions(self) -> list[tuple[FunctionInfo, int, int]]:
        """Hooked code objects with their numbers of entry and graph users."""
        out = []
        for key, (code, _) in self._events.items():
            entry, graph = self._table.get(key, ((), ()))[:2]
            out.append((self.registry.info(code), len(entry), len(graph)))
        waiting = self._waiting()  # (hooked at their first call: their users are chosen)
        if waiting:
            for code, _, dispatch in self._build(waiting).values():
                out.append((self.registry.info(code), len(dispatch[0]), len(dispatch[1])))
        out.sort(key=lambda t: t[0].name)
        return out

    @_untraced
    def stats(self) -> dict[str, int]:
        """Counters: nothing is dropped without being counted here."""
        states = self.core.thread_states()
        return {
            "threads": len(states),
            "hooked_functions": len(self._events) + len(self._waiting()),
            "open_calls": sum(len(ts.stack) for ts in states),
            "parked_calls": len(self.core.parked()),
            "overrun": sum(ts.overrun for ts in states) + self.core.dead_counts()[1],
            "recursion": sum(ts.recursion for ts in states) + self.core.dead_counts()[0],
            "handler_errors": sum(r.errors for r in self._graph.values())
            + sum(r.errors for r in self._entry.values()),
            "internal_errors": self.core.internal_errors(),
            "unfinished_returns": self._unfinished_deliveries,
            "closed_returns": self._closed_deliveries,
        }


# --- helpers for collect_parked ----------------------------------------------------------
def _refcounts(parked: dict[FrameType, list]) -> list[tuple[FrameType, int]]:
    out = []
    for frame, rec in list(parked.items()):
        out.append((frame, sys.getrefcount(frame)))
        del rec
    return out


def _calibrate() -> int:
    """References a parked frame has when nothing but the parked table holds it."""

    def finished() -> FrameType:
        return sys._getframe()

    frame = finished()
    probe = {frame: [None, frame]}
    del frame
    ((_, count),) = _refcounts(probe)
    return count


_UNREFERENCED = _calibrate()


def _dead_parked_frames(parked: dict[FrameType, list],
                        finished: Callable[[list[FrameType]], list[FrameType] | None]
                        ) -> list[FrameType]:
    dead = []
    alive = []
    for frame, count in _refcounts(parked):
        (dead if count <= _UNREFERENCED + 1 else alive).append(frame)  # +1: the tuple we hold
    if alive and sys.version_info >= (3, 13):
        # A closed generator can still hold its frame on 3.13: the core reads the frames, or
        # (the pure core) the generators are asked, found among every object's referrers.
        done = finished(alive)
        if done is not None:
            return dead + done
        wanted = {id(f): f for f in alive}
        for obj in gc.get_referrers(*alive):
            if _finished_generator(obj):
                for ref in gc.get_referents(obj):
                    f = wanted.pop(id(ref), None)
                    if f is not None:
                        dead.append(f)
    return dead


def _finished_generator(obj: Any) -> bool:
    for attr in ("gi_frame", "cr_frame", "ag_frame"):
        if hasattr(obj, attr) and type(obj).__module__ == "builtins":
            return getattr(obj, attr) is None
    return False


_active: Engine | None = None
_default: Engine | None = None
_default_lock = threading.Lock()


def get_engine() -> Engine:
    """The process-wide engine (created on first use; started by the first registration)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Engine()
        return _default


def _after_fork_child() -> None:
    """The running engine's core keeps the forking thread's state only (the engine's lock is
    made anew by forklocks, whose hook runs first; so is the lock of its late functions, which
    another thread may have held)."""
    if _active is not None:
        _active._late_lock = threading.Lock()
        _active.core.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_child)

__all__ = [
    "Engine", "EngineError", "FgraphOps", "FtraceOps", "FLAG_CLOSED", "FLAG_UNFINISHED",
    "FGRAPH_ARRAY_SIZE", "get_engine",
]
