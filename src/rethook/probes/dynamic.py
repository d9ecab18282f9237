"""The ``dynamic_events`` file of one trace instance: its probe events and its error log.

:class:`DynamicEvents` holds the events defined in one trace instance; rejected commands go to
:class:`ErrorLog` (the ``error_log`` file) and create nothing. The probe machinery itself
(:mod:`rethook.probes.events`: definitions, fetch args, event filters, triggers, histograms)
is imported when the first definition is written, so a trace without probes never loads it.
"""

from __future__ import annotations

from rethook.tracers.formats import FIRST_DYNAMIC_ID

TYPE_CHECKING = False
if TYPE_CHECKING:
    from rethook.probes.dynevent import DeleteDefinition
    from rethook.probes.events import ProbeEvent, ProbeFormatter
    from rethook.tracers.base import TraceContext


class ProbeError(ValueError):
    """A definition that parses but cannot be created (no such function, name in use...)."""

    def __init__(self, message: str, text: str, position: int = 0) -> None:
        self.message = message
        self.text = text
        self.position = position
        super().__init__(message)

    def log_entry(self) -> str:
        return (f"trace_probe: error: {self.message}\n  Command: {self.text}\n"
                f"{' ' * (11 + self.position)}^\n")


class ErrorLog:
    """The ``error_log`` file: the last few rejected commands, each with its caret line."""

    LIMIT = 16

    def __init__(self) -> None:
        self.entries: list[str] = []

    def add(self, entry: str) -> None:
        self.entries = (self.entries + [entry.rstrip("\n") + "\n"])[-self.LIMIT:]

    def read(self) -> str:
        return "".join(self.entries)

    def clear(self) -> None:
        self.entries = []


class DynamicEvents:
    """The probe events of one trace instance (the ``dynamic_events`` file and ``events/``)."""

    def __init__(self, ctx: TraceContext) -> None:
        self.ctx = ctx
        self.events: dict[str, ProbeEvent] = {}  # "GRP/EVENT" -> event
        # Every format ever made here -> its definition: events of a deleted (or redefined)
        # probe still in the buffer keep printing as they were recorded.
        self.printed: dict[str, str] = {}
        self.error_log = ErrorLog()
        self._next_id = FIRST_DYNAMIC_ID

    def write(self, text: str, append: bool = True, only: str = "pfr") -> list[ProbeEvent]:
        """``echo text >> dynamic_events``: one command per line; ``>`` (append=False)
        first removes every event. A rejected command raises and creates nothing (the
        commands before it in the same write stay, as in the kernel)."""
        if not append:
            busy = [e.full_name for e in self.events.values() if e.enabled]
            if busy:
                raise ProbeError(f"events are enabled: {', '.join(busy)} (disable them first)",
                                 text.strip())
            self.events.clear()
        made = []
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                made.extend(self._command(line, only))
        return made

    def _command(self, line: str, only: str) -> list[ProbeEvent]:
        from rethook.probes.dynevent import DeleteDefinition, ProbeDefinition, parse_definition
        from rethook.probes.events import ProbeEvent
        from rethook.probes.fetch import ProbeSyntaxError

        try:
            d = parse_definition(line)
            if isinstance(d, ProbeDefinition) and d.kind not in only:
                raise ProbeError(f"{d.kind}: events are not accepted here (use dynamic_events)",
                                 line)
            if isinstance(d, DeleteDefinition):
                self._delete(d, line)
                return []
            if d.full_name in self.events:
                raise ProbeError(f"event {d.full_name} already exists", line)
            fmt_name = d.full_name
            n = 1
            while fmt_name in self.printed:  # redefined after a delete: a new format
                n += 1
                fmt_name = f"{d.full_name}#{n}"
            event = ProbeEvent(d, self.ctx, self._next_id, fmt_name)
        except (ProbeSyntaxError, ProbeError) as e:
            self.error_log.add(e.log_entry())
            raise
        self._next_id += 1
        self.ctx.formats.add(event.format)
        self.events[d.full_name] = event
        self.printed[fmt_name] = d.canonical()
        return [event]

    def _delete(self, d: DeleteDefinition, line: str) -> None:
        matches = [k for k, e in self.events.items()
                   if e.name == d.event and (d.group is None or e.group == d.group)]
        if not matches:
            raise ProbeError(f"no event {d.event!r} to delete", line)
        for key in matches:
            if self.events[key].enabled:
                raise ProbeError(f"event {key} is enabled (disable it first)", line)
            del self.events[key]

    def read(self, only: str = "pfr") -> str:
        return "".join(e.defn.canonical() + "\n" for e in self.events.values()
                       if e.defn.kind in only)

    def get(self, group: str, name: str) -> ProbeEvent | None:
        return self.events.get(f"{group}/{name}")

    def groups(self) -> dict[str, list[ProbeEvent]]:
        out: dict[str, list[ProbeEvent]] = {}
        for e in self.events.values():
            out.setdefault(e.group, []).append(e)
        return out

    def profile(self) -> str:
        """``kprobe_profile``: each event's hits and misses."""
        return "".join(f"  {e.name:<44} {e.nhit:>15} {e.nmissed:>15}\n"
                       for e in self.events.values())

    def definitions(self) -> list[str]:
        return [e.defn.canonical() for e in self.events.values()]

    def formatter(self) -> ProbeFormatter:
        """Prints every event this instance ever defined (what a trace file keeps too)."""
        from rethook.probes.events import ProbeFormatter

        return ProbeFormatter(self.printed)

    def stop(self) -> None:
        for e in self.events.values():
            e.disable()
