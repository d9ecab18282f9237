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

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rethook.buffer.ring import TracePipe
from rethook.engine.core import notrace
from rethook.engine.filters import FilterError, FunctionFilter
from rethook.engine.registry import is_own_module
from rethook.probes.dynamic import DynamicEvents, ProbeError
from rethook.tracers import TRACERS
from rethook.tracers.base import OptionError, TraceContext, Tracer
from rethook.tracers.commands import Commands
from rethook.tracers.profiler import FunctionProfiler, stat_table

if TYPE_CHECKING:
    from rethook.probes.events import ProbeEvent

# The text views (rethook.output) and the probe machinery (rethook.probes.events, loaded by
# the first definition written) are imported where they are used: recording a trace needs
# neither, and the command line's start-up is a cost every run pays.


class TracefsError(ValueError):
    """A write a tracefs file refuses: names the file and the offending input."""

    def __init__(self, path: str, text: str, message: str) -> None:
        self.path = path
        self.text = text
        super().__init__(f"{path}: {message}")


def _int(path: str, text: str, minimum: int = 0) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise TracefsError(path, text, f"expected an integer, got {text.strip()!r}") from None
    if value < minimum:
        raise TracefsError(path, text, f"must be at least {minimum}, got {value}")
    return value


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
        self.profiler = FunctionProfiler()
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
        if path.startswith("options/"):
            self._option(path)
            self._apply_option(path[len("options/"):], _bool(path, text))
            return
        if path.startswith("events/") and path != "events/enable":
            self._event_file(path, text)
            return
        _, writer = self._entry(path)
        if writer is None:
            raise TracefsError(path, text, "is read-only")
        writer(text, append)

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
        lines = render(self.tracer.name, buf.iter_trace(), self.ctx.formats, buf.threads(),
                       self.ctx.options.as_dict(), stats=(totals.entries, totals.written),
                       describe=self.describe())
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
        """Switch tracers; as in the kernel, the buffer starts empty for the new one."""
        self.tracer.stop()
        self.ctx.buffer.clear()
        self._pipe = None
        self.tracer = TRACERS[name]()
        self.tracer.start(self.ctx)

    def _write_filter(self, path: str, text: str, append: bool) -> None:
        f = self.ctx.ftrace_filter
        try:
            if path == "set_ftrace_filter":
                f.write_filter(text, append=append)
            else:
                f.write_notrace(text, append=append)
        except FilterError as e:
            raise TracefsError(path, text, str(e)) from e
        self.commands.sync()
        self._refilter()

    def _write_graph(self, path: str, text: str, append: bool) -> None:
        f: FunctionFilter = (self.ctx.graph_function if path == "set_graph_function"
                             else self.ctx.graph_notrace)
        try:
            f.write_filter(text, append=append)
        except FilterError as e:
            raise TracefsError(path, text, str(e)) from e
        self._restart()

    def _refilter(self) -> None:
        ops = getattr(self.tracer, "ops", None)
        if ops is not None:
            self.ctx.engine.update(ops)
        if self.profiler.ops is not None:
            self.ctx.engine.update(self.profiler.ops)

    def _restart(self) -> None:
        """Settings tracers read when they start: restart the current one to apply them."""
        if self.tracer.name != "nop":
            self.tracer.stop()
            self.tracer.start(self.ctx)
        if self.profiler.enabled:
            self.profiler.stop()
            self.profiler.start(self.ctx)

    def _write_depth(self, text: str, append: bool) -> None:
        self.ctx.max_graph_depth = _int("max_graph_depth", text)
        self._restart()

    def _write_thresh(self, text: str, append: bool) -> None:
        self.ctx.tracing_thresh_ns = _int("tracing_thresh", text) * 1000
        self._restart()

    def _write_on(self, text: str, append: bool) -> None:
        self.ctx.buffer.tracing_on = _bool("tracing_on", text)

    def _write_size(self, text: str, append: bool) -> None:
        self.ctx.buffer.resize(_int("buffer_size_kb", text, minimum=1))

    def _option(self, path: str) -> bool:
        try:
            return self.ctx.options[path[len("options/"):]]
        except OptionError as e:
            raise TracefsError(path, "", str(e)) from None

    def _write_options(self, text: str, append: bool) -> None:
        for word in text.split():
            name = word[2:] if word.startswith("no") and word[2:] in self.ctx.options.names() \
                else word
            if name not in self.ctx.options.names():
                raise TracefsError("trace_options", text, f"unknown option {word!r}")
            self._apply_option(name, name == word)

    def _apply_option(self, name: str, value: bool) -> None:
        self.ctx.options.set(name, value)
        if name == "overwrite":
            self.ctx.buffer.overwrite = value
        elif name in getattr(self.tracer, "uses_options", ()) or name in ("graph-time",
                                                                          "sleep-time"):
            self._restart()

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
        suffix = path[len("trace_stat/function"):]
        tids = self._profile_threads()
        if not suffix.isdigit() or int(suffix) >= len(tids):
            raise TracefsError(path, "", "no such file (see listdir())")
        ops = self.profiler.last
        return stat_table(ops.stats(self.ctx.name, tids[int(suffix)]))

    def profile_table(self) -> str:
        """All threads' profiles merged (what ``rethook profile`` prints)."""
        with notrace():
            ops = self.profiler.last
            return stat_table(ops.stats(self.ctx.name) if ops is not None else [])

    def close(self) -> None:
        """Stop everything this instance registered (the buffer stays readable)."""
        with notrace():
            self._close()

    def _close(self) -> None:
        self.tracer.stop()
        self.tracer = TRACERS["nop"]()
        self.commands.stop()
        self.profiler.stop()
        self.dynamic.stop()
