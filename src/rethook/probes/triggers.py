"""Event triggers: ``traceon``, ``traceoff``, ``stacktrace`` (``[:COUNT] [if FILTER]``) and
``hist:...``, with ``!`` removal; the kernel's ``trace_events_trigger.c`` semantics.

Writing a trigger (what the ``trigger`` file does)::

    triggers = apply_trigger_write(triggers, "traceoff:2 if ret > 0", fields)

``apply_trigger_write`` returns a *new* list (publish it with one reference swap); it raises
``FilterSyntaxError`` for a bad command and applies the kernel's registration rules:

- one ``traceon``/``traceoff`` trigger per event (they share a trigger type) and one
  ``stacktrace``: a second one is refused (the kernel's ``-EEXIST``);
- ``!CMD...`` removes the trigger of that type; for these the count and ``if`` part are not
  used in matching and the rest is not checked (the kernel does the same, so ``!traceon``
  also removes a ``traceoff``: they are one type); removing what is not there is not an error;
- ``hist:`` triggers: any number, but not two that match (same name, keys, vals, sort; the
  filter ignored): the second is refused ("Hist trigger already exists") unless it carries
  ``:pause`` (pause the existing one), ``:cont`` (resume it) or ``:clear`` (empty it);
  ``!hist:...`` removes the one that matches including the filter;
- new non-hist triggers go to the head of the list, hist triggers to the tail (the kernel's
  ``list_add_rcu``/``list_add_tail_rcu``), which is the ``trigger`` file's order.

Firing, for every event hit, in the kernel's order (``trace_events_trigger.c``,
``event_triggers_call`` and ``event_triggers_post_call``)::

    post = fire_triggers(triggers, values, actions)   # before the event is committed
    ...the event's own filter decides whether the event is recorded...
    fire_post(post, actions)                           # after, recorded or not

The event's filter never gates its triggers: every hit reaches them, and each is gated by its
own ``if`` filter only (the kernel calls the triggers, then checks the event filter to
discard the event). When some trigger needs the record (a ``hist`` trigger, or one with an
``if`` filter), ``traceoff`` and ``stacktrace`` are post triggers: their filter is checked
with the others, but they act after the event, so the event that turns tracing off is
recorded, and a stack trace follows its event. When none does, every trigger acts before the
event, as the kernel's unconditional call does.

``fire`` checks the trigger's ``if`` filter first, then the count. ``actions`` is the
caller's ``TriggerActions``: ``traceon``/``traceoff`` act only when they change the state, and
with a count they consume it only then; ``stacktrace`` consumes its count on every firing.
Counts are exact under threads (a lock per counted trigger).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any, Protocol, runtime_checkable

from rethook.limits import TRIGGER_COUNT, range_text
from rethook.probes.evfilter import (
    FILTER_ERROR_LOCATION,
    EventFilter,
    FilterSyntaxError,
    compile_filter,
    kstrtoull,
)
from rethook.probes.hist import (
    E_TRIGGER_EEXIST,
    E_TRIGGER_ENOENT_CLEAR,
    HistTrigger,
    _parse_hist,
    render_hist_file,
)

__all__ = [
    "AVAILABLE_TRIGGERS",
    "CommandTrigger",
    "HistTrigger",
    "Trigger",
    "TriggerActions",
    "TriggerRemoval",
    "apply_trigger_write",
    "fire_post",
    "fire_triggers",
    "parse_trigger",
    "render_hist_file",
    "render_trigger_file",
]

TRIGGER_ERROR_LOCATION = "trigger"
AVAILABLE_TRIGGERS = ("traceon", "traceoff", "stacktrace", "hist")
_TRIGGER_TYPES = {"traceon": "traceonoff", "traceoff": "traceonoff", "stacktrace": "stacktrace"}
_KERNEL_ONLY = ("snapshot", "enable_event", "disable_event", "enable_hist", "disable_hist")

E_EMPTY = "Empty trigger command"
E_UNKNOWN = "Unknown trigger command"
E_UNSUPPORTED = "Trigger command not supported"
E_BAD_COUNT = "Invalid count"
E_EXPECT_IF = "Expected 'if FILTER'"
E_MISSING_FILTER = "Missing filter after 'if'"
E_EEXIST = "Trigger already exists"


@runtime_checkable
class TriggerActions(Protocol):
    """What triggers act on; implemented by the caller (the tracing instance)."""

    def is_tracing_on(self) -> bool:
        """Whether tracing is on (``tracing_on`` reads 1)."""
        ...

    def traceon(self) -> None:
        """Turn tracing on (called only when it is off)."""
        ...

    def traceoff(self) -> None:
        """Turn tracing off (called only when it is on)."""
        ...

    def stacktrace(self) -> None:
        """Record the current thread's stack in the trace (called in the probed thread)."""
        ...


class CommandTrigger:
    """``traceon``, ``traceoff`` or ``stacktrace``, with a count (None: unlimited) and filter.

    ``count`` is the number of firings left, as ``cat trigger`` shows it.
    """

    __slots__ = ("command", "trigger_type", "count", "filter", "_lock")

    def __init__(self, command: str, count: int | None = None,
                 filter: EventFilter | None = None) -> None:
        if command not in _TRIGGER_TYPES:
            raise ValueError(f"not a counted trigger command: {command!r}")
        self.command = command
        self.trigger_type = _TRIGGER_TYPES[command]
        self.count = count
        self.filter = filter
        self._lock = threading.Lock()

    @property
    def fields_used(self) -> frozenset[str]:
        """Record keys the trigger's filter reads."""
        return self.filter.fields_used if self.filter is not None else frozenset()

    @property
    def text(self) -> str:
        """The ``trigger`` file line (without the newline)."""
        head = f"{self.command}:unlimited" if self.count is None else \
            f"{self.command}:count={self.count}"
        return head if self.filter is None else f"{head} if {self.filter.text}"

    @property
    def post(self) -> bool:
        """Acts after the event is committed when the record is needed (the kernel's
        EVENT_CMD_FL_POST_TRIGGER: traceoff, stacktrace)."""
        return self.command != "traceon"

    @property
    def needs_record(self) -> bool:
        """Reads the event's fields (an ``if`` filter)."""
        return self.filter is not None

    def matches(self, values: Mapping[str, Any]) -> bool:
        """Whether the trigger's own ``if`` filter accepts the hit (no filter: always)."""
        f = self.filter
        return f is None or f.match(values)

    def fire(self, values: Mapping[str, Any], actions: TriggerActions) -> None:
        """Run the trigger for one event hit: its filter, then :meth:`act`."""
        if self.matches(values):
            self.act(actions)

    def act(self, actions: TriggerActions) -> None:
        """The command itself, its count permitting."""
        cmd = self.command
        if cmd == "stacktrace":
            if self.count is not None:
                with self._lock:
                    if self.count <= 0:
                        return
                    self.count -= 1
            actions.stacktrace()
            return
        want_on = cmd == "traceon"
        if self.count is None:
            if actions.is_tracing_on() != want_on:
                actions.traceon() if want_on else actions.traceoff()
            return
        with self._lock:
            if actions.is_tracing_on() == want_on or self.count <= 0:
                return
            self.count -= 1
            actions.traceon() if want_on else actions.traceoff()

    def __repr__(self) -> str:
        return f"CommandTrigger({self.text!r})"


Trigger = CommandTrigger | HistTrigger


def fire_triggers(triggers: Sequence[Trigger], values: Mapping[str, Any],
                  actions: TriggerActions) -> list[CommandTrigger]:
    """One event hit, before the event is committed: every trigger not deferred fires; the
    post triggers whose filter accepts the hit are returned, for :func:`fire_post`."""
    if not any(t.needs_record for t in triggers):
        for t in triggers:  # nothing reads the record: all act now, unconditionally
            t.fire(values, actions)
        return []
    post = []
    for t in triggers:
        if not t.post:
            t.fire(values, actions)
        elif t.matches(values):
            post.append(t)
    return post


def fire_post(post: Sequence[CommandTrigger], actions: TriggerActions) -> None:
    """The post triggers of one hit, after its event was committed (or discarded)."""
    for t in post:
        t.act(actions)


class TriggerRemoval:
    """A ``!TRIGGER`` write: ``matches(trigger)`` tells which trigger it removes."""

    __slots__ = ("command", "trigger_type", "hist", "text")

    def __init__(self, command: str, text: str, hist: HistTrigger | None = None) -> None:
        self.command = command
        self.trigger_type = "hist" if command == "hist" else _TRIGGER_TYPES[command]
        self.hist = hist
        self.text = text

    def matches(self, trigger: object) -> bool:
        if self.hist is not None:
            return self.hist.matches(trigger, ignore_filter=False)
        return isinstance(trigger, CommandTrigger) and trigger.trigger_type == self.trigger_type

    def __repr__(self) -> str:
        return f"TriggerRemoval({self.text!r})"


def _skip_blank(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def _parse_if(text: str, pos: int, fields: Mapping[str, str],
              is_fault: Callable[[Any], bool] | None) -> EventFilter:
    """``text[pos:]`` must be ``if FILTER``."""
    wend = pos
    while wend < len(text) and text[wend] not in " \t":
        wend += 1
    if text[pos:wend] != "if":
        raise FilterSyntaxError(E_EXPECT_IF, text, pos, TRIGGER_ERROR_LOCATION)
    fstart = _skip_blank(text, wend)
    if fstart >= len(text):
        raise FilterSyntaxError(E_MISSING_FILTER, text, wend, TRIGGER_ERROR_LOCATION)
    try:
        return compile_filter(text[fstart:], fields, is_fault=is_fault)
    except FilterSyntaxError as e:
        raise e.shifted(text, fstart, FILTER_ERROR_LOCATION) from None


def parse_trigger(text: str, fields: Mapping[str, str], *, event: str | None = None,
                  is_fault: Callable[[Any], bool] | None = None
                  ) -> CommandTrigger | HistTrigger | TriggerRemoval:
    """Parse one trigger write for an event with ``fields`` (see ``compile_filter``).

    Outer whitespace is stripped (the kernel's ``strim``); error positions index what
    remains. ``event`` (``GRP:EVENT``) names hist errors' location, ``hist:GRP:EVENT``.
    """
    text = text.strip()
    n = len(text)
    if not text or text == "!":
        raise FilterSyntaxError(E_EMPTY, text, 0, TRIGGER_ERROR_LOCATION)
    remove = text[0] == "!"
    cstart = 1 if remove else 0
    i = cstart
    while i < n and text[i] not in ": \t":
        i += 1
    command = text[cstart:i]
    nxt = _skip_blank(text, i + 1) if i < n else n
    if command == "hist":
        location = f"hist:{event}" if event else "hist"
        hist = _parse_hist(text, nxt, fields, location, is_fault)
        return TriggerRemoval("hist", text, hist) if remove else hist
    if command not in _TRIGGER_TYPES:
        message = E_UNSUPPORTED if command in _KERNEL_ONLY else E_UNKNOWN
        raise FilterSyntaxError(message, text, cstart, TRIGGER_ERROR_LOCATION)
    if remove:
        return TriggerRemoval(command, text)
    count: int | None = None
    filt: EventFilter | None = None
    if nxt < n and text[nxt].isdigit():
        end = nxt
        while end < n and text[end] not in " \t":
            end += 1
        count = kstrtoull(text[nxt:end])
        if count is None:
            message = E_BAD_COUNT
            if text[nxt:end].isascii() and text[nxt:end].isdigit():  # a number, too big
                message += f" ({range_text(*TRIGGER_COUNT)})"
            raise FilterSyntaxError(message, text, nxt, TRIGGER_ERROR_LOCATION)
        nxt = _skip_blank(text, end)
    if nxt < n:
        filt = _parse_if(text, nxt, fields, is_fault)
    return CommandTrigger(command, count, filt)


def apply_trigger_write(current: Sequence[Trigger], text: str, fields: Mapping[str, str], *,
                        event: str | None = None,
                        is_fault: Callable[[Any], bool] | None = None,
                        named: MutableMapping[str, HistTrigger] | None = None
                        ) -> list[Trigger]:
    """The event's trigger list after writing ``text`` to its ``trigger`` file.

    ``current`` is not modified (but ``:pause``/``:cont``/``:clear`` act on the matching
    hist trigger in place). ``named`` is the caller's registry of named hist triggers (the
    kernel's is global): a new ``name=N`` trigger shares the table of the one registered under
    ``N`` (refused when keys or vals differ) or registers itself.
    """
    t = parse_trigger(text, fields, event=event, is_fault=is_fault)
    stripped = text.strip()
    if isinstance(t, TriggerRemoval):
        for i, existing in enumerate(current):
            if t.matches(existing):
                return list(current[:i]) + list(current[i + 1:])
        return list(current)
    if isinstance(t, HistTrigger):
        location = f"hist:{event}" if event else "hist"
        for existing in current:
            if isinstance(existing, HistTrigger) and t.matches(existing, ignore_filter=True):
                if t.pause_flag:
                    existing.paused = True
                elif t.cont_flag:
                    existing.paused = False
                elif t.clear_flag:
                    existing.clear()
                else:
                    raise FilterSyntaxError(E_TRIGGER_EEXIST, stripped, 0, location)
                return list(current)
        if t.cont_flag or t.clear_flag:
            raise FilterSyntaxError(E_TRIGGER_ENOENT_CLEAR, stripped, 0, location)
        if t.name is not None and named is not None:
            shared = named.get(t.name)
            if shared is None:
                named[t.name] = t
            else:
                t.share_data(shared, stripped, location)
        return list(current) + [t]
    for existing in current:
        if isinstance(existing, CommandTrigger) and existing.trigger_type == t.trigger_type:
            raise FilterSyntaxError(E_EEXIST, stripped, 0, TRIGGER_ERROR_LOCATION)
    return [t] + list(current)


def render_trigger_file(triggers: Sequence[Trigger]) -> str:
    """The ``trigger`` file: one line per trigger, or the list of commands when there are none."""
    if not triggers:
        return "# Available triggers:\n# " + " ".join(AVAILABLE_TRIGGERS) + "\n"
    return "".join(t.text + "\n" for t in triggers)
