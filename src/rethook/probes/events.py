"""Dynamic probe events: ``p:``/``r:``/``f:`` definitions as live trace events.

A :class:`ProbeEvent` is one definition made real: an event format in the trace (its fetch args
as fields), an engine user that records it (an entry user for ``p:`` and entry ``f:`` events, a
graph user for ``r:`` and ``f:...%return`` events, which capture their arguments at entry), an
event filter, triggers (``traceon``/``traceoff``/``stacktrace``/``hist``) and ``nhit``/``nmissed``
counters. A new event is disabled, as in the kernel: it costs nothing until enabled.

The set of events of one trace instance, the ``dynamic_events`` file, is
:class:`~rethook.probes.dynamic.DynamicEvents` (re-exported here); it imports this module when
the first definition is written.

Event record layout (after the common ``(format_id, ts, tid)``)::

    __probe_func  str   the probed function
    __probe_caller str  its caller ('' for entry events)
    __probe_line  u64   the caller's line (return events) or the function's line (entry events)
    __faults      u64   bit i set: fetch arg i faulted (its stored value is a placeholder)
    __exc         str   'Type: message' when the probed call raised (return events)
    <fetch args>        one field each, typed by the fetch arg's TYPE
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Mapping
from types import CodeType, FrameType
from typing import Any

from rethook.buffer.events import EventFormat
from rethook.engine.engine import FgraphOps, FtraceOps
from rethook.engine.filters import FilterError, FunctionFilter
from rethook.probes.dynamic import DynamicEvents, ErrorLog, ProbeError
from rethook.probes.dynevent import ProbeDefinition, parse_definition
from rethook.probes.evfilter import EventFilter, FilterSyntaxError, compile_filter
from rethook.probes.fetch import (
    FAULT,
    FetchContext,
    ProbeSyntaxError,
    Raised,
    compile_plan,
    field_type,
)
from rethook.probes.hist import HistTrigger, render_hist_file
from rethook.probes.triggers import (
    apply_trigger_write,
    fire_post,
    fire_triggers,
    render_trigger_file,
)
from rethook.tracers.base import TraceContext
from rethook.tracers.formats import STACKTRACE
from rethook.tracers.function import stack_text

HEADER_FIELDS = (("__probe_func", "str"), ("__probe_caller", "str"), ("__probe_line", "u64"),
                 ("__faults", "u64"), ("__exc", "str"))
N_HEADER = len(HEADER_FIELDS)
_PLACEHOLDER = {"u64": 0, "s64": 0, "str": "", "bool": False, "f64": 0.0}


def _own_frame(frame: FrameType) -> bool:
    return frame.f_globals.get("__name__", "").startswith("rethook.")


class _Actions:
    """What triggers act on (the TriggerActions protocol)."""

    def __init__(self, ctx: TraceContext) -> None:
        self.ctx = ctx

    def is_tracing_on(self) -> bool:
        return self.ctx.buffer.tracing_on

    def traceon(self) -> None:
        self.ctx.buffer.tracing_on = True

    def traceoff(self) -> None:
        self.ctx.buffer.tracing_on = False

    def stacktrace(self) -> None:
        frame = sys._getframe(1)
        while frame is not None and _own_frame(frame):
            frame = frame.f_back
        local = self.ctx.buffer.local()
        local.append((STACKTRACE.id, self.ctx.now(), local.tid,
                      stack_text(frame, self.ctx.name)))


class ProbeEvent:
    """One dynamic event: its definition, format, engine user, filter and triggers."""

    def __init__(self, definition: ProbeDefinition, ctx: TraceContext, format_id: int,
                 format_name: str | None = None) -> None:
        self.defn = definition
        self.ctx = ctx
        self.group = definition.group
        self.name = definition.event
        self.is_return = definition.is_return
        self.plan = compile_plan(definition.args, definition.is_return,
                                 f"{self.group}/{self.name}")
        self.field_types = [field_type(t) for t in self.plan.types]
        self.format = EventFormat(format_id, format_name or self.full_name, (
            *HEADER_FIELDS, *zip(self.plan.names, self.field_types, strict=True)))
        # Filters and triggers see the fetch args by name (plus comm/common_pid).
        self.fields = dict(zip(self.plan.names, self.plan.types, strict=True))
        self.filter: EventFilter | None = None
        self.triggers: list[Any] = []
        self.nhit = 0
        self.own_missed = 0  # maxactive
        self.ops: FtraceOps | FgraphOps | None = None
        self._reg: Any = None
        self._lock = threading.Lock()
        self.nactive = 0
        self.maxactive = definition.maxactive or 0
        try:
            self.functions = FunctionFilter([definition.func], registry=ctx.registry)
        except FilterError as e:
            raise ProbeError(f"no function matches {definition.func!r}",
                             definition.canonical()) from e
        if definition.kind in "pr" and len(self.functions.select_by_id()) > 1:
            raise ProbeError(f"{definition.func!r} matches several functions; a "
                             f"{'kretprobe' if definition.kind == 'r' else 'kprobe'} probes "
                             "one (use an f: event for many)", definition.canonical())
        self.actions = _Actions(ctx)

    @property
    def full_name(self) -> str:
        return f"{self.group}/{self.name}"

    @property
    def enabled(self) -> bool:
        return self.ops is not None

    @property
    def nmissed(self) -> int:
        return self.own_missed + (self._reg.nmissed if self._reg is not None else 0)

    # --- enabling ------------------------------------------------------------------------
    def enable(self) -> None:
        if self.ops is not None:
            return
        engine = self.ctx.engine
        if self.is_return:
            ops = _ReturnProbeOps(self)
            engine.register_ftrace_graph(ops)
            self._reg = engine.registration(ops)
        else:
            ops = _EntryProbeOps(self)
            engine.register_ftrace_function(ops)
            self._reg = engine.registration(ops)
        self.ops = ops

    def disable(self) -> None:
        ops, self.ops = self.ops, None
        if ops is None:
            return
        if isinstance(ops, FgraphOps):
            self.ctx.engine.unregister_ftrace_graph(ops)
        else:
            self.ctx.engine.unregister_ftrace_function(ops)

    # --- one hit ---------------------------------------------------------------------------
    def record(self, t: int, func: str, caller: str, line: int, values: tuple,
               exc: BaseException | None, append: Any, tid: int) -> None:
        """Triggers, filter, then the event into the buffer (``append`` of this thread's),
        in the kernel's order: the triggers see every hit, the filter decides only whether
        the event is recorded, and post triggers act after it (triggers.fire_triggers)."""
        if self.filter is not None or self.triggers:
            named = dict(zip(self.plan.names, values, strict=True))
            named["comm"] = threading.current_thread().name
            named["common_pid"] = threading.get_native_id()
            post = fire_triggers(self.triggers, named, self.actions) if self.triggers else ()
            if self.filter is None or self.filter.match(named):
                self._commit(t, func, caller, line, values, exc, append, tid)
            if post:
                fire_post(post, self.actions)
            return
        self._commit(t, func, caller, line, values, exc, append, tid)

    def _commit(self, t: int, func: str, caller: str, line: int, values: tuple,
                exc: BaseException | None, append: Any, tid: int) -> None:
        if exc is None and FAULT not in values:
            append((self.format.id, t, tid, func, caller, line, 0, "", *values))
            return
        faults = 0
        out = []
        for i, v in enumerate(values):
            if v is FAULT or type(v) is Raised:
                faults |= 1 << i
                v = _PLACEHOLDER[self.field_types[i]]
            out.append(v)
        text = "" if exc is None else f"{type(exc).__name__}: {exc}"[:200]
        append((self.format.id, t, tid, func, caller, line, faults, text, *out))

    # --- text ------------------------------------------------------------------------------
    def format_text(self) -> str:
        """The ``format`` file, like the kernel's ``events/GRP/EVENT/format``."""
        return self.format.describe() + f"\nprint fmt: {self.defn.canonical()}\n"

    def write_filter(self, text: str) -> None:
        text = text.strip()
        if text in ("", "0"):
            self.filter = None
            return
        self.filter = compile_filter(text, self.fields)

    def read_filter(self) -> str:
        return (self.filter.text if self.filter is not None else "none") + "\n"

    def write_trigger(self, text: str) -> None:
        self.triggers = apply_trigger_write(self.triggers, text, self.fields,
                                            event=f"{self.group}:{self.name}")

    def read_trigger(self) -> str:
        return render_trigger_file(self.triggers)

    def read_hist(self) -> str:
        return render_hist_file([t for t in self.triggers if isinstance(t, HistTrigger)])


class _ProbeOps:
    """What both kinds of probe users share: names cached per code object, this thread's
    buffer (a probe hit is budgeted at a couple of microseconds, all of it here)."""

    def _setup(self, event: ProbeEvent) -> None:
        self.event = event
        self.plan = event.plan
        self.values = event.plan.values
        self.at_entry = event.plan.at_entry
        self.name_of = event.ctx.name
        self.now = event.ctx.now
        self.buffer = event.ctx.buffer
        self._names: dict[int, tuple[CodeType, str]] = {}
        self._local = threading.local()

    def code_name(self, code: CodeType) -> str:
        hit = self._names.get(id(code))
        if hit is not None and hit[0] is code:
            return hit[1]
        name = self.name_of(code)
        self._names[id(code)] = (code, name)
        return name

    def _buf(self) -> Any:
        try:
            return self._local.buf
        except AttributeError:
            self._local.buf = buf = self.buffer.local()
            return buf


class _EntryProbeOps(_ProbeOps, FtraceOps):
    """``p:`` and entry ``f:`` events: record at entry."""

    def __init__(self, event: ProbeEvent) -> None:
        FtraceOps.__init__(self, name=f"probe:{event.full_name}")
        self._setup(event)
        self.filter = event.functions

    def func(self, code: CodeType, frame: FrameType) -> None:
        ev = self.event
        ev.nhit += 1
        fctx = FetchContext(self.at_entry(frame), frame, None, None, None, None, None,
                            self.name_of)
        buf = self._buf()
        ev.record(self.now(), self.code_name(code), "", frame.f_lineno or code.co_firstlineno,
                  self.values(fctx), None, buf.append, buf.tid)


class _ReturnProbeOps(_ProbeOps, FgraphOps):
    """``r:`` and ``f:...%return`` events: capture at entry, record at return."""

    def __init__(self, event: ProbeEvent) -> None:
        FgraphOps.__init__(self, name=f"probe:{event.full_name}")
        self._setup(event)
        self.filter = event.functions
        self.wants_frame = True
        self.needs_stack = event.plan.needs_stack
        self.maxactive = event.maxactive

    def entryfunc(self, code: CodeType, frame: FrameType | None, depth: int, t: int) -> Any:
        ev = self.event
        ev.nhit += 1
        if self.maxactive:
            with ev._lock:
                if ev.nactive >= self.maxactive:
                    ev.own_missed += 1
                    return None
                ev.nactive += 1
        caller = frame.f_back
        if caller is None:
            return (self.at_entry(frame), "", 0)
        cc = caller.f_code
        hit = self._names.get(id(cc))
        name = hit[1] if hit is not None and hit[0] is cc else self.code_name(cc)
        return (self.at_entry(frame), name, caller.f_lineno or 0)

    def retfunc(self, code: CodeType, frame: FrameType | None, depth: int, data: Any,
                retval: Any, exc: BaseException | None, t0: int, t1: int, sleep: int,
                flags: int) -> None:
        ev = self.event
        if self.maxactive:
            with ev._lock:
                ev.nactive -= 1
        captured, caller, line = data
        stack_fn = None
        if self.needs_stack and frame is not None:
            def stack_fn(frame: FrameType = frame) -> list[str]:
                out, f = [], frame.f_back
                while f is not None:
                    out.append(self.code_name(f.f_code))
                    f = f.f_back
                return out
        try:
            buf, fctx = self._local.state
        except AttributeError:
            buf, fctx = self._local.state = (self._buf(), FetchContext(name_of=self.name_of))
        # One context per thread, refilled: cheaper than making one per hit.
        fctx.captured = captured
        fctx.retval = retval
        fctx.exc = exc
        fctx.duration_ns = t1 - t0
        fctx.stack_fn = stack_fn
        fctx._thread_name = fctx._stack = None
        values = self.values(fctx)
        hit = self._names.get(id(code))
        name = hit[1] if hit is not None and hit[0] is code else self.code_name(code)
        if exc is None and ev.filter is None and not ev.triggers and FAULT not in values:
            buf.append((ev.format.id, t1, buf.tid, name, caller, line, 0, "", *values))
        else:
            ev.record(t1, name, caller, line, values, exc, buf.append, buf.tid)


class ProbeFormatter:
    """Prints probe events in the kernel's shape, from their definitions (which a trace file
    keeps in its meta, so a report needs nothing else)::

        EVENT: (FUNC+LINE) name=value ...               entry events
        EVENT: (CALLER+LINE <- FUNC) name=value ...     return events
    """

    def __init__(self, definitions: Mapping[str, str] | Iterable[str]) -> None:
        """``definitions``: format name -> definition, or just definitions (named by them)."""
        if not isinstance(definitions, Mapping):
            definitions = {_full_name(text): text for text in definitions}
        self.by_name: dict[str, tuple[ProbeDefinition, Any]] = {}
        for fmt_name, text in definitions.items():
            d = parse_definition(text)
            if isinstance(d, ProbeDefinition):
                self.by_name[fmt_name] = (d, compile_plan(d.args, d.is_return, d.full_name))

    def describe(self, fmt: EventFormat | None, ev: tuple) -> str | None:
        if fmt is None or fmt.name not in self.by_name:
            return None
        d, plan = self.by_name[fmt.name]
        func, caller, line, faults, exc = ev[3:3 + N_HEADER]
        values = list(ev[3 + N_HEADER:])
        for i, src in enumerate(d.args):
            if faults >> i & 1:
                raised = exc and src.source == "retval"
                values[i] = Raised(*exc.split(": ", 1)) if raised else FAULT
        args = plan.format(tuple(values)) if values else ""
        where = f"({caller}+{line} <- {func})" if d.is_return else f"({func}+{line})"
        return f"{d.event}: {where}{' ' + args if args else ''}"


def _full_name(text: str) -> str:
    d = parse_definition(text)
    return d.full_name if isinstance(d, ProbeDefinition) else text


__all__ = ["DynamicEvents", "ErrorLog", "FilterSyntaxError", "ProbeError", "ProbeEvent",
           "ProbeFormatter", "ProbeSyntaxError"]
