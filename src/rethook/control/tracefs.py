"""The control surface: an in-process tracefs, read and written as text like ``cat``/``echo``.

::

    fs = Tracefs()
    fs.write("set_ftrace_filter", "json.*")          # echo 'json.*' > set_ftrace_filter
    fs.write("set_ftrace_filter", "re.*", append=True)  # echo 're.*' >> set_ftrace_filter
    fs.write("current_tracer", "function_graph")
    ...
    print(fs.read("trace"))                           # cat trace
    fs.write("tracing_on", "0")

Every entry carries its tracefs name, and reads and writes text the way the kernel's files do
(``0``/``1``, microseconds for ``tracing_thresh``, ``!`` and commands in the filter files,
``noNAME`` in ``trace_options``, an empty write to ``trace`` clears the buffer). Bad input
raises :class:`TracefsError` naming the file and what was wrong with the text.
"""

from __future__ import annotations

from rethook import limits
from rethook.buffer.ring import TracePipe
from rethook.engine.core import notrace
from rethook.engine.filters import FilterError, FunctionFilter
from rethook.engine.registry import is_own_module
from rethook.probes.dynamic import DynamicEvents, ProbeError
from rethook.tracers import TRACERS
from rethook.tracers.base import OptionError, TraceContext, Tracer
from rethook.tracers.commands import Commands

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from rethook.probes.events import ProbeEvent
    from rethook.tracers.profiler import FunctionProfiler, FunctionStat

# The text views (rethook.output), the probe machinery (rethook.probes.events, loaded by
# the first definition written) and the function profiler are imported where they are used:
# recording a trace needs none of them, and the command line's start-up is a cost every run
# pays.


class TracefsError(ValueError):
    """A write a tracefs file refuses: names the file and the offending input."""

    def __init__(self, path: str, text: str, message: str) -> None:
        self.path = path
        self.text = text
        super().__init__(f"{path}: {message}")


def _int(path: str, text: str, bounds: tuple[int, int]) -> int:
    """A decimal integer within ``bounds`` (the file's range, from :mod:`rethook.limits`)."""
    try:
        return limits.checked_int(text, bounds)
    except limits.NumberError as e:
        raise TracefsError(path, text, str(e)) from None


def _bool(path: str, text: str) -> bool:
    word = text.strip()
    if word not in ("0", "1"):
        raise TracefsError(path, text, f"expected 0 or 1, got {word!r}")
    return word == "1"


class Tracefs:
    """One trace instance, with the tracefs files as its interface."""

    def __init__(self, ctx: TraceContext | None = None) -> None:
        self.ctx = ctx or TraceContext()
        self.tracer: Tracer = TRACERS["nop"]()
        self.commands = Commands(self.ctx, dump=lambda: self.read("trace"))
        self._profiler: FunctionProfiler | None = None  # (made by the first use: profiler)
        self.dynamic = DynamicEvents(self.ctx)
        self._pipe: TracePipe | None = None
        self._pipe_renderer = None
        self._files: dict[str, tuple[Callable[[], str] | None,
                                     Callable[[str, bool], None] | None]] = {
            "current_tracer": (lambda: self.tracer.name + "\n", self._write_tracer),
            "available_tracers": (lambda: " ".join(TRACERS) + "\n", None),
            "available_filter_functions": (self._read_functions, None),
            "enabled_functions": (self._read_enabled, None),
            "set_ftrace_filter": (lambda: self.ctx.ftrace_filter.read_filter(),
                                  lambda t, a: self._write_filter("set_ftrace_filter", t, a)),
            "set_ftrace_notrace": (lambda: self.ctx.ftrace_filter.read_notrace(),
                                   lambda t, a: self._write_filter("set_ftrace_notrace", t, a)),
            "set_graph_function": (lambda: self.ctx.graph_function.read_filter(),
                                   lambda t, a: self._write_graph("set_graph_function", t, a)),
            "set_graph_notrace": (lambda: self.ctx.graph_notrace.read_filter(),
                                  lambda t, a: self._write_graph("set_graph_notrace", t, a)),
            "max_graph_depth": (lambda: f"{self.ctx.max_graph_depth}\n", self._write_depth),
            "tracing_thresh": (lambda: f"{self.ctx.tracing_thresh_ns // 1000}\n",
                               self._write_thresh),
            "tracing_on": (lambda: f"{int(self.ctx.buffer.tracing_on)}\n", self._write_on),
            "buffer_size_kb": (lambda: f"{self.ctx.buffer.size_kb}\n", self._write_size),
            "trace_options": (lambda: self.ctx.options.read(), self._write_options),
            "trace": (self._read_trace, self._write_trace),
            "function_profile_enabled": (lambda: f"{int(self.profiler.enabled)}\n",
                                         self._write_profile),
            "dynamic_events": (lambda: self.dynamic.read(),
                               lambda t, a: self._write_events("dynamic_events", t, a, "pfr")),
            "kprobe_events": (lambda: self.dynamic.read("pr"),
                              lambda t, a: self._write_events("kprobe_events", t, a, "pr")),
            "kprobe_profile": (lambda: self.dynamic.profile(), None),
            "error_log": (lambda: self.dynamic.error_log.read(),
                          lambda t, a: self.dynamic.error_log.clear()),
            "events/enable": (lambda: self._read_enable(list(self.dynamic.events.values())),
                              lambda t, a: self._write_enable("events/enable", t,
                                                              list(self.dynamic.events.values()))),
        }

    @property
    def profiler(self) -> FunctionProfiler:
        """The function profiler (``function_profile_enabled``, ``trace_stat``)."""
        if self._profiler is None:
            from rethook.tracers.profiler import FunctionProfiler

            self._profiler = FunctionProfiler()
        return self._profiler

    def _profiling(self) -> bool:
        return self._profiler is not None and self._profiler.enabled

    # --- the file interface ---------------------------------------------------------------
    def listdir(self) -> list[str]:
        names = list(self._files) + ["trace_pipe"]
        names += [f"options/{name}" for name in self.ctx.options.names()]
        names += [f"trace_stat/function{i}" for i in range(len(self._profile_threads()))]
        for group, events in self.dynamic.groups().items():
            names.append(f"events/{group}/enable")
            for e in events:
                names += [f"events/{group}/{e.name}/{leaf}" for leaf in self.EVENT_FILES]
        return sorted(names)

    def read(self, path: str, timeout: float | None = 0.0) -> str:
        """``cat path``. ``trace_pipe`` consumes, waiting up to ``timeout`` s for events."""
        with notrace():
            return self._read(path, timeout)

    def _read(self, path: str, timeout: float | None) -> str:
        path = path.strip("/")
        if path == "trace_pipe":
            return "".join(line + "\n" for line in self.pipe_lines(timeout))
        if path.startswith("options/"):
            return f"{int(self._option(path))}\n"
        if path.startswith("trace_stat/function"):
            return self._read_stat(path)
        if path.startswith("events/") and path != "events/enable":
            return self._event_file(path, None)
        reader, _ = self._entry(path)
        if reader is None:
            raise TracefsError(path, "", "is write-only")
        return reader()

    def write(self, path: str, text: str, append: bool = False) -> None:
        """``echo text > path`` (or ``>>`` with ``append``)."""
        with notrace():
            self._write(path, text, append)

    def _write(self, path: str, text: str, append: bool) -> None:
        path = path.strip("/")
        try:
            if path.startswith("options/"):
                self._option(path)
                self._set_options({path[len("options/"):]: _bool(path, text)})
                return
            if path.startswith("events/") and path != "events/enable":
                self._event_file(path, text)
                return
            _, writer = self._entry(path)
            if writer is None:
                raise TracefsError(path, text, "is read-only")
            writer(text, append)
        except TracefsError:
            raise
        except Exception as e:  # noqa: BLE001 - the writer undid what it did; say why here
            raise TracefsError(path, text, f"{type(e).__name__}: {e}") from e

    cat = read

    def echo(self, text: str, path: str, append: bool = False) -> None:
        self.write(path, text, append)

    def __getitem__(self, path: str) -> str:
        return self.read(path)

    def __setitem__(self, path: str, text: str) -> None:
        self.write(path, text)

    def _entry(self, path: str):
        try:
            return self._files[path]
        except KeyError:
            raise TracefsError(path, "", "no such file (see listdir())") from None

    # --- trace and trace_pipe -------------------------------------------------------------
    def _read_trace(self) -> str:
        from rethook.output.text import render

        buf = self.ctx.buffer
        totals = buf.totals()
        lines = render(self.tracer.name, buf.iter_trace(lookahead=True), self.ctx.formats,
                       buf.threads(), self.ctx.options.as_dict(),
                       stats=(totals.entries, totals.written), describe=self.describe(),
                       lookahead=True)
        return "".join(line + "\n" for line in lines)

    def _write_trace(self, text: str, append: bool) -> None:
        if text.strip():
            raise TracefsError("trace", text, "only an empty write (clear) is accepted")
        self.ctx.buffer.clear()

    def pipe_lines(self, timeout: float | None = 0.0) -> Iterator[str]:
        """``cat trace_pipe``: consume what is there (waiting up to ``timeout`` for it)."""
        with notrace():
            return list(self._pipe_lines(timeout))

    def _pipe_lines(self, timeout: float | None) -> Iterator[str]:
        if self._pipe is None:
            from rethook.output.text import Threads, renderer_for

            self._pipe = self.ctx.buffer.pipe()
            self._pipe_renderer = renderer_for(self.tracer.name, self.ctx.formats,
                                               Threads(self.ctx.buffer.threads()),
                                               self.ctx.options.as_dict(),
                                               describe=self.describe())
        r = self._pipe_renderer
        r.threads.names.update(self.ctx.buffer.threads())
        for item in self._pipe.read(timeout):
            yield from r.feed(item)
        yield from r.flush()

    # --- tracers, filters and settings ----------------------------------------------------
    def _write_tracer(self, text: str, append: bool) -> None:
        name = text.strip()
        if name not in TRACERS:
            raise TracefsError("current_tracer", text,
                               f"unknown tracer {name!r} (available: {' '.join(TRACERS)})")
        self.set_tracer(name)

    def set_tracer(self, name: str) -> None:
        """Switch tracers; as in the kernel, the buffer starts empty for the new one. If the
        new one cannot start, the old one runs again and the error is raised: the file never
        names a tracer that is not running."""
        old = self.tracer
        old.stop()
        self.ctx.buffer.clear()
        self._pipe = None
        new = TRACERS[name]()
        try:
            new.start(self.ctx)
        except BaseException:
            self.tracer = TRACERS["nop"]()  # what runs if the old one cannot start either
            old.start(self.ctx)
            self.tracer = old
            raise
        self.tracer = new

    def _write_filter(self, path: str, text: str, append: bool) -> None:
        f = self.ctx.ftrace_filter
        saved = f.snapshot()
        try:
            if path == "set_ftrace_filter":
                f.write_filter(text, append=append)
            else:
                f.write_notrace(text, append=append)
        except FilterError as e:
            raise TracefsError(path, text, str(e)) from e
        unsupported = [c for c in f.commands if c.command not in Commands.SUPPORTED]
        if unsupported:
            f.restore(saved)
            cmd = unsupported[0]
            at = text.find(":" + cmd.command, cmd.position) + 1
            message = (f"command {cmd.command!r} is not supported here "
                       f"(supported: {', '.join(Commands.SUPPORTED)})")
            raise TracefsError(path, text, str(FilterError(message, text, at)))
        try:
            self.commands.sync()
            self._refilter()
        except BaseException:
            f.restore(saved)
            self.commands.sync()
            self._refilter()
            raise

    def _write_graph(self, path: str, text: str, append: bool) -> None:
        f: FunctionFilter = (self.ctx.graph_function if path == "set_graph_function"
                             else self.ctx.graph_notrace)
        saved = f.snapshot()
        try:
            f.write_filter(text, append=append)
        except FilterError as e:
            raise TracefsError(path, text, str(e)) from e
        self._restarted(lambda: f.restore(saved))

    def _refilter(self) -> None:
        ops = getattr(self.tracer, "ops", None)
        if ops is not None:
            self.ctx.engine.update(ops)
        if self._profiler is not None and self._profiler.ops is not None:
            self.ctx.engine.update(self._profiler.ops)

    def _restart(self) -> None:
        """Settings tracers read when they start: restart the current one to apply them.
        One that cannot start is not left named: ``nop`` (or the profiler off) instead."""
        if self.tracer.name != "nop":
            self.tracer.stop()
            try:
                self.tracer.start(self.ctx)
            except BaseException:
                self.tracer = TRACERS["nop"]()
                raise
        if self._profiling():
            self.profiler.stop()
            self.profiler.start(self.ctx)

    def _restarted(self, undo: Callable[[], None]) -> None:
        """:meth:`_restart` after a settings change; if that fails, ``undo`` the change and
        restart as things were (the error is raised either way)."""
        tracer, profiling = self.tracer, self._profiling()
        try:
            self._restart()
        except BaseException:
            undo()
            self.tracer = tracer
            self._restart()  # as things were (nop if even that fails)
            if profiling and not self._profiling():
                self.profiler.start(self.ctx)
            raise

    def _set_ctx(self, name: str, value: int) -> None:
        """Set a TraceContext setting that tracers read when they start, then restart them."""
        old = getattr(self.ctx, name)
        setattr(self.ctx, name, value)
        self._restarted(lambda: setattr(self.ctx, name, old))

    def _write_depth(self, text: str, append: bool) -> None:
        self._set_ctx("max_graph_depth", _int("max_graph_depth", text, limits.MAX_GRAPH_DEPTH))

    def _write_thresh(self, text: str, append: bool) -> None:
        usecs = _int("tracing_thresh", text, limits.TRACING_THRESH_US)
        self._set_ctx("tracing_thresh_ns", usecs * 1000)

    def _write_on(self, text: str, append: bool) -> None:
        self.ctx.buffer.tracing_on = _bool("tracing_on", text)

    def _write_size(self, text: str, append: bool) -> None:
        kb = _int("buffer_size_kb", text, limits.BUFFER_KB)
        # A thread's buffer (made when the thread first records), and as much again for
        # reading it out into a file, must fit in the memory there is.
        free = limits.memory_available()
        if free is not None and 2 * kb * 1024 > free:
            raise TracefsError("buffer_size_kb", text,
                               f"{kb} KiB per thread is more memory than can be had: a "
                               f"thread's buffer and its writing out need twice that, and "
                               f"{free // 1024} KiB are available")
        self.ctx.buffer.resize(kb)

    def _option(self, path: str) -> bool:
        try:
            return self.ctx.options[path[len("options/"):]]
        except OptionError as e:
            raise TracefsError(path, "", str(e)) from None

    def _write_options(self, text: str, append: bool) -> None:
        changes: dict[str, bool] = {}
        names = self.ctx.options.names()
        for word in text.split():  # every word checked before any is applied
            name = word[2:] if word.startswith("no") and word[2:] in names else word
            if name not in names:
                raise TracefsError("trace_options", text, f"unknown option {word!r}")
            changes[name] = name == word
        self._set_options(changes)

    def _set_options(self, changes: dict[str, bool]) -> None:
        """Set options together; restart the tracers once if one of them reads any."""
        opts = self.ctx.options
        old = {name: opts[name] for name in changes}

        def put(values: dict[str, bool]) -> None:
            for name, value in values.items():
                opts.set(name, value)
            if "overwrite" in values:
                self.ctx.buffer.overwrite = values["overwrite"]

        put(changes)
        read = {*getattr(self.tracer, "uses_options", ()), "graph-time", "sleep-time"}
        if read.intersection(changes):
            self._restarted(lambda: put(old))

    # --- probe events --------------------------------------------------------------------
    EVENT_FILES = ("enable", "filter", "trigger", "format", "hist")

    def describe(self):
        """How this instance's events print (probe events in the kernel's shape)."""
        from rethook.output.text import describer

        return describer(self.dynamic.formatter().describe)

    def _write_events(self, path: str, text: str, append: bool, only: str) -> None:
        from rethook.probes.fetch import ProbeSyntaxError

        try:
            self.dynamic.write(text, append=append, only=only)
        except (ProbeSyntaxError, ProbeError) as e:
            raise TracefsError(path, text, self._log_text(e)) from e

    @staticmethod
    def _log_text(e: Exception) -> str:
        log = getattr(e, "log_entry", None)
        return log().rstrip("\n") if callable(log) else str(e)

    def _event_file(self, path: str, text: str | None) -> str:
        parts = path.split("/")
        if len(parts) == 3 and parts[2] == "enable":  # events/GRP/enable
            events = self.dynamic.groups().get(parts[1])
            if events is None:
                raise TracefsError(path, text or "", "no such event group")
            if text is None:
                return self._read_enable(events)
            self._write_enable(path, text, events)
            return ""
        if len(parts) != 4 or parts[3] not in self.EVENT_FILES:
            raise TracefsError(path, text or "", "no such file (see listdir())")
        event = self.dynamic.get(parts[1], parts[2])
        if event is None:
            raise TracefsError(path, text or "", f"no event {parts[1]}/{parts[2]}")
        from rethook.probes.evfilter import FilterSyntaxError  # loaded with the event

        leaf = parts[3]
        if text is None:
            return {"enable": lambda: f"{int(event.enabled)}\n",
                    "filter": event.read_filter, "trigger": event.read_trigger,
                    "format": event.format_text, "hist": event.read_hist}[leaf]()
        try:
            if leaf == "enable":
                self._write_enable(path, text, [event])
            elif leaf == "filter":
                event.write_filter(text)
            elif leaf == "trigger":
                event.write_trigger(text)
            else:
                raise TracefsError(path, text, "is read-only")
        except FilterSyntaxError as e:
            self.dynamic.error_log.add(str(e))
            raise TracefsError(path, text, str(e)) from e
        return ""

    def _read_enable(self, events: list[ProbeEvent]) -> str:
        states = {e.enabled for e in events}
        return "X\n" if len(states) > 1 else f"{int(states.pop()) if states else 0}\n"

    def _write_enable(self, path: str, text: str, events: list[ProbeEvent]) -> None:
        on = _bool(path, text)
        for e in events:
            e.enable() if on else e.disable()

    # --- listings and the profiler --------------------------------------------------------
    def _read_functions(self) -> str:
        return "".join(f"{info.name}\n" for info in self.ctx.registry.functions()
                       if not is_own_module(info.module))

    def _read_enabled(self) -> str:
        lines = []
        for info, entry_users, graph_users in self.ctx.engine.enabled_functions():
            flags = " R" if graph_users else ""
            lines.append(f"{info.name} ({entry_users + graph_users}){flags}\n")
        return "".join(lines)

    def _write_profile(self, text: str, append: bool) -> None:
        if _bool("function_profile_enabled", text):
            self.profiler.start(self.ctx)
        else:
            self.profiler.stop()

    def _profile_threads(self) -> list[int]:
        ops = self.profiler.last
        return ops.threads() if ops is not None else []

    def _read_stat(self, path: str) -> str:
        tids = self._profile_threads()
        index = limits.parse_digits(path[len("trace_stat/function"):], 10, len(tids) - 1)
        if index is None:
            raise TracefsError(path, "", "no such file (see listdir())")
        ops = self.profiler.last
        from rethook.output.text import stat_table

        return stat_table(ops.stats(self.ctx.name, tids[index]))

    def function_locations(self, named: Callable[[str], bool]) -> dict[str, list]:
        """``{name: [file, line, qualname]}`` of the known functions whose name ``named``
        accepts (a trace's META ``functions``: where the functions it names are defined)."""
        with notrace():  # (a trace names only registered functions: nothing to scan for)
            infos = [info for info in self.ctx.registry.registered() if named(info.name)]
            infos.sort(key=lambda info: info.name)
            return {info.name: [info.filename, info.firstlineno, info.qualname]
                    for info in infos}

    def profile_stats(self) -> list[FunctionStat]:
        """All threads' profiles merged, with each function's callers (what ``rethook
        profile`` prints)."""
        with notrace():
            ops = self.profiler.last
            return ops.stats(self.ctx.name) if ops is not None else []

    def check_hook(self) -> str | None:
        """Whether another tool took the hook from under the trace (the program freed
        rethook's tool id, or changed its events: ``Engine.check_hook``). When it has,
        tracing stops: what the hook delivers after that may be calls entered and never
        left. Returns what happened, or None."""
        lost = self.ctx.engine.check_hook()
        if lost is not None:
            self.ctx.buffer.tracing_on = False
        return lost

    def close(self) -> None:
        """Stop everything this instance registered (the buffer stays readable)."""
        with notrace():
            self._close()

    def _close(self) -> None:
        self.tracer.stop()
        self.tracer = TRACERS["nop"]()
        self.commands.stop()
        if self._profiler is not None:
            self._profiler.stop()
        self.dynamic.stop()
