"""The trace event model: event formats, the format registry, and the `Lost` marker.

This is the Python counterpart of ftrace's ``events/*/format`` files. A tracer
registers an :class:`EventFormat` (an id, a name and typed fields) in the
:class:`FormatRegistry` of its trace, then records events as plain tuples::

    (format_id, ts_ns, tid, *field_values)

Tuples, not objects, because the hot path builds one per traced call (and a C
twin will build the same tuples). The first three items are the *common
fields* every event has; a format lists only the fields after them.

Field types and the Python values they hold:

========  ==========================================================
``u64``   int (unsigned by intent; any Python int is kept exactly)
``s64``   int (signed by intent; any Python int is kept exactly)
``f64``   float
``str``   str (function names, reprs; interned in the trace file)
``bool``  bool
========  ==========================================================

``u64``/``s64`` name the range a value is expected to have (what the C twin
and the renderer assume), but nothing is ever truncated: an int outside 64
bits is stored in the trace file with a big-integer escape and comes back
unchanged (see docs/trace-format.md).
"""

from __future__ import annotations

import threading

from rethook.engine import clock
from rethook.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from typing import Any

#: The field types an event format may use, in the order of their type codes in the file.
FIELD_TYPES: tuple[str, ...] = ("u64", "s64", "f64", "str", "bool")

#: The names the common fields go by in format descriptions (like ftrace's ``common_*``).
COMMON_FIELDS: tuple[str, ...] = ("common_type", "common_ts", "common_tid")

#: The types of the common fields.
COMMON_TYPES: tuple[str, ...] = ("u64", "u64", "s64")

#: Number of items before the first format field in an event tuple.
COMMON_COUNT = len(COMMON_FIELDS)

#: The clock all writers of one trace should stamp events with: per-thread monotonic and
#: shared by all threads, so merging buffers by timestamp gives the order things happened.
clock_ns = clock.now_ns

#: A recorded event: ``(format_id, ts_ns, tid, *field_values)``.
Event = tuple


class Field(Frozen):
    """One typed field of an event format."""

    __slots__ = ("name", "type")
    name: str
    type: str

    def __init__(self, name: str, type: str) -> None:  # noqa: A002 - the field's name
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"field name must be an identifier, got {name!r}")
        if name.startswith("common_"):
            raise ValueError(f"field name {name!r}: the common_ prefix is reserved")
        if type not in FIELD_TYPES:
            raise ValueError(
                f"field {name!r}: unknown type {type!r} (one of {', '.join(FIELD_TYPES)})"
            )
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "type", type)

    @classmethod
    def parse(cls, spec: Field | str | tuple[str, str]) -> Field:
        """Accept a Field, ``"name:type"`` or ``(name, type)``."""
        if isinstance(spec, Field):
            return spec
        if isinstance(spec, str):
            name, sep, ftype = spec.partition(":")
            if not sep:
                raise ValueError(f"field spec {spec!r} is not 'name:type'")
            return cls(name.strip(), ftype.strip())
        name, ftype = spec
        return cls(name, ftype)


class EventFormat(Frozen):
    """The layout of one kind of event: what the tuple items after the common fields mean."""

    __slots__ = ("id", "name", "fields")
    id: int
    name: str
    fields: tuple[Field, ...]

    def __init__(self, id: int, name: str,  # noqa: A002 - the format's id
                 fields: Iterable[Field | str | tuple[str, str]]) -> None:
        if not isinstance(id, int) or not 0 <= id < 2**32:
            raise ValueError(f"format id must be an int in [0, 2**32), got {id!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"format name must be a non-empty str, got {name!r}")
        fields = tuple(Field.parse(f) for f in fields)
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"format {name!r}: duplicate field names in {names}")
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "fields", fields)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def arity(self) -> int:
        """Length of an event tuple of this format."""
        return COMMON_COUNT + len(self.fields)

    def values(self, event: Event) -> dict[str, Any]:
        """The fields of ``event`` by name (common fields excluded)."""
        return dict(zip(self.field_names, event[COMMON_COUNT:], strict=True))

    def describe(self) -> str:
        """A text description in the spirit of ftrace's ``events/<sys>/<event>/format``."""
        lines = [f"name: {self.name}", f"ID: {self.id}", "format:"]
        lines += [f"\tfield:{t} {n};" for n, t in zip(COMMON_FIELDS, COMMON_TYPES, strict=True)]
        lines.append("")
        lines += [f"\tfield:{f.type} {f.name};" for f in self.fields]
        return "\n".join(lines) + "\n"


class Lost(Frozen):
    """A gap in one thread's event stream: ``count`` events were dropped here.

    Readers that report loss in place (the trace pipe, a trace file read with
    ``lost=True``) yield this between the events before and after the gap; the
    renderer prints it as ``[LOST n EVENTS]``. It is deliberately not a tuple, so
    it can never be mistaken for an event.
    """

    __slots__ = ("tid", "count")
    tid: int
    count: int

    def __init__(self, tid: int, count: int) -> None:
        object.__setattr__(self, "tid", tid)
        object.__setattr__(self, "count", count)


class FormatRegistry:
    """The event formats of one trace, by id and by name.

    Formats may be added at any time, also while other threads trace: lookups
    never lock, and iteration walks a snapshot taken when it starts.
    """

    def __init__(self, formats: Iterable[EventFormat] = ()) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, EventFormat] = {}
        self._by_name: dict[str, EventFormat] = {}
        self._ordered: tuple[EventFormat, ...] = ()
        for fmt in formats:
            self.add(fmt)

    def register(
        self,
        name: str,
        fields: Iterable[Field | str | tuple[str, str]] = (),
        id: int | None = None,
    ) -> EventFormat:
        """Define a format, giving it the next free id unless ``id`` is given.

        Registering the same name with the same fields again returns the existing
        format (tracers can register unconditionally); a different layout under an
        existing name is an error.
        """
        fields = tuple(Field.parse(f) for f in fields)
        with self._lock:
            old = self._by_name.get(name)
            if old is not None:
                if old.fields == fields and (id is None or id == old.id):
                    return old
                raise ValueError(f"event format {name!r} is already registered as {old}")
            if id is None:
                id = max(self._by_id, default=-1) + 1
            fmt = EventFormat(id, name, fields)
            self._insert(fmt)
            return fmt

    def add(self, fmt: EventFormat) -> EventFormat:
        """Add a format with its own id (as read back from a trace file, say)."""
        with self._lock:
            if self._by_id.get(fmt.id) == fmt:
                return fmt
            self._insert(fmt)
            return fmt

    def _insert(self, fmt: EventFormat) -> None:
        if fmt.id in self._by_id:
            raise ValueError(f"event format id {fmt.id} is already used by {self._by_id[fmt.id]}")
        if fmt.name in self._by_name:
            raise ValueError(f"event format {fmt.name!r} is already registered")
        self._by_id[fmt.id] = fmt
        self._by_name[fmt.name] = fmt
        self._ordered = (*self._ordered, fmt)

    def __getitem__(self, format_id: int) -> EventFormat:
        return self._by_id[format_id]

    def get(self, format_id: int) -> EventFormat | None:
        return self._by_id.get(format_id)

    def by_name(self, name: str) -> EventFormat:
        return self._by_name[name]

    def __contains__(self, format_id: object) -> bool:
        return format_id in self._by_id

    def __iter__(self) -> Iterator[EventFormat]:
        return iter(self._ordered)

    def __len__(self) -> int:
        return len(self._ordered)

    def __repr__(self) -> str:
        return f"FormatRegistry({[f.name for f in self._ordered]})"
