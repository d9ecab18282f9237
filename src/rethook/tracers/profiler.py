"""The function profiler (``function_profile_enabled`` and ``trace_stat/function*``).

A graph user that counts, per thread and per function, the hits and the time: total time with
``graph-time`` on, self time (children subtracted) with it off; each child charges its duration
to its parent's entry data (``parent_data``, the kernel's ``fgraph_retrieve_parent_data``).
``sleep-time`` off leaves out the time generators and coroutines spent suspended.

Hits are counted the way cProfile counts calls, so the two agree function by function: a call
is one hit, and so is each resumption of a generator or coroutine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from rethook.engine.engine import FgraphOps
from rethook.tracers.base import TraceContext
from rethook.tracers.native import GRAPH_HANDLERS, install_handlers, native_unavailable, native_user


@dataclass
class FunctionStat:
    """One line of ``trace_stat/function*``."""

    name: str
    hit: int
    time_ns: int
    time_sq: int  # sum of squared durations, for s^2

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


class ProfileOps(FgraphOps):
    """Counts hits at entry (and resume) and time at exit, per thread."""

    def __init__(self, ctx: TraceContext) -> None:
        super().__init__(name="function_profile")
        self.filter = ctx.ftrace_filter
        self.wants_frame = False
        self.graph_time = ctx.options["graph-time"]
        self.sleep_time = ctx.options["sleep-time"]
        self.tables: dict[int, dict[int, list]] = {}  # tid -> id(code) -> [code, hit, t, t^2]
        self._local = threading.local()
        self._lock = threading.Lock()

    def _table(self) -> dict[int, list]:
        try:
            return self._local.table
        except AttributeError:
            table: dict[int, list] = {}
            with self._lock:
                self.tables[threading.get_native_id()] = table
            self._local.table = table
            return table

    def _hit(self, code: CodeType) -> None:
        try:
            table = self._local.table
        except AttributeError:
            table = self._table()
        row = table.get(id(code))
        if row is None:
            table[id(code)] = [code, 1, 0, 0]
        else:
            row[1] += 1

    def entryfunc(self, code: CodeType, frame: FrameType | None, depth: int, t: int) -> Any:
        self._hit(code)
        return [0, self._table()]  # [children's time, the table of the call's thread]

    def resumefunc(self, code: CodeType, frame: FrameType | None, depth: int, data: Any,
                   t: int) -> None:
        self._hit(code)

    def retfunc(self, code: CodeType, frame: FrameType | None, depth: int, data: Any,
                retval: Any, exc: BaseException | None, t0: int, t1: int, sleep: int,
                flags: int) -> None:
        total = t1 - t0 if self.sleep_time else t1 - t0 - sleep
        parent = self.parent_data()
        if parent is not None:
            parent[0] += total
        spent = total if self.graph_time else total - data[0]
        row = data[1].get(id(code))
        if row is not None:
            row[2] += spent
            row[3] += spent * spent

    def rows(self) -> list[tuple[int, CodeType, int, int, int]]:
        """``(tid, code, hit, time_ns, time_sq)`` for every thread and function."""
        with self._lock:
            tables = list(self.tables.items())
        return [(tid, *row) for tid, table in tables for row in list(table.values())]

    def stats(self, name_of, tid: int | None = None) -> list[FunctionStat]:
        """Rows for one thread (``trace_stat/functionN``) or all threads, by time, longest first."""
        merged: dict[int, list] = {}
        for t, code, hit, time_ns, sq in self.rows():
            if tid is not None and t != tid:
                continue
            row = merged.setdefault(id(code), [code, 0, 0, 0])
            row[1] += hit
            row[2] += time_ns
            row[3] += sq
        out = [FunctionStat(name_of(code), hit, time_ns, sq)
               for code, hit, time_ns, sq in merged.values()]
        out.sort(key=lambda s: (-s.time_ns, -s.hit, s.name))
        return out

    def threads(self) -> list[int]:
        with self._lock:
            return list(self.tables)


class NativeProfileOps(ProfileOps):
    """The same user with its per-call work in C (tracers/native.py, _native.c): its own
    per-thread stack of open calls finds a call's parent, where ProfileOps asks parent_data."""

    def __init__(self, ctx: TraceContext) -> None:
        super().__init__(ctx)
        user = native_user("profile", graph_time=self.graph_time, sleep_time=self.sleep_time)
        install_handlers(self, user, GRAPH_HANDLERS)

    def rows(self) -> list[tuple[int, CodeType, int, int, int]]:
        return self.native.rows()

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
