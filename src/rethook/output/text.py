"""ftrace's text views of a trace: the ``function`` and ``function_graph`` formats.

The same renderers serve the live ``trace`` and ``trace_pipe`` files, ``rethook report`` (from
a trace file) and ``rethook stream``. They take events already merged by timestamp, one at a
time, and keep only what a streaming reader can: per thread, the entry that may still turn out
to be a leaf (``func();``) and the stack of entries printed so far (to print ``}`` or, when the
entry was not seen, ``} /* func */``).

Where the kernel prints a CPU number, rethook prints the thread's index in order of first
appearance, and where it prints a task's comm-pid, the thread's name and native id. A trace of
several processes shows where it goes from one to another as the kernel shows a context switch
on a CPU (function_graph's ``=>`` block), and the function tracer's lines carry the process id
as with the kernel's ``record-tgid`` option.

On a colour terminal the renderers take ``paint``: escape sequences to put around duration
marks (by mark) and around lost events and exceptions (:data:`PAINTED`); without it, the text
is the kernel's, character for character.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rethook.buffer.events import COMMON_COUNT, FormatRegistry, Lost
from rethook.output.durations import graph_duration, mark
from rethook.printable import printable
from rethook.tracers.formats import EXIT_RAISED

FLAG_UNFINISHED = 1
FLAG_CLOSED = 2

#: What ``paint`` may colour besides the duration marks (MARK_STYLES), and the rich styles.
PAINTED: dict[str, str] = {"lost": "bold red", "raised": "red"}

#: ``{what: (before, after)}``: escape sequences around a mark's duration ("+", "!", ...),
#: a ``[LOST n EVENTS]`` line ("lost"), an exception's result ("raised").
Paint = dict[str, tuple[str, str]]
INDENT = 2  # TRACE_GRAPH_INDENT
PROCINFO_LENGTH = 14  # TRACE_GRAPH_PROCINFO_LENGTH
COMM_LEN = 16  # TASK_COMM_LEN


class Threads:
    """Thread ids to the short index shown in the CPU column, to names, and to the process
    they belong to (``pids``, when the trace has several processes)."""

    def __init__(self, names: dict[int, str] | None = None,
                 pids: dict[int, int] | None = None) -> None:
        self.names = dict(names or {})
        self.pids = pids if pids is not None else {}
        self.index: dict[int, int] = {}

    @property
    def processes(self) -> int:
        return len(set(self.pids.values()))

    def of(self, tid: int) -> int:
        i = self.index.get(tid)
        if i is None:
            i = self.index[tid] = len(self.index)
        return i

    def name(self, tid: int) -> str:
        """The thread's name, escaped (it is the program's text)."""
        return printable(self.names.get(tid, "<...>"))


def seconds(ts_ns: int) -> str:
    """``%5llu.%06lu``: seconds and microseconds, as in the kernel's timestamps."""
    secs, rem = divmod(max(0, ts_ns), 1_000_000_000)
    return f"{secs:5d}.{rem // 1000:06d}"


def context(threads: Threads, tid: int, ts_ns: int, tgid: bool = False) -> str:
    """The ``comm-pid [cpu] timestamp:`` prefix of an event line (trace_print_context), with
    the process id (``(tgid)``) when ``tgid``."""
    comm = threads.name(tid)[:COMM_LEN]
    proc = ""
    if tgid:
        pid = threads.pids.get(tid)
        proc = f"({pid:>7d}) " if pid is not None else "(-------) "
    return f"{comm:>16}-{tid:<7d} {proc}[{threads.of(tid):03d}] {seconds(ts_ns)}: "


def function_header(tracer: str, entries: int, written: int, nthreads: int,
                    tgid: bool = False) -> str:
    if tgid:
        columns = ("#           TASK-PID     TGID     CPU#     TIMESTAMP  FUNCTION\n"
                   "#              | |         |         |         |         |\n")
    else:
        columns = ("#           TASK-PID     CPU#     TIMESTAMP  FUNCTION\n"
                   "#              | |         |         |         |\n")
    return (f"# tracer: {printable(tracer)}\n#\n"
            f"# entries-in-buffer/entries-written: {entries}/{written}   #P:{nthreads}\n#\n"
            + columns)


def switch_lines(threads: Threads, prev_tid: int, tid: int) -> list[str]:
    """The block function_graph prints where the trace goes from one process to another: the
    kernel's context-switch lines (verif_pid), ``comm-pid => comm-pid``."""
    rule = " ------------------------------------------"
    return [rule, f" {threads.of(tid)}) {_proc(threads, prev_tid)} => {_proc(threads, tid)}",
            rule, ""]


def graph_header(opts: dict[str, bool], tracer: str = "function_graph") -> str:
    """The function_graph header for the columns the options turn on."""
    line1, line2 = "#", "#"
    if opts.get("funcgraph-abstime"):
        line1 += "     TIME       "
        line2 += "      |         "
    if opts.get("funcgraph-cpu", True):
        line1 += " CPU"
        line2 += " |  "
    if opts.get("funcgraph-proc"):
        line1 += "  TASK/PID       "
        line2 += "   |    |      "
    if opts.get("funcgraph-duration", True):
        line1 += "  DURATION   "
        line2 += "   |   |      "
    line1 += "               FUNCTION CALLS\n"
    line2 += "               |   |   |   |\n"
    return f"# tracer: {printable(tracer)}\n#\n{line1}{line2}"


def _proc(threads: Threads, tid: int) -> str:
    text = f"{threads.name(tid)[:7]}-{tid}"
    spaces = max(0, PROCINFO_LENGTH - len(text))
    return " " * (spaces // 2) + text + " " * (spaces - spaces // 2)


class _Renderer:
    """What both renderers keep: the trace's formats, threads and options, and how to print
    events that are not their tracer's own (probe events, stack traces)."""

    def __init__(self, formats: FormatRegistry, threads: Threads, opts: dict[str, bool],
                 t0: int = 0, describe: Callable[[Any, tuple], str] | None = None,
                 paint: Paint | None = None) -> None:
        self.formats = formats
        self.threads = threads
        self.opts = opts
        self.t0 = t0
        self.describe = describe or describe_event
        self.ids = {f.name: f.id for f in formats}
        self.paint = paint

    def _painted(self, what: str, text: str) -> str:
        style = self.paint.get(what) if self.paint else None
        return f"{style[0]}{text}{style[1]}" if style else text

    def _lost(self, ev: Lost) -> str:
        return self._painted("lost", f"CPU:{self.threads.of(ev.tid)} [LOST {ev.count} EVENTS]")

    def feed(self, ev: Any) -> Iterator[str]:
        raise NotImplementedError

    def feed_ahead(self, ev: Any, nxt: Any) -> Iterator[str]:
        """:meth:`feed` for a reader that also gives the next item of the event's thread
        (``TraceReader.ordered_events(lookahead=True)``; None at the thread's end)."""
        return self.feed(ev)


class GraphRenderer(_Renderer):
    """Streams function_graph lines (and other events as ``/* comments */``)."""

    def __init__(self, formats: FormatRegistry, threads: Threads, opts: dict[str, bool],
                 t0: int = 0, describe: Callable[[Any, tuple], str] | None = None,
                 paint: Paint | None = None) -> None:
        super().__init__(formats, threads, opts, t0, describe, paint)
        self.pending: dict[int, tuple] = {}  # tid -> entry that may be a leaf
        self.open: dict[int, list[tuple[int, str]]] = {}  # tid -> printed (depth, func)
        self.depth: dict[int, int] = {}  # tid -> depth of the last graph event (comments)
        self.shown: dict[int, tuple] = {}  # tid -> the exit of a leaf printed ahead of it
        ids = self.ids
        self.ENTRY = ids.get("funcgraph_entry")
        self.EXIT = ids.get("funcgraph_exit")
        self.SUSPEND = ids.get("funcgraph_suspend")
        self.RESUME = ids.get("funcgraph_resume")
        self.cpu_width = 1
        self._last_tid: int | None = None  # of the last event: a process switch shows

    def header(self) -> str:
        return graph_header(self.opts)

    def feed(self, ev: Any) -> Iterator[str]:
        if isinstance(ev, Lost):
            yield from self._flush_thread(ev.tid)
            yield self._lost(ev)
            return
        fid, tid = ev[0], ev[2]
        if self._last_tid != tid:
            yield from self._switch(tid)
        pending = self.pending.pop(tid, None)
        if pending is not None:
            if (fid == self.EXIT and ev[3] == pending[3] and ev[4] == pending[4]):
                yield self._leaf(pending, ev)
                return
            yield self._nested(pending)
        if fid == self.ENTRY:
            self.pending[tid] = ev
        elif fid == self.EXIT:
            yield self._exit(ev)
        elif fid == self.SUSPEND:
            yield self._suspend(ev)
        elif fid == self.RESUME:
            yield self._resume(ev)
        else:
            yield self._comment(ev)

    def feed_ahead(self, ev: Any, nxt: Any) -> Iterator[str]:
        """With the thread's next item known, an entry is printed when it is due, not when
        its thread's next event comes (which other threads' lines may precede): a leaf
        ``func();`` if that item is its own exit (whose line is then skipped), else
        ``func() {`` -- as the kernel's output peeks at the next event of the same CPU. So
        lines come out in the order of their events."""
        if isinstance(ev, Lost):
            return self.feed(ev)
        tid = ev[2]
        if self.shown.get(tid) is ev:
            del self.shown[tid]
            return iter(())
        if ev[0] != self.ENTRY:
            return self.feed(ev)
        lines = list(self._switch(tid)) if self._last_tid != tid else []
        if (nxt is not None and not isinstance(nxt, Lost) and nxt[0] == self.EXIT
                and nxt[3] == ev[3] and nxt[4] == ev[4]):
            self.shown[tid] = nxt
            lines.append(self._leaf(ev, nxt))
        else:
            lines.append(self._nested(ev))
        return iter(lines)

    def _switch(self, tid: int) -> Iterator[str]:
        """The next event is thread ``tid``'s: the process-switch block, if its process is
        not the last event's."""
        last, self._last_tid = self._last_tid, tid
        pids = self.threads.pids
        if last is not None and pids and pids.get(last) != pids.get(tid):
            yield from self._flush_thread(last)
            yield from switch_lines(self.threads, last, tid)

    def flush(self) -> Iterator[str]:
        for tid in list(self.pending):
            yield from self._flush_thread(tid)

    def _flush_thread(self, tid: int) -> Iterator[str]:
        pending = self.pending.pop(tid, None)
        if pending is not None:
            yield self._nested(pending)

    # --- line pieces ------------------------------------------------------------------------
    def _prologue(self, ts: int, tid: int) -> str:
        out = ""
        if self.opts.get("funcgraph-abstime"):
            out += f"{seconds(ts - self.t0)} |  "
        if self.opts.get("funcgraph-cpu", True):
            idx = self.threads.of(tid)
            self.cpu_width = max(self.cpu_width, len(str(idx)))
            out += f" {idx:>{self.cpu_width}d}) "
        if self.opts.get("funcgraph-proc"):
            out += _proc(self.threads, tid) + " | "
        return out

    def _duration(self, duration: int | None) -> str:
        if not self.opts.get("funcgraph-duration", True):
            return ""
        if duration is None:
            return "              |  "
        if not self.opts.get("funcgraph-overhead", True):
            return f"  {graph_duration(duration)}|  "
        sym = mark(duration)
        if self.paint and sym in self.paint:
            text = graph_duration(duration)
            spaces = len(text) - len(text.rstrip())
            return self._painted(sym, f"{sym} {text.rstrip()}") + " " * spaces + "|  "
        return f"{sym} {graph_duration(duration)}|  "

    def _nested(self, ev: tuple) -> str:
        _, ts, tid, depth, func, args = ev
        self.open.setdefault(tid, []).append((depth, func))
        self.depth[tid] = depth + 1
        return (f"{self._prologue(ts, tid)}{self._duration(None)}{' ' * (depth * INDENT)}"
                f"{printable(func)}({printable(args)}) {{")

    def _leaf(self, entry: tuple, ev: tuple) -> str:
        _, ts, tid, depth, func, args = entry
        calltime, overrun, flags, retval = ev[5], ev[6], ev[8], ev[9]
        self.depth[tid] = depth
        line = (f"{self._prologue(ts, tid)}{self._duration(ev[1] - calltime)}"
                f"{' ' * (depth * INDENT)}{printable(func)}({printable(args)});"
                f"{self._result(flags, retval, None)}")
        return line + self._overrun(overrun)

    def _exit(self, ev: tuple) -> str:
        _, ts, tid, depth, func, calltime, overrun, _sleep, flags, retval = ev
        stack = self.open.get(tid)
        matched = False
        if stack:
            # The entry was printed if it is on this thread's stack at this depth; entries of
            # calls that never returned visibly (lost events) are dropped down to it.
            while stack and stack[-1][0] > depth:
                stack.pop()
            if stack and stack[-1] == (depth, func):
                stack.pop()
                matched = True
        self.depth[tid] = depth
        tail = self.opts.get("funcgraph-tail") or not matched
        close = self._result(flags, retval, func)  # with a result, the kernel names the func
        if not close:
            close = " /* " + printable(func) + " */" if tail else ""
        return (f"{self._prologue(ts, tid)}{self._duration(ts - calltime)}"
                f"{' ' * (depth * INDENT)}}}{close}{self._overrun(overrun)}")

    def _result(self, flags: int, retval: str, func: str | None) -> str:
        """``/* = value */`` (leaf) or ``/* func = value */`` (close), or '' if nothing."""
        if flags & FLAG_UNFINISHED:
            what = "unfinished"
        elif flags & FLAG_CLOSED:
            what = "closed"
        elif flags & EXIT_RAISED and retval:
            what = f"raised {printable(retval)}"
        elif flags & EXIT_RAISED:
            what = "raised"
        elif retval:
            what = f"= {printable(retval)}"
        else:
            return ""
        if func is None:  # a leaf: func(); /* ... */
            text = f" /* {what} */"
        else:
            text = f" /* {printable(func)} {what} */"
        return self._painted("raised", text) if flags & EXIT_RAISED else text

    def _overrun(self, overrun: int) -> str:
        return f" (Overruns: {overrun})" if self.opts.get("funcgraph-overrun") else ""

    def _suspend(self, ev: tuple) -> str:
        _, ts, tid, depth, func = ev
        stack = self.open.get(tid)
        if stack and stack[-1] == (depth, func):
            stack.pop()
        self.depth[tid] = depth
        return (f"{self._prologue(ts, tid)}{self._duration(None)}{' ' * (depth * INDENT)}"
                f"}} /* {printable(func)} suspended */")

    def _resume(self, ev: tuple) -> str:
        _, ts, tid, depth, func = ev
        self.open.setdefault(tid, []).append((depth, func))
        self.depth[tid] = depth + 1
        return (f"{self._prologue(ts, tid)}{self._duration(None)}{' ' * (depth * INDENT)}"
                f"{printable(func)}() {{ /* resumed */")

    def _comment(self, ev: tuple) -> str:
        tid = ev[2]
        text = printable(self.describe(self.formats.get(ev[0]), ev).replace("\n", " "))
        depth = self.depth.get(tid, 0)
        return (f"{self._prologue(ev[1], tid)}{self._duration(None)}{' ' * (depth * INDENT)}"
                f"/* {text} */")


def describe_event(fmt: Any, ev: tuple) -> str:
    """Default text of an event without a renderer of its own: ``name: field=value ...``."""
    if fmt is None:
        return f"unknown event {ev[0]}"
    if fmt.name == "kernel_stack":
        return "<stack trace>\n" + "\n".join(f" => {printable(f)}" for f in ev[3].split("\n"))
    if fmt.name == "print":
        return printable(ev[3])
    values = fmt.values(ev)
    return printable(f"{fmt.name}: " + " ".join(f"{k}={v}" for k, v in values.items()))


class FunctionRenderer(_Renderer):
    """Streams ``function`` tracer lines: ``comm-pid [cpu] ts: func <-parent``."""

    def __init__(self, formats: FormatRegistry, threads: Threads, opts: dict[str, bool],
                 t0: int = 0, describe: Callable[[Any, tuple], str] | None = None,
                 paint: Paint | None = None) -> None:
        super().__init__(formats, threads, opts, t0, describe, paint)
        self.FUNC = self.ids.get("function")
        self.stats = (0, 0)

    def header(self, tracer: str = "function") -> str:
        entries, written = self.stats
        return function_header(tracer, entries, written, max(1, len(self.threads.names)),
                               tgid=self.threads.processes > 1)

    def feed(self, ev: Any) -> Iterator[str]:
        if isinstance(ev, Lost):
            yield self._lost(ev)
            return
        fid, ts, tid = ev[0], ev[1], ev[2]
        prefix = context(self.threads, tid, ts - self.t0, self.threads.processes > 1)
        if fid == self.FUNC:
            func, parent, line = ev[COMMON_COUNT:]
            func, parent = printable(func), printable(parent)
            if not self.opts.get("print-parent", True) or not parent:
                yield prefix + func
            elif self.opts.get("sym-offset"):
                yield f"{prefix}{func} <-{parent}+{line}"
            else:
                yield f"{prefix}{func} <-{parent}"
        else:
            yield prefix + self.describe(self.formats.get(fid), ev)

    def flush(self) -> Iterator[str]:
        return iter(())


Describe = Callable[[Any, tuple], "str | None"]


def describer(*extra: Describe) -> Callable[[Any, tuple], str]:
    """The text of an event: the first of ``extra`` that knows it (probe events), else
    :func:`describe_event`."""

    def describe(fmt: Any, ev: tuple) -> str:
        for fn in extra:
            text = fn(fmt, ev)
            if text is not None:
                return printable(text)
        return describe_event(fmt, ev)

    return describe


def probe_describer(probes: dict[str, str] | None) -> Callable[[Any, tuple], str]:
    """How a trace's probe events print, from their definitions (kept in its META)."""
    if probes:
        from rethook.probes.events import ProbeFormatter

        try:
            return describer(ProbeFormatter(probes).describe)
        except Exception:  # noqa: BLE001 - a definition this version cannot parse: raw fields
            pass
    return describer()


def renderer_for(tracer: str, formats: FormatRegistry, threads: Threads,
                 opts: dict[str, bool], t0: int = 0,
                 describe: Callable[[Any, tuple], str] | None = None,
                 paint: Paint | None = None) -> GraphRenderer | FunctionRenderer:
    describe = describe or describe_event
    if tracer == "function_graph":
        return GraphRenderer(formats, threads, opts, t0, describe, paint)
    return FunctionRenderer(formats, threads, opts, t0, describe, paint)


def render(tracer: str, events: Iterable[Any], formats: FormatRegistry,
           thread_names: dict[int, str], opts: dict[str, bool], t0: int = 0,
           stats: tuple[int, int] = (0, 0), header: bool = True,
           describe: Callable[[Any, tuple], str] | None = None,
           lookahead: bool = False) -> Iterator[str]:
    """Every line of a trace's text view, header first (no trailing newlines). With
    ``lookahead``, ``events`` are pairs of an event and the next one of its thread (see
    ``feed_ahead``)."""
    threads = Threads(thread_names)
    r = renderer_for(tracer, formats, threads, opts, t0, describe)
    if isinstance(r, FunctionRenderer):
        r.stats = stats
        head = r.header(tracer)
    else:
        head = r.header()
    if header:
        yield from head.rstrip("\n").split("\n")
    if lookahead:
        for ev, nxt in events:
            yield from r.feed_ahead(ev, nxt)
    else:
        for ev in events:
            yield from r.feed(ev)
    yield from r.flush()


def stat_table(stats: list[Any], width: int = 30) -> str:
    """``trace_stat/function*`` text: the kernel's layout, with a name column as wide as the
    longest name (Python's dotted names would be useless cut at the kernel's 30)."""
    names = [printable(s.name) for s in stats]  # the program's names: escaped
    width = max(width, *map(len, names)) if stats else width
    head = f"  {'Function':<{width}}  {'Hit':>10}    Time            Avg             s^2\n"
    rule = f"  {'--------':<{width}}  {'---':>10}    ----            ---             ---\n"
    lines = [head, rule]
    for s, name in zip(stats, names, strict=True):
        lines.append(f"  {name:<{width}}  {s.hit:>10}    {graph_duration(s.time_ns)}    "
                     f"{graph_duration(int(s.avg_ns))}    {graph_duration(int(s.s2_ns / 1000))}\n")
    return "".join(lines)
