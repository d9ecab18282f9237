"""The function profiler (``function_profile_enabled`` and ``trace_stat/function*``).

A graph user that counts, per thread, per function and per caller -> callee edge, the hits and
the times. A call's parent is the call below it on the user's own per-thread stack of open
calls (a generator or coroutine leaves that stack while suspended), which mirrors this user's
claims on the engine's shadow stack; each child charges its duration to its parent.

Per function it keeps the kernel's columns -- hits, and Time with its sum of squares (total
time with ``graph-time`` on, self time with it off) -- and the ones cProfile has:

* ``prim``: hits made while no other call of the function was on the thread's stack (the
  calls that are not recursive: cProfile's primitive calls);
* ``total``: the inclusive time of those calls only, so that recursion is not counted twice
  (cProfile's cumulative time);
* ``self``: time minus the children's time (cProfile's total time, tottime).

An edge keeps hits, prim (no other call through the same edge on the stack), total and self,
the way cProfile keeps them per caller. ``sleep-time`` off leaves out the time generators and
coroutines spent suspended.

Hits are counted the way cProfile counts calls, so the two agree function by function and
edge by edge: a call is one hit, and so is each resumption of a generator or coroutine (an
edge from whatever resumed it). A call's time goes to its function and to the edge it was
called through, when it returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from types import CodeType, FrameType
from typing import Any

from rethook.engine.engine import FgraphOps
from rethook.frozen import Fields
from rethook.tracers.base import TraceContext
from rethook.tracers.native import GRAPH_HANDLERS, install_handlers, native_unavailable, native_user


class CallerStat(Fields):
    """Calls of a function from one caller (a pstats ``callers`` entry)."""

    __slots__ = ("hit", "prim", "total_ns", "self_ns")

    def __init__(self, hit: int = 0, prim: int = 0, total_ns: int = 0,
                 self_ns: int = 0) -> None:
        self.hit, self.prim, self.total_ns, self.self_ns = hit, prim, total_ns, self_ns


class FunctionStat(Fields):
    """One function's line of the profile (``trace_stat/function*`` has the kernel's columns:
    name, hit, time_ns, time_sq).

    ``time_ns``: the kernel's Time, inclusive with graph-time on, self time with it off;
    ``time_sq``: the sum of squared Times, for s^2; ``prim``: hits with no other call of the
    function on the thread's stack; ``total_ns``: inclusive time of the prim calls (recursion
    not counted twice); ``self_ns``: time minus the children's; ``file`` and ``line``: where
    the function is defined ("" if not known); ``func``: its qualified name within the
    module; ``callers``: the caller's name -> its calls."""

    __slots__ = ("name", "hit", "time_ns", "time_sq", "prim", "total_ns", "self_ns", "file",
                 "line", "func", "callers")

    def __init__(self, name: str, hit: int = 0, time_ns: int = 0, time_sq: int = 0,
                 prim: int = 0, total_ns: int = 0, self_ns: int = 0, file: str = "",
                 line: int = 0, func: str = "",
                 callers: dict[str, CallerStat] | None = None) -> None:
        self.name, self.hit, self.time_ns, self.time_sq = name, hit, time_ns, time_sq
        self.prim, self.total_ns, self.self_ns = prim, total_ns, self_ns
        self.file, self.line, self.func = file, line, func
        self.callers: dict[str, CallerStat] = {} if callers is None else callers

    @property
    def avg_ns(self) -> float:
        return self.time_ns / self.hit if self.hit else 0.0

    @property
    def s2_ns(self) -> float:
        """Sample variance of the durations (ns^2), the kernel's ``s^2`` column."""
        n = self.hit
        if n <= 1:
            return 0.0
        return (n * self.time_sq - self.time_ns * self.time_ns) / (n * (n - 1))


# A function's row in a thread's table: [function, hit, prim, time, time_sq, total, self,
# active, key]; an edge's: [function, caller, hit, prim, -, -, total, self, active].
_HIT, _PRIM, _TIME, _SQ, _TOTAL, _SELF, _ACTIVE, _KEY = range(1, 9)
_EDGE = 1  # an edge row has the caller after the function: its indexes are shifted by one

#: A call's entry data: [children's time, row, edge, prim bits, the row and edge holding its
#: active count, the stack it is on (None while suspended or after it returned)].
_CHILD, _ROW, _EDGE_ROW, _PRIMS, _AROW, _AEDGE, _STACK = range(7)
PRIM_ROW, PRIM_EDGE = 1, 2  # the entry was prim for its function, for its edge


class ProfileThread:
    """One thread's tables and stack of open calls: the profiler's bookkeeping, whether calls
    come from the engine (:class:`ProfileOps`) or from a recorded trace's slices
    (rethook.output.profile). A function is an object (a code object, a name) and a key
    that tells functions apart (``id(code)``: code objects compare by value)."""

    __slots__ = ("rows", "edges", "stack")

    def __init__(self) -> None:
        self.rows: dict[Any, list] = {}  # key -> row
        self.edges: dict[tuple[Any, Any], list] = {}  # (caller's key, key) -> edge row
        self.stack: list[list] = []  # open calls' entry data, innermost last

    @staticmethod
    def new_call() -> list:
        return [0, None, None, 0, None, None, None]

    def enter(self, key: Any, func: Any, call: list) -> int:
        """``call`` (of ``func``) goes on the stack under the call on top (its caller): a hit
        for the function and the edge; prim when none of their calls is on the stack already.
        Returns the PRIM_* bits."""
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [func, 0, 0, 0, 0, 0, 0, 0, key]
        stack = self.stack
        edge = None
        if stack:
            parent = stack[-1][_AROW]
            ekey = (parent[_KEY], key)
            edge = self.edges.get(ekey)
            if edge is None:
                edge = self.edges[ekey] = [func, parent[0], 0, 0, 0, 0, 0, 0, 0]
        stack.append(call)
        call[_STACK] = stack
        prim = 0
        row[_HIT] += 1
        row[_ACTIVE] += 1
        if row[_ACTIVE] == 1:
            row[_PRIM] += 1
            prim |= PRIM_ROW
        if edge is not None:
            edge[_EDGE + _HIT] += 1
            edge[_EDGE + _ACTIVE] += 1
            if edge[_EDGE + _ACTIVE] == 1:
                edge[_EDGE + _PRIM] += 1
                prim |= PRIM_EDGE
        call[_AROW] = row
        call[_AEDGE] = edge
        return prim

    def begin(self, key: Any, func: Any) -> list:
        """A new call of ``func``: its entry data."""
        call = self.new_call()
        call[_PRIMS] = self.enter(key, func, call)
        call[_ROW] = call[_AROW]
        call[_EDGE_ROW] = call[_AEDGE]
        return call

    @staticmethod
    def leave(call: list) -> list | None:
        """``call`` leaves its thread's stack; returns the open call below it, if any."""
        stack = call[_STACK]
        if stack is None:
            return None
        call[_STACK] = None
        i = len(stack) - 1
        while i >= 0 and stack[i] is not call:
            i -= 1
        if i < 0:
            return None
        del stack[i]
        call[_AROW][_ACTIVE] -= 1
        if call[_AEDGE] is not None:
            call[_AEDGE][_EDGE + _ACTIVE] -= 1
        return stack[i - 1] if i > 0 else None

    @classmethod
    def end(cls, call: list, total: int, graph_time: bool) -> None:
        """``call`` returned after ``total`` ns: off the stack, its time to its parent's
        children's time, to its function and to the edge it was called through."""
        parent = cls.leave(call)
        if parent is not None:
            parent[_CHILD] += total
        self_ns = total - call[_CHILD]
        spent = total if graph_time else self_ns
        row = call[_ROW]
        row[_TIME] += spent
        row[_SQ] += spent * spent
        row[_SELF] += self_ns
        if call[_PRIMS] & PRIM_ROW:
            row[_TOTAL] += total
        edge = call[_EDGE_ROW]
        if edge is not None:
            edge[_EDGE + _SELF] += self_ns
            if call[_PRIMS] & PRIM_EDGE:
                edge[_EDGE + _TOTAL] += total

    def row_tuples(self) -> list[tuple]:
        """``(function, hit, prim, time_ns, time_sq, total_ns, self_ns)`` per function."""
        return [tuple(row[:_ACTIVE]) for row in list(self.rows.values())]

    def edge_tuples(self) -> list[tuple]:
        """``(caller, function, hit, prim, total_ns, self_ns)`` per edge."""
        return [(e[1], e[0], e[_EDGE + _HIT], e[_EDGE + _PRIM], e[_EDGE + _TOTAL],
                 e[_EDGE + _SELF]) for e in list(self.edges.values())]


#: A FunctionStat's numbers, in the order of a saved row (a child process's profile file).
STAT_NUMBERS = ("hit", "time_ns", "time_sq", "prim", "total_ns", "self_ns")
CALLER_NUMBERS = ("hit", "prim", "total_ns", "self_ns")


def stat_row(st: FunctionStat) -> list[Any]:
    """A FunctionStat as JSON-able data: ``[name, numbers..., file, line, func, callers]``."""
    return [st.name, *(getattr(st, k) for k in STAT_NUMBERS), st.file, st.line, st.func,
            {name: [getattr(c, k) for k in CALLER_NUMBERS] for name, c in st.callers.items()}]


def stat_from_row(row: list[Any]) -> FunctionStat:
    """The FunctionStat that :func:`stat_row` gave ``row``."""
    name, *numbers = row[:1 + len(STAT_NUMBERS)]
    file, line, func, callers = row[1 + len(STAT_NUMBERS):]
    st = FunctionStat(name, *numbers[:3], file=file, line=line, func=func)
    st.prim, st.total_ns, st.self_ns = numbers[3:]
    st.callers = {caller: CallerStat(*nums) for caller, nums in callers.items()}
    return st


def add_stats(into: dict[str, FunctionStat], stats: Iterable[FunctionStat],
              sign: int = 1) -> None:
    """Add (``sign`` -1: take away) ``stats`` to the table ``into``, function by function and
    caller by caller: processes merged, or what a fork child counted since the fork."""
    for st in stats:
        mine = into.get(st.name)
        if mine is None:
            mine = into[st.name] = FunctionStat(st.name, file=st.file, line=st.line,
                                                func=st.func)
        for k in STAT_NUMBERS:
            setattr(mine, k, getattr(mine, k) + sign * getattr(st, k))
        for name, c in st.callers.items():
            m = mine.callers.setdefault(name, CallerStat())
            for k in CALLER_NUMBERS:
                setattr(m, k, getattr(m, k) + sign * getattr(c, k))


def merge_stats(rows: Iterable[tuple], edges: Iterable[tuple], name_of: Callable[[Any], str],
                where: Callable[[Any], tuple[str, int, str]]) -> list[FunctionStat]:
    """FunctionStats (threads merged) from ``(function, hit, prim, time, sq, total, self)``
    rows and ``(caller, function, hit, prim, total, self)`` edges; ``where(function)`` is
    ``(file, line, qualname)``. Sorted by the kernel's Time, longest first."""
    merged: dict[str, FunctionStat] = {}
    for func, hit, prim, time_ns, sq, total, self_ns in rows:
        name = name_of(func)
        st = merged.get(name)
        if st is None:
            file, line, qualname = where(func)
            st = merged[name] = FunctionStat(name, file=file, line=line, func=qualname)
        st.hit += hit
        st.prim += prim
        st.time_ns += time_ns
        st.time_sq += sq
        st.total_ns += total
        st.self_ns += self_ns
    for caller, func, hit, prim, total, self_ns in edges:
        st = merged.get(name_of(func))
        if st is None:
            continue
        c = st.callers.setdefault(name_of(caller), CallerStat())
        c.hit += hit
        c.prim += prim
        c.total_ns += total
        c.self_ns += self_ns
    out = list(merged.values())
    out.sort(key=lambda s: (-s.time_ns, -s.hit, s.name))
    return out


def _where(code: CodeType) -> tuple[str, int, str]:
    return code.co_filename, code.co_firstlineno, code.co_qualname


class ProfileOps(FgraphOps):
    """Counts hits at entry (and resume) and time at exit, per thread."""

    def __init__(self, ctx: TraceContext) -> None:
        super().__init__(name="function_profile")
        self.filter = ctx.ftrace_filter
        self.wants_frame = False
        self.graph_time = ctx.options["graph-time"]
        self.sleep_time = ctx.options["sleep-time"]
        self.tables: dict[int, ProfileThread] = {}  # native tid -> the thread's tables
        self._local = threading.local()
        self._lock = threading.Lock()

    def _thread(self) -> ProfileThread:
        try:
            return self._local.thread
        except AttributeError:
            th = ProfileThread()
            with self._lock:
                self.tables[threading.get_native_id()] = th
            self._local.thread = th
            return th

    def entryfunc(self, code: CodeType, frame: FrameType | None, depth: int, t: int) -> Any:
        return self._thread().begin(id(code), code)

    def resumefunc(self, code: CodeType, frame: FrameType | None, depth: int, data: Any,
                   t: int) -> None:
        ProfileThread.leave(data)
        self._thread().enter(id(code), code, data)

    def suspendfunc(self, code: CodeType, frame: FrameType | None, depth: int, data: Any,
                    t: int) -> None:
        ProfileThread.leave(data)

    def retfunc(self, code: CodeType, frame: FrameType | None, depth: int, data: Any,
                retval: Any, exc: BaseException | None, t0: int, t1: int, sleep: int,
                flags: int) -> None:
        ProfileThread.end(data, t1 - t0 if self.sleep_time else t1 - t0 - sleep,
                          self.graph_time)

    def _threads(self) -> list[tuple[int, ProfileThread]]:
        with self._lock:
            return list(self.tables.items())

    def rows(self) -> list[tuple[int, CodeType, int, int, int, int, int, int]]:
        """``(tid, code, hit, prim, time_ns, time_sq, total_ns, self_ns)`` for every thread
        and function."""
        return [(tid, *row) for tid, th in self._threads() for row in th.row_tuples()]

    def edges(self) -> list[tuple[int, CodeType, CodeType, int, int, int, int]]:
        """``(tid, caller, code, hit, prim, total_ns, self_ns)`` for every thread and edge."""
        return [(tid, *edge) for tid, th in self._threads() for edge in th.edge_tuples()]

    def stats(self, name_of: Callable[[CodeType], str], tid: int | None = None
              ) -> list[FunctionStat]:
        """Rows for one thread (``trace_stat/functionN``) or all threads merged, with their
        callers, by the kernel's Time, longest first."""
        return merge_stats((r[1:] for r in self.rows() if tid is None or r[0] == tid),
                           (e[1:] for e in self.edges() if tid is None or e[0] == tid),
                           name_of, _where)

    def threads(self) -> list[int]:
        with self._lock:
            return list(self.tables)


class NativeProfileOps(ProfileOps):
    """The same user with its per-call work in C (tracers/native.py, _native.c): the same
    tables and per-thread stack of open calls, as C structs."""

    def __init__(self, ctx: TraceContext) -> None:
        super().__init__(ctx)
        user = native_user("profile", graph_time=self.graph_time, sleep_time=self.sleep_time)
        install_handlers(self, user, GRAPH_HANDLERS)

    def rows(self) -> list[tuple[int, CodeType, int, int, int, int, int, int]]:
        return self.native.rows()

    def edges(self) -> list[tuple[int, CodeType, CodeType, int, int, int, int]]:
        return self.native.edges()

    def threads(self) -> list[int]:
        return self.native.threads()


class FunctionProfiler:
    """The profiler's switch (``function_profile_enabled``), beside any tracer."""

    def __init__(self) -> None:
        self.ops: ProfileOps | None = None
        self.ctx: TraceContext | None = None
        self.last: ProfileOps | None = None  # keeps the numbers readable after stopping

    @property
    def enabled(self) -> bool:
        return self.ops is not None

    def start(self, ctx: TraceContext) -> None:
        if self.ops is not None:
            return
        self.ctx = ctx
        native = native_unavailable(ctx, "profile") is None
        ops = (NativeProfileOps if native else ProfileOps)(ctx)
        ctx.engine.register_ftrace_graph(ops)  # enabled only once it runs
        self.ops = self.last = ops

    def stop(self) -> None:
        if self.ops is not None:
            self.ctx.engine.unregister_ftrace_graph(self.ops)
            self.ops = None

    def reset(self) -> None:
        """Writing ``function_profile_enabled`` again starts from zero, as in the kernel."""
        self.last = self.ops
