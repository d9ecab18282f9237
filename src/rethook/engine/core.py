"""The pure-Python hook core: the ``sys.monitoring`` callbacks and the per-thread shadow stacks.

This is rethook's hot path, the part that runs on every call of a hooked function. Everything
else (registration, filters, dispatch tables, teardown) is in :mod:`rethook.engine.engine`, which
drives this module through the small interface at the bottom (:class:`PyCore`). A C twin will
implement the same interface and the same contract.

The shadow stack
================

Each thread owns one shadow stack (``ThreadState.stack``), shared by every graph user. Every
call of a hooked function pushes one entry and its exit pops it::

    ThreadState.stack                      a record (a plain list)
    +-----------+                          +---------------------------------------------+
    | record    |  outermost hooked call   | [REC_KEY]       what the exit is matched by: |
    | marker    |  (declined: no claims)   |                 code (plain function) or     |
    |    ...    |                          |                 frame (generator/coroutine)  |
    | record    |  innermost = top         | [REC_CODE]      code object                  |
    +-----------+                          | [REC_FRAME]     frame, or None if not wanted |
                                           | [REC_TIME]      entry time ns, 0 if not wanted|
    a marker is the shared tuple (code,)   | [REC_SLEEP]     ns spent suspended so far    |
    of a plain function whose entry every  | [REC_PARKED_AT] ns when last suspended       |
    user declined (or that overran): it    | reg, data       claim 0, in entry order      |
    keeps exits matched by code exact.     | reg, data       claim 1 ...                  |
                                           +---------------------------------------------+
    a direct entry is the shared tuple (code, reg, capsule): one claim of a user written
    in C that keeps the call's entry data itself (engine/fgraph_direct.h; C core only).

A *claim* (a registration and its entry data) is the kernel's bit in the frame's bitmap plus its
reserved data: "call this registration's return handler for this call, with this data". Claims
hold the registration object itself, never a slot number, so a return pushed under one
registration can never call a user registered later in the same slot.

Rules
-----
1. Entry: entry users (ftrace_ops) run first. Then the record is pushed and each graph
   registration of the code's dispatch entry, in slot order, runs its entry handler; an
   answer other than ``None``/``False`` is the entry data and appends a claim. No claim: the
   record is replaced by the function's marker (a generator's is just popped). Pushing first
   lets a handler that unregisters a user or changes a filter find this very call.
2. Exit (PY_RETURN, PY_UNWIND) of a plain function pops the top entry when its key is the
   code. That is exact because every entry of a hooked plain function pushes, and the engine
   keeps a function's events on while any entry of it is open ("draining"), so an exit is never
   matched with an outer call of the same function. A generator's entry is matched by frame.
   Anything else (a frame entered before its events were turned on) is looked up by frame in
   the slow path and otherwise ignored; entries found above it left unseen and are delivered
   with FLAG_UNFINISHED. Claims are popped from the end: return handlers run in reverse entry
   order, each exactly once.
3. Suspension (PY_YIELD): the generator/coroutine's record moves to the global ``_parked``
   table, keyed by frame; PY_RESUME or PY_THROW (possibly in another thread) moves it back
   onto the resuming thread's stack and adds the suspended time to REC_SLEEP.
4. Recursion: while a thread runs a handler (``ThreadState.busy``), events on that thread are
   ignored; entries so skipped are counted in ``recursion`` and in each wanting user's
   ``nmissed``. A handler may call hooked code.
5. Depth: past ``max_depth`` no record is pushed (only the marker); counted in ``overrun``.
6. Handler errors never reach the traced program: each is counted and reported once per
   registration; the other users still run.
7. Only the owning thread pops entries and claims. The engine's sweep removes claims only
   while every other thread is outside the core or held at a transition's start
   (``_sweeping`` makes them wait on ``sweep_lock``), so no claim is delivered twice.

Discovery
---------
Code made at run time (``exec``, ``eval``, dataclasses, namedtuple, template engines) and
modules loaded past the registry's import hook (another meta-path hook ahead of it, such as
pytest's assertion rewriting; ``spec_from_file_location(...).loader.exec_module``) are found
the way coverage.py's ``sys.monitoring`` core finds code: on their first execution. While the
engine has users, PY_START is also a *global* event of rethook's tool id, so the first call of
every code object reaches :func:`_on_start`; one that is not in ``_table`` goes to
:func:`_sight`:

* code the registry does not know (a module or class body it walked counts as known: its
  nested code is registered; sqlglot runs ~1,200 class bodies as it is imported) is handed
  to the discovery hook (the registry names and
  registers it, its subscribers hook it if a filter matches); if it is now in ``_table`` this
  very call is dispatched as a hooked one;
* code the engine's users selected but left to hook at its first call (``_unarmed``: the
  functions of a module as it is registered; most never run) is hooked by the engine's arm
  hook now, and this very call is dispatched as a hooked one (while the thread is busy it is
  let through: hooked when the program calls it);
* otherwise (known, or just registered and nobody wants it) the core returns
  ``sys.monitoring.DISABLE``: that code's PY_START location costs nothing from then on. Its id
  goes into ``_disabled``.

A location DISABLEd for PY_START stays disabled even when local events are set on it later and
when the global event is turned off and on; only ``sys.monitoring.restart_events()`` re-arms
it. So the engine, after publishing a table that hooks code found in ``_disabled``, calls
``restart_events()`` (once per update) and empties ``_disabled``; and when another tool calls
``restart_events()``, code nobody hooks is seen once more and disabled again. While a thread is
busy (rethook's own work in a ``notrace`` section; code a handler runs makes no events) unknown
code is not discovered (the hook takes locks): its call is let through and it is discovered
when the program runs it, except rethook's own code (``is_own_module`` of its globals'
``__name__``), which is never hooked and is disabled at once.

Contract of the hot path (what the C twin must match)
-----------------------------------------------------
Reads: ``_table`` (``id(code) -> (entry_regs, graph_regs, flags, marker, direct)``; a published
table is never changed except by adding entries for code it did not hold; ``direct`` is a
direct entry or None, and this core ignores it), ``_max_depth``, ``_sweeping``, and for
discovery ``_discover``, ``_known``, ``_bodies`` and ``_unarmed``. Writes: the current thread's
``ThreadState``, ``_parked`` and ``_disabled``. Calls: handlers of the registrations it finds,
``clock.now_ns`` (only when ``flags & WANT_TIME``), ``sys._getframe`` (only when ``flags &
WANT_FRAME``, or to discover code), the discovery hook and the arm hook. Returns
``sys.monitoring.DISABLE`` only from PY_START of code that is not in ``_table`` (never for a
hooked function, never for any other event), never raises into the program except a
``KeyboardInterrupt``/``SystemExit`` from a handler, re-raised after the call's bookkeeping
is done.
"""

from __future__ import annotations

import sys
import threading
import time
from types import CodeType, FrameType

from rethook.engine import clock
from rethook.engine.capabilities import Capabilities
from rethook.engine.toolid import TOOL_NAME

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# Record layout (see the module docstring).
REC_KEY = 0
REC_CODE = 1
REC_FRAME = 2
REC_TIME = 3
REC_SLEEP = 4
REC_PARKED_AT = 5
REC_HEADER = 6
#: Items of a marker (code,) and of a direct entry (code, reg, capsule): the shapes
#: :func:`entry_kind` tells apart (the C core checks these numbers at import).
MARKER_ITEMS = 1
DIRECT_ITEMS = 3

#: Dispatch-entry flags, computed per code object when the table is built.
WANT_FRAME = 1  # some user of this code needs the frame (always for generators)
WANT_TIME = 2  # some user of this code needs timestamps
GENERATOR = 4  # generator, coroutine or async generator: entries matched by frame

#: Return-handler flags.
FLAG_UNFINISHED = 1  # the call was still open at teardown (unregister, stop, thread end)
FLAG_CLOSED = 2  # a suspended generator/coroutine was closed or collected without an event

DEFAULT_MAX_DEPTH = 65536

#: How long this core's drain_wait sleeps at most: no native ring can wake it (the C core's
#: wake-ups), so the recorder's drain polls native rings this often here.
DRAIN_POLL_SECONDS = 0.001


# --- shadow-stack entries: the three kinds, told apart here only ------------------------------
class EntryKind:
    """What a shadow-stack entry is (see the drawing in the module docstring): constants
    compared with ``is`` (an ``enum.Enum`` would cost ~2 ms of every start-up)."""

    MARKER = "marker"  # (code,): a plain function's call no user claimed, or overran
    DIRECT = "direct"  # (code, reg, capsule): one claim of a C user (fgraph_direct.h)
    RECORD = "record"  # a list: header (REC_*) then (reg, data) claims


def entry_kind(entry: list | tuple) -> EntryKind:
    """The kind of a shadow-stack (or parked, or in-flight) entry."""
    if isinstance(entry, list):
        return EntryKind.RECORD
    return EntryKind.DIRECT if len(entry) == DIRECT_ITEMS else EntryKind.MARKER


def make_marker(code: CodeType) -> tuple:
    """The marker of a plain function: shared by all its calls (built once per dispatch)."""
    return (code,)


def make_direct(code: CodeType, reg: Any, capsule: Any) -> tuple:
    """A direct entry: shared by all calls of ``code`` that ``reg``'s C hooks claim."""
    return (code, reg, capsule)


def entry_code(entry: list | tuple) -> CodeType:
    """The function of any entry (a record's key is its frame for generators)."""
    return entry[REC_CODE] if isinstance(entry, list) else entry[0]


def direct_registration(entry: tuple) -> Any:
    """The registration a direct entry's one claim belongs to."""
    return entry[1]


def claims(rec: list) -> list[tuple[Any, Any]]:
    """A record's claims, oldest first: (registration, entry data) pairs."""
    return [(rec[i], rec[i + 1]) for i in range(REC_HEADER, len(rec), 2)]

_getframe = sys._getframe
_now = clock.now_ns


#: ``ThreadState.busy`` is false, True (1: in the core or a handler: sweeps wait for it to
#: clear) or has NOTRACE set (rethook's own work: events are ignored, sweeps need not wait).
NOTRACE = 2


class ThreadState:
    """One thread's shadow stack and counters (the kernel's ``current->ret_stack``)."""

    __slots__ = ("stack", "busy", "waiting", "tid", "recursion", "overrun", "inflight",
                 "__weakref__")

    def __init__(self, tid: int) -> None:
        self.stack: list = []
        self.busy: bool | int = False  # a handler or the core runs here (or NOTRACE: below)
        self.waiting = False  # held at the start of a transition by an engine sweep
        self.tid = tid
        self.recursion = 0  # events skipped because a handler was running
        self.overrun = 0  # calls not recorded because the shadow stack was full
        self.inflight: list[list] = []  # records whose claims deliver() is calling now


class Registration:
    """One registered graph user in one slot. Claims point here, never at the slot number."""

    __slots__ = (
        "ops", "index", "entryfunc", "retfunc", "suspendfunc", "resumefunc",
        "errors", "reported", "nmissed", "__weakref__",
    )

    def __init__(self, ops: Any, index: int) -> None:
        self.ops = ops
        self.index = index
        self.entryfunc: Callable[..., Any] = getattr(ops, "entryfunc", None) or _accept_all
        self.retfunc: Callable[..., Any] | None = getattr(ops, "retfunc", None)
        self.suspendfunc: Callable[..., Any] | None = getattr(ops, "suspendfunc", None)
        self.resumefunc: Callable[..., Any] | None = getattr(ops, "resumefunc", None)
        self.errors = 0  # exceptions raised by this user's handlers
        self.reported = False
        self.nmissed = 0  # calls this user could not see: recursion or a full shadow stack

    def __repr__(self) -> str:
        return f"<Registration slot={self.index} ops={self.ops!r}>"


class EntryRegistration:
    """One registered entry user (ftrace_ops), with the same error bookkeeping."""

    __slots__ = ("ops", "func", "errors", "reported", "nmissed")

    def __init__(self, ops: Any) -> None:
        self.ops = ops
        self.func: Callable[[CodeType, FrameType], Any] = ops.func
        self.errors = 0
        self.reported = False
        self.nmissed = 0

    def __repr__(self) -> str:
        return f"<EntryRegistration ops={self.ops!r}>"


def _accept_all(code: CodeType, frame: FrameType | None, depth: int, t: int) -> bool:
    return True


# --- state read by the hot path -------------------------------------------------------------
_table: dict[int, tuple] = {}
_parked: dict[FrameType, list] = {}
_max_depth = DEFAULT_MAX_DEPTH
_sweeping = False
sweep_lock = threading.RLock()
_local = threading.local()
_threads: dict[int, ThreadState] = {}
_threads_lock = threading.Lock()
_park_limit = 1024  # parked records past which _overflow runs (the engine raises it as needed)
_overflow: Callable[[], None] | None = None  # looks for closed/collected generators
_dead_counts = [0, 0]  # recursion, overrun counters of threads that have ended
# Discovery (see the module docstring): the registry's hook, None while discovery is off.
_discover: Callable[[CodeType, FrameType | None], bool] | None = None
_known: Any = {}  # id(code) -> anything, for every code object the registry knows
_bodies: Any = {}  # id(code) -> anything, for module and class bodies it walked (no function)
_unarmed: Any = {}  # id(code) -> code: selected by the engine's users, hooked at first call
_arm: Callable[[CodeType], bool] | None = None  # the engine's: hooks one of _unarmed
_arm_known = False  # set_arm_known: every known function goes to _arm at its first call too
_DECLINED = object()  # (_arm_and_start: the engine's users select no such function)
_disabled: set[int] = set()  # ids of code answered DISABLE since the last restart_events()
_DISABLE = sys.monitoring.DISABLE
_CO_NEWLOCALS = 0x0002  # co_flags of a function's code (not a module or class body)
#: rethook's own package: its modules' code is never hooked (the kernel's notrace on the
#: tracing code), so when rethook's own work meets it (the thread busy) it gets DISABLE at
#: once, as code nobody wants, rather than a callback at every call (sqlglot: ~76 k of them,
#: the registry's and the drain's Python). The C core reads it at import.
OWN_PACKAGE = "rethook"
_OWN_DOT = OWN_PACKAGE + "."


def is_own_module(name: str) -> bool:
    """Whether a module is rethook's own: never hooked, never listed, and not registered by
    the registry's scans (it is a fifth of what a start-up scan meets)."""
    return name == OWN_PACKAGE or name.startswith(_OWN_DOT)


class _ThreadEndGuard:
    """Lives in the thread-local; its finaliser flushes the thread's open calls at thread end."""

    __slots__ = ("ts",)

    def __init__(self, ts: ThreadState) -> None:
        self.ts = ts

    def __del__(self) -> None:
        try:
            flush_thread(self.ts)
        except Exception:  # interpreter shutdown: nothing left to tell
            pass


#: Threads whose name starts with this are rethook's own (a recorder's drain thread...): the
#: stdlib code they run is rethook's work, never the program's, so they are never traced.
OWN_THREAD_PREFIX = "rethook-"


def _new_thread_state() -> ThreadState:
    tid = threading.get_ident()
    ts = ThreadState(tid)
    # threading._active, not current_thread(): that would make a dummy Thread object for a
    # thread threading does not know (one running a finaliser at shutdown, say).
    thread = threading._active.get(tid)  # type: ignore[attr-defined]
    if thread is not None and thread.name.startswith(OWN_THREAD_PREFIX):
        ts.busy = NOTRACE  # for good: see OWN_THREAD_PREFIX
    _local.ts = ts
    _local.guard = _ThreadEndGuard(ts)
    with _threads_lock:
        _threads[tid] = ts
    return ts


_internal_errors = [0]


#: Failures whose report could not be printed when they happened: (registration or None
#: for the core's own, exception). report_deferred prints them.
_deferred: list[tuple[Any, BaseException]] = []


def _head(reg: Any) -> str:
    if reg is None:
        return "rethook: internal error in the hook core (reported once, counted after)"
    return f"rethook: a handler of {reg.ops!r} raised (reported once, counted after)"


# The two below report inside their own ``try``: at the program's recursion limit any call
# may fail, the report's too, and then it is kept for later rather than lost.
def internal_error(exc: BaseException) -> None:
    """An exception in the core itself: counted, reported once, never raised into the program."""
    _internal_errors[0] += 1
    if _internal_errors[0] == 1:
        try:
            report_failure(_head(None), exc)
        except BaseException:
            _deferred.append((None, exc))


def handler_failed(reg: Any, exc: BaseException) -> None:
    """Count a handler's exception and report it once per registration, with its traceback."""
    reg.errors += 1
    if not reg.reported:
        reg.reported = True
        try:
            report_failure(_head(reg), exc)
        except BaseException:
            _deferred.append((reg, exc))


def report_deferred() -> None:
    """Print the failure reports that could not be printed when they happened (the engine
    does when it stops)."""
    while _deferred:
        reg, exc = _deferred.pop(0)
        report_failure(_head(reg), exc)


def report_failure(head: str, exc: BaseException) -> None:
    """``HEAD:`` and the traceback on stderr. Written for the worst case: at the program's
    recursion limit (where handlers fail with RecursionError) formatting a traceback fails
    too, and then ``HEAD: Type: message`` still says what happened."""
    try:
        import traceback  # here, not at start-up (~2 ms with textwrap); failing, as below

        text = f"{head}:\n" + "".join(traceback.format_exception(exc))
    except Exception:  # noqa: BLE001 - e.g. RecursionError again: one line, then
        try:
            what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except Exception:  # noqa: BLE001 - an exception whose __str__ fails has a type
            what = type(exc).__name__
        text = f"{head}: {what}\n"
    if isinstance(exc, RecursionError):
        text += (f"rethook: the program was at Python's recursion limit "
                 f"({sys.getrecursionlimit()}): calls made there may be missing from the trace\n")
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - no stderr left to tell
        pass


class notrace:
    """``with notrace():`` -- what the calling thread runs inside is not traced.

    For rethook's own work outside the callbacks (registering users, reading or writing the
    trace buffer, the control surface): the stdlib functions it calls may be hooked (``-l *``),
    and a handler running inside rethook's own critical sections would re-enter them (the
    kernel marks its tracing code ``notrace`` for the same reason). Calls skipped this way are
    counted in ``recursion``. Nests; costs two attribute writes.
    """

    __slots__ = ("ts", "prev")

    def __enter__(self) -> None:
        try:
            ts = _local.ts
        except AttributeError:
            ts = _new_thread_state()
        self.ts = ts
        self.prev = ts.busy
        ts.busy = ts.busy | NOTRACE

    def __exit__(self, *exc: object) -> None:
        self.ts.busy = self.prev


def in_own_work() -> bool:
    """Whether the calling thread is inside rethook's own work (a handler, discovery, a
    ``notrace`` section): what would take rethook's locks again must not run now."""
    ts = getattr(_local, "ts", None)
    return ts is not None and bool(ts.busy)


# --- delivery (shared by the exits and by the engine's teardown) ------------------------------
def deliver(rec: list | tuple, depth: int, retval: Any, exc: BaseException | None, t: int,
            flags: int, ts: ThreadState | None = None) -> None:
    """Pop every claim off a record (newest first) and call each return handler once.

    ``ts`` is the thread the call ran in (default: the calling thread's), for direct entries.
    """
    kind = entry_kind(rec)
    if kind is EntryKind.DIRECT:
        deliver_direct(rec, depth, retval, exc, t, flags, ts or _local.ts)
        return
    if kind is EntryKind.MARKER or len(rec) <= REC_HEADER:
        return  # a marker, or a record whose claims were all swept
    code = rec[REC_CODE]
    frame = rec[REC_FRAME]
    t0 = rec[REC_TIME]
    sleep = rec[REC_SLEEP]
    pending: BaseException | None = None
    # A handler may unregister another user of this very call: the engine's sweep then finds
    # the record here and takes that user's claim (its return becomes FLAG_UNFINISHED).
    inflight = _inflight()
    inflight.append(rec)
    try:
        while len(rec) > REC_HEADER:
            data = rec.pop()
            reg = rec.pop()
            fn = reg.retfunc
            if fn is None:
                continue
            try:
                fn(code, frame, depth, data, retval, exc, t0, t, sleep, flags)
            except Exception as e:
                handler_failed(reg, e)
            except BaseException as e:  # KeyboardInterrupt/SystemExit: finish the others
                pending = e
    finally:
        inflight.pop()
    if pending is not None:
        raise pending


def deliver_direct(entry: tuple, depth: int, retval: Any, exc: BaseException | None, t: int,
                    flags: int, ts: ThreadState) -> None:
    """A direct entry's return, delivered from Python: its user's retfunc with the call's
    ThreadState as entry data (engine/fgraph_direct.h)."""
    code, reg = entry_code(entry), direct_registration(entry)
    fn = reg.retfunc
    if fn is None:
        return
    try:
        fn(code, None, depth, ts, retval, exc, 0, t, 0, flags)
    except Exception as e:
        handler_failed(reg, e)


def _inflight() -> list:
    try:
        return _local.ts.inflight
    except AttributeError:
        return []


def _notify(rec: list, depth: int, t: int, resume: bool) -> BaseException | None:
    """Tell a record's users that its generator/coroutine was suspended or resumed.

    Returns a KeyboardInterrupt/SystemExit a handler raised, for the caller to re-raise once
    its own bookkeeping (parking or pushing the record) is done."""
    code = rec[REC_CODE]
    frame = rec[REC_FRAME]
    pending = None
    for i in range(REC_HEADER, len(rec), 2):
        reg = rec[i]
        fn = reg.resumefunc if resume else reg.suspendfunc
        if fn is None:
            continue
        try:
            fn(code, frame, depth, rec[i + 1], t)
        except Exception as e:
            handler_failed(reg, e)
        except BaseException as e:
            pending = e
    return pending


def _find_exit(ts: ThreadState, frame: FrameType) -> list | tuple | None:
    """Slow exit path: pop ``frame``'s entry; flush the ones above it, which left unseen."""
    stack = ts.stack
    for i in range(len(stack) - 1, -1, -1):
        rec = stack[i]
        if entry_kind(rec) is EntryKind.RECORD and rec[REC_FRAME] is frame:
            break
    else:
        return None  # entered before its events were on: nothing to do
    t = _now()
    while len(stack) > i + 1:
        stale = stack.pop()
        deliver(stale, len(stack), None, None, t, FLAG_UNFINISHED)
    return stack.pop()


def _wait_sweep(ts: ThreadState) -> None:
    """Hold this thread at the start of a transition while the engine sweeps (rule 7)."""
    ts.waiting = True
    try:
        with sweep_lock:
            pass
    finally:
        ts.waiting = False


# --- the sys.monitoring callbacks ------------------------------------------------------------
# Each callback sets ``busy`` before it reads the dispatch table or changes the stack, so once
# the engine has published a new table and seen every other thread not busy (or waiting), no
# thread can still act on the old one.

def _missed(code: CodeType, graph_only: bool) -> None:
    """Charge a call nobody could see to each user that wanted it (their ``nmissed``)."""
    dispatch = _table.get(id(code))
    if dispatch is None:
        return
    for reg in dispatch[1] if graph_only else dispatch[0] + dispatch[1]:
        reg.nmissed += 1


def _on_start(code: CodeType, offset: int, up: int = 1) -> Any:
    # ``up``: how far the program's frame is from here (more when _sight dispatches a call)
    try:
        ts = _local.ts
    except AttributeError:
        ts = _new_thread_state()
    if ts.busy:
        if id(code) not in _table:  # discovery's global PY_START: not a missed call
            return _sight(code, offset, up, True)
        ts.recursion += 1
        _missed(code, False)
        return
    ts.busy = True
    try:
        if _sweeping:
            _wait_sweep(ts)
        try:
            entry_regs, graph, flags, marker, _direct = _table[id(code)]
        except KeyError:  # not hooked: seen for the first time (discovery), or no longer hooked
            ts.busy = False
            return _sight(code, offset, up, False)
        frame = _getframe(up) if flags & WANT_FRAME else None
        pending = _call_entry_users(entry_regs, code, frame) if entry_regs else None
        if not graph or pending is not None:
            # draining (no graph users), or Ctrl-C from an entry user, which goes through at
            # once: the call's graph users never see it; its exit stays matched by the marker
            if marker is not None:
                ts.stack.append(marker)
            if pending is not None:
                raise pending
            return
        stack = ts.stack
        depth = len(stack)
        if depth >= _max_depth:
            _overran(ts, code, marker)
            if pending is not None:
                raise pending
            return
        t = _now() if flags & WANT_TIME else 0
        # Push first, then ask the users (the kernel's order): while entry handlers run, the
        # call is on the stack, so a sweep they cause (unregister, set_filter) sees it.
        rec = [frame if flags & GENERATOR else code, code, frame, t, 0, 0]
        stack.append(rec)
        if len(graph) == 1:  # one user: no loop
            reg = graph[0]
            try:
                data = reg.entryfunc(code, frame, depth, t)
            except Exception as exc:
                handler_failed(reg, exc)
                data = None
            if data is not None and data is not False:
                rec += (reg, data)
        else:
            for reg in graph:
                try:
                    data = reg.entryfunc(code, frame, depth, t)
                except Exception as exc:
                    handler_failed(reg, exc)
                    continue
                if data is not None and data is not False:
                    rec += (reg, data)
        if len(rec) == REC_HEADER and stack and stack[-1] is rec:  # nobody wants the return
            if marker is None:
                stack.pop()
            else:
                stack[-1] = marker
    except Exception as e:  # a bug of rethook's: never the program's problem
        internal_error(e)
    finally:
        ts.busy = False


def _sight(code: CodeType, offset: int, up: int, busy: bool) -> Any:
    """PY_START of code that is not in ``_table`` (see Discovery in the module docstring).

    ``up`` is the program's frame's distance from the caller (``_on_start``).
    """
    discover = _discover
    if discover is None:
        return None  # discovery is off: only hooked code has PY_START
    key = id(code)
    known = key in _known or (not code.co_flags & _CO_NEWLOCALS and key in _bodies)
    own = False
    if not known:  # (rethook's own code, as is_own_module, inline: no call at the limit)
        module = _getframe(up + 1).f_globals.get("__name__")
        own = type(module) is str and (module == OWN_PACKAGE or module.startswith(_OWN_DOT))
    if known and (key in _unarmed or (_arm_known and code.co_flags & _CO_NEWLOCALS)):
        # hooked at its first call: now, or the program's next one; or, declined, disabled
        if busy:
            return None
        started = _arm_and_start(code, offset, up)
        if started is not _DECLINED:
            return started
    elif own:
        pass  # rethook's own code, never hooked: disabled below without the registry's work
    elif not known and busy:
        return None  # a handler or rethook's own work: discovered when the program runs it
    elif not known:
        try:  # (one call more: at the program's recursion limit it fails here)
            done, seen = _rethooks_work(discover, code, _getframe(up + 1))
        except RecursionError:
            return None
        if not done:
            return None
        if key in _table:  # a filter wants it: this very call is a hooked one
            return _on_start(code, offset, up + 2)
        if key in _unarmed or (_arm_known and code.co_flags & _CO_NEWLOCALS and key in _known):
            # registered just now, to be hooked at its first call: this one
            started = _arm_and_start(code, offset, up)
            if started is not _DECLINED:
                return started
        elif not seen or _discover is None:
            return None  # not registered now (look again next time), or the engine stopped
    if code.co_flags & _CO_NEWLOCALS:  # (a module or class body is never hooked: not noted)
        _disabled.add(key)
    # From here to the return nothing may let another thread run (no call): the engine looks
    # at _disabled right after publishing a table, to decide on restart_events().
    if key in _table:
        return None
    return _DISABLE


def _arm_and_start(code: CodeType, offset: int, up: int) -> Any:
    """PY_START of code in ``_unarmed`` (or of any known function, with ``_arm_known``): the
    engine's arm hook hooks it, then the call is dispatched as a hooked one; not hooked (the
    engine busy in another thread, or stopped): nothing now, the next call asks again;
    ``_DECLINED`` when the arm hook answers that no user selects it (disabled then)."""
    arm = _arm
    try:  # (one call more: at the program's recursion limit it fails here)
        if arm is None:
            return None
        done, armed = _rethooks_work(arm, code)
        if not done:
            return None
        if armed is False:
            return _DECLINED
    except RecursionError:
        return None
    if id(code) in _table:
        return _on_start(code, offset, up + 3)
    return None


def _rethooks_work(fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """``fn(*args)`` (the registry's or the engine's hook) as rethook's own work: the thread
    marked busy (what it runs is not the program's, see the C core's sight()). ``(True,
    result)``, or ``(False, None)`` when it failed: at the program's recursion limit (ask
    again next time), or a bug of rethook's (reported; never the program's problem)."""
    ts = _local.ts  # (made by _on_start)
    ts.busy = True
    try:
        return True, fn(*args)
    except RecursionError:
        return False, None
    except Exception as e:
        internal_error(e)
        return False, None
    finally:
        ts.busy = False


def _call_entry_users(entry_regs: tuple, code: CodeType, frame: FrameType
                      ) -> BaseException | None:
    """Run the entry users; return a KeyboardInterrupt/SystemExit one raised, at once (the
    caller re-raises it after pushing the call's marker, so its exit stays matched)."""
    for e in entry_regs:
        try:
            e.func(code, frame)
        except Exception as exc:
            handler_failed(e, exc)
        except BaseException as exc:
            return exc
    return None


def _overran(ts: ThreadState, code: CodeType, marker: tuple | None) -> None:
    """The shadow stack is full: count the call, keep its exit matched, hook nothing."""
    ts.overrun += 1
    _missed(code, True)
    if marker is not None:
        ts.stack.append(marker)


def _on_return(code: CodeType, offset: int, retval: Any) -> None:
    try:
        ts = _local.ts
    except AttributeError:
        return  # this thread never pushed anything
    stack = ts.stack
    if not stack:
        return
    if ts.busy:
        return
    ts.busy = True
    try:
        if _sweeping:
            _wait_sweep(ts)
        rec = stack[-1]
        if rec[REC_KEY] is code:
            stack.pop()
        else:
            rec = _exit_by_frame(ts, _getframe(1))
            if rec is None:
                return
        if len(rec) == REC_HEADER + 2:  # the common case: one claim, delivered in place
            reg = rec[REC_HEADER]
            fn = reg.retfunc
            if fn is not None:
                t0 = rec[REC_TIME]
                try:
                    fn(code, rec[REC_FRAME], len(stack), rec[REC_HEADER + 1], retval, None, t0,
                       _now() if t0 else 0, rec[REC_SLEEP], 0)
                except Exception as exc:
                    handler_failed(reg, exc)
        elif len(rec) > REC_HEADER:  # several claims: newest first, each exactly once
            t0 = rec[REC_TIME]
            t = _now() if t0 else 0
            frame = rec[REC_FRAME]
            depth = len(stack)
            sleep = rec[REC_SLEEP]
            inflight = ts.inflight  # lets a handler's unregister() find the other claims
            inflight.append(rec)
            try:
                while len(rec) > REC_HEADER:
                    data = rec.pop()
                    reg = rec.pop()
                    fn = reg.retfunc
                    if fn is not None:
                        try:
                            fn(code, frame, depth, data, retval, None, t0, t, sleep, 0)
                        except Exception as exc:
                            handler_failed(reg, exc)
            except BaseException:  # KeyboardInterrupt/SystemExit: deliver the rest first
                deliver(rec, depth, retval, None, t, 0)
                raise
            finally:
                inflight.pop()
    except Exception as e:  # a bug of rethook's: never the program's problem
        internal_error(e)
    finally:
        ts.busy = False


def _exit_by_frame(ts: ThreadState, frame: FrameType) -> list | tuple | None:
    """An exit whose code is not the top entry's key: a generator's, or an unmatched one."""
    stack = ts.stack
    if stack[-1][REC_KEY] is frame:
        return stack.pop()
    return _find_exit(ts, frame)


def _on_unwind(code: CodeType, offset: int, exc: BaseException) -> None:
    # Global event: fires for every frame an exception leaves, hooked or not.
    try:
        ts = _local.ts
    except AttributeError:
        return
    stack = ts.stack
    if not stack or ts.busy:
        return  # (unwinds inside handlers belong to calls the handler made: not misses)
    if stack[-1][REC_KEY] is not code and id(code) not in _table:
        return  # not hooked (draining code stays in the table)
    ts.busy = True
    try:
        if _sweeping:
            _wait_sweep(ts)
        if stack[-1][REC_KEY] is code:
            rec = stack.pop()
        else:
            rec = _exit_by_frame(ts, _getframe(1))
            if rec is None:
                return
        if len(rec) > REC_HEADER:  # not a marker
            deliver(rec, len(stack), None, exc, _now() if rec[REC_TIME] else 0, 0)
    except Exception as e:
        internal_error(e)
    finally:
        ts.busy = False


def _on_yield(code: CodeType, offset: int, value: Any) -> None:
    try:
        ts = _local.ts
    except AttributeError:
        return
    stack = ts.stack
    if not stack:
        return
    if ts.busy:
        return
    ts.busy = True
    try:
        if _sweeping:
            _wait_sweep(ts)
        frame = _getframe(1)
        rec = _exit_by_frame(ts, frame)
        if rec is None:
            return
        t = _now()
        rec[REC_PARKED_AT] = t
        _parked[frame] = rec
        pending = _notify(rec, len(stack), t, False)
        if len(_parked) > _park_limit and _overflow is not None:
            _overflow()
        if pending is not None:
            raise pending
    except Exception as e:  # a bug of rethook's: never the program's problem
        internal_error(e)
    finally:
        ts.busy = False


def _on_resume(code: CodeType, offset: int, *exc: Any) -> None:
    # PY_RESUME (code, offset) and PY_THROW (code, offset, exception) share this callback;
    # PY_THROW is global, so it mostly finds nothing parked for its frame.
    if not _parked:
        return
    try:
        ts = _local.ts
    except AttributeError:
        ts = _new_thread_state()
    if ts.busy:
        return
    ts.busy = True
    try:
        if _sweeping:
            _wait_sweep(ts)
        rec = _parked.pop(_getframe(1), None)
        if rec is None:
            return
        t = _now()
        rec[REC_SLEEP] += t - rec[REC_PARKED_AT]
        stack = ts.stack
        pending = _notify(rec, len(stack), t, True)
        stack.append(rec)
        if pending is not None:
            raise pending
    except Exception as e:  # a bug of rethook's: never the program's problem
        internal_error(e)
    finally:
        ts.busy = False


def flush_thread(ts: ThreadState) -> None:
    """Deliver every open call of a finished thread as unfinished and forget the thread.

    Runs in the ending thread. When another thread runs it, the thread did not end: it does
    not exist in this process, a fork child, whose calls are the parent's to deliver.
    """
    if ts.tid != threading.get_ident():
        ts.stack.clear()
    with _threads_lock:
        if _threads.get(ts.tid) is ts:
            del _threads[ts.tid]
            _dead_counts[0] += ts.recursion
            _dead_counts[1] += ts.overrun
    stack = ts.stack
    if not stack:
        return
    t = _now()
    ts.busy = True
    try:
        while stack:
            rec = stack.pop()
            deliver(rec, len(stack), None, None, t, FLAG_UNFINISHED, ts)
    except Exception as e:  # a bug of rethook's: never the program's problem
        internal_error(e)
    finally:
        ts.busy = False


# --- the interface the engine drives ---------------------------------------------------------
class PyCore:
    """The pure-Python core behind the interface every core implements (coreapi.HookCore)."""

    name = "python"
    note = "pure-Python core"
    #: the reference: no direct calls (it ignores direct entries), no native users
    capabilities = Capabilities("python", direct_calls=False, native_users=False)

    LOCAL_CALL_EVENTS = sys.monitoring.events.PY_START
    LOCAL_RETURN_EVENTS = (
        sys.monitoring.events.PY_RETURN
        | sys.monitoring.events.PY_YIELD
        | sys.monitoring.events.PY_RESUME
    )
    GLOBAL_EVENTS = sys.monitoring.events.PY_UNWIND | sys.monitoring.events.PY_THROW
    _discovering = False  # set_discovery: PY_START is a global event too
    #: global while discovery is on: every code object's first call (see Discovery)
    DISCOVERY_EVENTS = sys.monitoring.events.PY_START
    _CALLBACKS = (
        ("PY_START", _on_start), ("PY_RETURN", _on_return), ("PY_UNWIND", _on_unwind),
        ("PY_YIELD", _on_yield), ("PY_RESUME", _on_resume), ("PY_THROW", _on_resume),
    )

    def __init__(self) -> None:
        self.tool_id: int | None = None

    def install(self, tool_id: int) -> None:
        """Register the callbacks on ``tool_id`` and turn on the global exit events."""
        mon = sys.monitoring
        for event, callback in self._CALLBACKS:
            mon.register_callback(tool_id, getattr(mon.events, event), callback)
        mon.set_events(tool_id, self.GLOBAL_EVENTS)
        self.tool_id = tool_id

    def uninstall(self) -> str | None:
        """Take the callbacks and global events off the tool id, and re-arm what discovery
        disabled, so the next tool to take this id (or rethook again) finds every location as
        it was. Returns what another tool had changed meanwhile (a callback of ours replaced),
        or None. An id another tool took over is left alone."""
        mon = sys.monitoring
        tool_id = self.tool_id
        if tool_id is None:
            return None
        self._discovery_state(None, None, None)
        self._discovering = False
        self.tool_id = None
        if mon.get_tool(tool_id) != TOOL_NAME:
            _disabled.clear()  # another tool's now: its events and callbacks are its own
            return None
        mon.set_events(tool_id, 0)
        replaced = []
        for event, callback in self._CALLBACKS:
            old = mon.register_callback(tool_id, getattr(mon.events, event), None)
            if old is not callback:
                replaced.append(event)
        if _disabled:
            _disabled.clear()
            mon.restart_events()
        if not replaced:
            return None
        return (f"the callback{'s' if len(replaced) > 1 else ''} for {', '.join(replaced)} of "
                f"rethook's sys.monitoring tool id {tool_id} "
                f"{'were' if len(replaced) > 1 else 'was'} replaced "
                "(sys.monitoring.register_callback): calls after that were not seen whole")

    def _global_events(self) -> int:
        """The events set on the tool id itself: discovery adds PY_START."""
        return self.GLOBAL_EVENTS | (self.DISCOVERY_EVENTS if self._discovering else 0)

    def set_discovery(self, hook: Callable[[CodeType, FrameType | None], bool] | None,
                      known: Any = None, bodies: Any = None, unarmed: Any = None,
                      arm: Callable[[CodeType], bool] | None = None) -> None:
        """Turn discovery on (see Discovery) or off (``hook`` None).

        ``hook(code, frame)`` is called on the first call of code whose id is not in ``known``
        (a dict kept up to date by its owner), nor, for a module or class body, in ``bodies``
        (the same for bodies, whose first run then needs no call); it registers the code and
        answers whether it did (False: look again next time). ``arm(code)`` is called on the
        first call of code whose id is in ``unarmed`` (a dict id -> code its owner keeps), to
        hook it; a call it hooked is dispatched as a hooked one. It answers False when no
        user selects the code (its PY_START is then disabled, as for code nobody wants).
        """
        self._discovery_state(hook, known, bodies, unarmed, arm)
        self._discovering = hook is not None
        if self.tool_id is not None:
            sys.monitoring.set_events(self.tool_id, self._global_events())

    def hook_lost(self) -> str | None:
        """What another tool did to the hook, or None while it is as installed: the tool id
        freed or taken, the global events changed. Cheap (no audit event): a drain thread
        asks every round. Callbacks cannot be read without replacing them, so a replaced
        callback is found by :meth:`uninstall`."""
        mon = sys.monitoring
        tool_id = self.tool_id
        if tool_id is None:
            return None
        holder = mon.get_tool(tool_id)
        if holder is None:
            return (f"rethook's sys.monitoring tool id {tool_id} was freed by the program "
                    f"(sys.monitoring.free_tool_id({tool_id}))")
        if holder != TOOL_NAME:
            return f"rethook's sys.monitoring tool id {tool_id} is now held by {holder!r}"
        events = mon.get_events(tool_id)
        if events != self._global_events():
            return (f"rethook's sys.monitoring events were changed by the program "
                    f"(sys.monitoring.set_events({tool_id}, {events}))")
        return None

    @staticmethod
    def _discovery_state(hook: Callable[[CodeType, FrameType | None], bool] | None,
                         known: Any, bodies: Any = None, unarmed: Any = None,
                         arm: Callable[[CodeType], bool] | None = None) -> None:
        global _discover, _known, _bodies, _unarmed, _arm, _arm_known
        _known = known if hook is not None else {}
        _bodies = bodies if hook is not None and bodies is not None else {}
        _arm = arm if hook is not None and unarmed is not None else None
        _unarmed = unarmed if _arm is not None else {}
        _arm_known = False  # (until set_arm_known)
        _discover = hook

    @staticmethod
    def disabled() -> set[int]:
        """Ids of the code objects answered DISABLE since the last ``restart_events()`` the
        engine made (it empties the set when it makes one)."""
        return _disabled

    @staticmethod
    def publish(table: dict[int, tuple], added: dict[int, tuple] | None = None) -> None:
        """Swap in a new dispatch table (one reference store: atomic for every thread).

        ``added``: when ``table`` is the table already published, grown in place by adding
        entries for code it did not hold, those entries (a core that keeps its own copy of the
        table adds just them). This core reads ``table`` itself.
        """
        global _table
        _table = table

    @staticmethod
    def set_max_depth(depth: int) -> None:
        global _max_depth
        _max_depth = depth

    @staticmethod
    def set_arm_known(on: bool) -> None:
        """Also hand the arm hook (set_discovery's) every known function at its first call,
        not only those in ``unarmed``: for users that select every function the registry
        knows, kept in no dict of ids (the engine's implicit selection). Off again whenever
        discovery is set."""
        global _arm_known
        _arm_known = bool(on) and _arm is not None

    @staticmethod
    def set_sweeping(on: bool) -> None:
        global _sweeping
        _sweeping = on

    @staticmethod
    def set_overflow(hook: Callable[[], None] | None, limit: int) -> None:
        global _overflow, _park_limit
        _overflow = hook
        _park_limit = limit

    @staticmethod
    def sweep_lock() -> threading.RLock:
        return sweep_lock

    @staticmethod
    def internal_errors() -> int:
        return _internal_errors[0]

    @staticmethod
    def dead_counts() -> tuple[int, int]:
        return _dead_counts[0], _dead_counts[1]

    @staticmethod
    def thread_states() -> list[ThreadState]:
        with _threads_lock:
            return list(_threads.values())

    @staticmethod
    def current_thread_state() -> ThreadState | None:
        return getattr(_local, "ts", None)

    @staticmethod
    def parked() -> dict[FrameType, list]:
        return _parked

    @staticmethod
    def close_parked(frames: list[FrameType], counts: list[int]) -> None:
        """Deliver the parked calls of ``frames`` (their generators or coroutines were closed
        or collected silently: the engine's collect_parked) as closed: each record still
        parked is taken out and its claims delivered with ``FLAG_CLOSED``, a new
        ``GeneratorExit`` and the time of its last suspension. ``counts`` is ``[records
        closed, claims whose user still had a return handler]``, added to as it goes (a
        handler's KeyboardInterrupt ends the walk, the rest still parked). The caller marks
        the thread busy."""
        for frame in frames:
            rec = _parked.pop(frame, None)
            if rec is None or len(rec) <= REC_HEADER:
                continue
            counts[0] += 1
            counts[1] += sum(1 for reg, _ in claims(rec) if reg.retfunc is not None)
            deliver(rec, 0, None, GeneratorExit(), rec[REC_PARKED_AT], FLAG_CLOSED)

    @staticmethod
    def finished_frames(frames: list[FrameType]) -> list[FrameType] | None:
        """Those of ``frames`` (parked calls') whose generator or coroutine has finished, or
        None when the core cannot tell from the frames alone (this one: the engine then asks
        the garbage collector who holds them)."""
        return None

    @staticmethod
    def drain_wait(seconds: float, first: bool) -> bool:
        """Wait up to ``seconds`` without the GIL, then take it back, for the thread that
        writes the program's records out (the recorder's drain) between two rounds. The C
        core's wait ends as soon as a native ring is a quarter full (or :meth:`drain_wake`),
        and with ``first`` and blocking off the round that follows runs ahead of the
        program's threads (they hand the GIL over at their next callback) until
        :meth:`drain_end`. Nothing wakes this one: it sleeps a poll's length at most, and
        waits its turn for the GIL like any thread. Returns whether a ring or
        :meth:`drain_wake` ended the wait (or came since the last one): here never."""
        time.sleep(min(seconds, DRAIN_POLL_SECONDS))
        return False

    @staticmethod
    def drain_wake() -> None:
        """End the drain's :meth:`drain_wait` now (here it ends by itself soon enough)."""

    @staticmethod
    def drain_end() -> None:
        """End the round :meth:`drain_wait` began (nothing to do here)."""

    @staticmethod
    def drain_blocking(seconds: float) -> None:
        """How long the program's threads may wait for a running drain when a native ring
        is three quarters full, rather than lose records; 0: never. (Here: nothing to do,
        this core writes no native rings.)"""

    @staticmethod
    def after_fork_in_child() -> None:
        """Keep the forking thread's state, forget the others (their calls are the parent's)."""
        global sweep_lock, _threads_lock
        sweep_lock = threading.RLock()
        _threads_lock = threading.Lock()
        me = getattr(_local, "ts", None)
        _threads.clear()
        if me is not None:
            me.tid = threading.get_ident()
            me.busy = False
            _threads[me.tid] = me

    Registration = Registration
    EntryRegistration = EntryRegistration
    notrace = notrace
    deliver = staticmethod(deliver)
    handler_failed = staticmethod(handler_failed)
