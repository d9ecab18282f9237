"""trace-cmd's record flags as data (:class:`TraceSettings`), and how they become writes to a
:class:`~rethook.control.tracefs.Tracefs` (:func:`configure`), with the default filter: the
program's own code.

Followed child processes get the same settings (:meth:`TraceSettings.to_json`), with the
filter the parent resolved: a child traces what its parent traces.
"""

from __future__ import annotations

import sys

from rethook import jsontext
from rethook.control.tracefs import Tracefs
from rethook.runner.program import Program, prepare_package

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class TraceSettings:
    """trace-cmd's record flags, as data: keyword arguments named as :data:`FIELDS`, compared
    field by field. (A plain class: a dataclass costs ~1 ms of every start-up.)"""

    #: The flags, in order: what :meth:`to_json` writes and :meth:`from_json` reads.
    FIELDS = ("tracer", "filters", "notrace", "graph_functions", "graph_notrace", "events",
              "event_filters", "event_triggers", "options", "max_graph_depth", "tracing_thresh",
              "buffer_kb", "follow", "blocking_ms")

    __hash__ = None  # type: ignore[assignment] - mutable, compared by value

    def __init__(self, tracer: str = "function_graph",
                 filters: list[str] | None = None,
                 notrace: list[str] | None = None,
                 graph_functions: list[str] | None = None,
                 graph_notrace: list[str] | None = None,
                 events: list[str] | None = None,
                 event_filters: dict[str, list[str]] | None = None,
                 event_triggers: dict[str, list[str]] | None = None,
                 options: list[str] | None = None,
                 max_graph_depth: int | None = None,
                 tracing_thresh: int | None = None,
                 buffer_kb: int | None = None,
                 follow: bool = True,
                 blocking_ms: int | None = None) -> None:
        # (a list or dict left out, or None, is a new empty one)
        self.tracer = tracer  # -p
        self.filters = [] if filters is None else filters  # -l (empty: the program's own code)
        self.notrace = [] if notrace is None else notrace  # -n
        self.graph_functions = [] if graph_functions is None else graph_functions  # -g
        self.graph_notrace = [] if graph_notrace is None else graph_notrace  # --graph-notrace
        self.events = [] if events is None else events  # -e: probe definitions, made, enabled
        self.event_filters = {} if event_filters is None else event_filters  # -f, per -e
        self.event_triggers = {} if event_triggers is None else event_triggers  # -R, per -e
        self.options = [] if options is None else options  # -O NAME / -O noNAME
        self.max_graph_depth = max_graph_depth
        self.tracing_thresh = tracing_thresh  # microseconds
        self.buffer_kb = buffer_kb  # -b
        self.follow = follow  # --no-follow: child processes run untraced
        # --blocking-timeout: how long the program may wait for record's drain (None, 0: never)
        self.blocking_ms = blocking_ms

    def as_dict(self) -> dict[str, Any]:
        """Every field by name (the values themselves)."""
        return {name: getattr(self, name) for name in self.FIELDS}

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.as_dict() == other.as_dict()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self.as_dict().items())
        return f"{type(self).__qualname__}({fields})"

    def replace(self, **changes: Any) -> TraceSettings:
        """A new TraceSettings with ``changes`` (the others the same objects, not copies)."""
        return type(self)(**{**self.as_dict(), **changes})

    def to_json(self) -> str:
        return jsontext.dumps(self.as_dict())

    @classmethod
    def from_json(cls, text: str) -> TraceSettings:
        import json  # (a child's start-up reads it: jsontext has no reader)

        data: dict[str, Any] = json.loads(text)
        return cls(**{k: v for k, v in data.items() if k in cls.FIELDS})


class SettingError(ValueError):
    """A flag the trace refuses; ``flag`` names it (``-l``, ``-O``...), the message says why."""

    def __init__(self, flag: str, value: str, message: str) -> None:
        self.flag = flag
        self.value = value
        super().__init__(f"{flag} {value!r}: {message}")


def _without_timestamp(message: str) -> str:
    """An error_log line's message without its "[ timestamp] " (which says nothing about the
    flag)."""
    end = message.find("] ")
    stamp = message[1:end].lstrip(" ") if message.startswith("[") and end > 0 else ""
    if stamp and all(c.isdigit() or c == "." for c in stamp):
        return message[end + 2:]
    return message


def default_filter(program: Program) -> list[str]:
    """The filter used when no ``-l`` is given: the program's own code (see
    :meth:`Program.own_modules`), never the whole standard library."""
    return ["*:mod:__main__", *(f"*:mod:{name}" for name in program.own_modules())]


def configure(fs: Tracefs, settings: TraceSettings, program: Program | None,
              tracer: bool = True, refused: list[SettingError] | None = None) -> list[str]:
    """Apply ``settings`` to ``fs`` with tracing off; returns the filter patterns in force.

    Raises :class:`SettingError` naming the flag whose value was refused; or, given a
    ``refused`` list (a child process applying its parent's settings), adds the refusals to
    it and goes on.
    """
    from rethook.control.tracefs import TracefsError

    def write(flag: str, value: str, path: str, text: str, append: bool = False) -> None:
        try:
            fs.write(path, text, append=append)
        except TracefsError as e:
            # "PATH: " and error_log's "[timestamp] " say nothing about the flag
            message = _without_timestamp(str(e).removeprefix(f"{path}: "))
            if refused is None:
                raise SettingError(flag, value, message) from None
            refused.append(SettingError(flag, value, message))

    write("tracing_on", "0", "tracing_on", "0")
    if settings.buffer_kb is not None:
        write("-b", str(settings.buffer_kb), "buffer_size_kb", str(settings.buffer_kb))
    for opt in settings.options:
        write("-O", opt, "trace_options", opt)
    filters = list(settings.filters)
    if filters:
        for text in filters:
            write("-l", text, "set_ftrace_filter", text, append=True)
    elif program is not None:
        filters = _write_default_filter(fs, program)
    for text in settings.notrace:
        write("-n", text, "set_ftrace_notrace", text, append=True)
    for text in settings.graph_functions:
        write("-g", text, "set_graph_function", text, append=True)
    for text in settings.graph_notrace:
        write("--graph-notrace", text, "set_graph_notrace", text, append=True)
    for text in settings.events:
        before = set(fs.dynamic.events)
        write("-e", text, "dynamic_events", text, append=True)
        for name in [n for n in fs.dynamic.events if n not in before]:
            for flt in settings.event_filters.get(text, ()):
                write("-f", flt, f"events/{name}/filter", flt)
            for trig in settings.event_triggers.get(text, ()):
                write("-R", trig, f"events/{name}/trigger", trig)
            write("-e", text, f"events/{name}/enable", "1")
    if settings.max_graph_depth is not None:
        write("--max-graph-depth", str(settings.max_graph_depth), "max_graph_depth",
              str(settings.max_graph_depth))
    if settings.tracing_thresh is not None:
        write("--tracing-thresh", str(settings.tracing_thresh), "tracing_thresh",
              str(settings.tracing_thresh))
    if tracer:
        write("-p", settings.tracer, "current_tracer", settings.tracer)
    return filters


def configure_leniently(fs: Tracefs, settings: TraceSettings, tracer: bool = True) -> None:
    """:func:`configure` for a child process: its parent's settings, where they apply. A
    filter pattern (``-l``) that names nothing here yet is written again whenever functions
    appear (a module imported later, code runpy runs), so it hooks them before they run;
    other refusals are left out. Tracing nothing never turns into tracing everything."""
    from rethook.control.tracefs import TracefsError

    refused: list[SettingError] = []
    configure(fs, settings, None, tracer=tracer, refused=refused)
    waiting = [e.value for e in refused if e.flag == "-l"]
    if not waiting:
        return
    blocked = len(waiting) == len(settings.filters)
    if blocked:  # an empty filter means every function: none until one of them matches
        fs.write("set_ftrace_notrace", "*", append=True)

    def retry(_infos: list) -> None:
        nonlocal blocked
        for text in list(waiting):
            if text not in waiting:  # a write below notified this again, and it matched
                continue
            waiting.remove(text)
            try:
                fs.write("set_ftrace_filter", text, append=True)
            except TracefsError:
                waiting.append(text)
                continue
            if blocked:
                blocked = False
                fs.write("set_ftrace_notrace", "!*", append=True)

    fs.ctx.registry.subscribe(retry)


def _write_default_filter(fs: Tracefs, program: Program) -> list[str]:
    from rethook.control.tracefs import TracefsError

    used = []
    for pattern in default_filter(program):
        try:
            fs.write("set_ftrace_filter", pattern, append=True)
        except TracefsError:
            continue  # e.g. a script that defines no functions: nothing of __main__ to hook
        used.append(pattern)
    if not used:
        # An empty filter means "every function"; the default never means that.
        fs.write("set_ftrace_notrace", "*", append=True)
        print("rethook: the program defines no functions of its own: nothing is traced "
              "(choose functions with -l)", file=sys.stderr)
    return used


def register_program(fs: Tracefs, program: Program) -> None:
    """Put a loaded program's code in the registry before the filters are written: its
    ``__main__`` (so -l names the script's functions, ``__main__.f``) and, for ``-m``, the
    modules of its package that are not imported yet (``-l 'pkg.*'``, ``pkg.mod.func``)."""
    registry = fs.ctx.registry
    assert program.code is not None
    registry.add_code(program.code, "__main__")
    if program.module is not None and program.spec is not None:
        prepare_package(registry, program.module.split(".")[0], skip={program.spec.name})

