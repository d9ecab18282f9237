"""The native half of the ring buffer: the C rings of :mod:`rethook.buffer._cring`, read as events.

Native tracers (``rethook.tracers._native``) write fixed-size records (``cring.h``'s
``rh_rec``) into one C ring per thread, which :meth:`TraceBuffer.native_local
<rethook.buffer.ring.TraceBuffer.native_local>` attaches to the thread's
:class:`~rethook.buffer.ring.ThreadBuffer`. This module holds what the ring module needs to
read them: whether the extension is built, how big a ring is, and how a raw record becomes
the event tuple the pure-Python tracers append (so every reader, renderer and the trace file
see one kind of event, whoever wrote it).
"""

from __future__ import annotations

from _operator import itemgetter
from types import CodeType

from rethook.buffer import schema
from rethook.buffer.events import Event, Lost

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any


def check_c_schema(module: Any) -> str:
    """Why the C ring module disagrees with :mod:`rethook.buffer.schema`, or "" if it agrees:
    its record type ids and the field order of its raw records."""
    want = {f.id: f.name for f in schema.NATIVE_FORMATS}
    got = getattr(module, "RECORD_TYPES", None)
    if got != want:
        return f"its record types {got} are not the schema's {want}"
    if getattr(module, "CALLER_OFFSET", None) != schema.CALLER_OFFSET:
        return f"its caller-offset flag is not the schema's {schema.CALLER_OFFSET}"
    fields = getattr(module, "RAW_RECORD_FIELDS", None)
    if fields != schema.RAW_RECORD_FIELDS:
        return f"its raw records {fields} are not the schema's {schema.RAW_RECORD_FIELDS}"
    return ""


try:
    from rethook.buffer import _cring
except ImportError as exc:  # not built (no compiler, another interpreter...)
    _cring = None
    _UNAVAILABLE_REASON = str(exc)
else:
    _UNAVAILABLE_REASON = check_c_schema(_cring)
    if _UNAVAILABLE_REASON:  # built from other sources than this Python: not used
        _UNAVAILABLE_REASON = f"rethook.buffer._cring was built for another schema: " \
                              f"{_UNAVAILABLE_REASON}"
        _cring = None

#: Whether the C ring extension is built: native tracers need it, nothing else does.
NATIVE_AVAILABLE: bool = _cring is not None

#: Bytes of one native record (``sizeof(rh_rec)``; 56 on 64-bit platforms). A thread's
#: native ring gets the same ``size_kb`` byte budget as its Python buffer, so it holds
#: more records than the Python buffer holds events (those are ~128 bytes each).
RECORD_BYTES: int = _cring.RECORD_BYTES if _cring is not None else 56

# Record types (cring.h's RH_*): the ids of the event formats they become (schema.py).
RH_FUNCTION = schema.FUNCTION.id
RH_FUNCGRAPH_ENTRY = schema.FUNCGRAPH_ENTRY.id
RH_FUNCGRAPH_EXIT = schema.FUNCGRAPH_EXIT.id
RH_FUNCGRAPH_SUSPEND = schema.FUNCGRAPH_SUSPEND.id
RH_FUNCGRAPH_RESUME = schema.FUNCGRAPH_RESUME.id

#: The ``print`` event format's id: an unknown record type becomes one of these rather than
#: failing the whole read.
_PRINT = schema.PRINT.id

#: A raw record as ``Ring.events()``/``Ring.consume()`` give it: the values of
#: ``schema.RAW_RECORD_FIELDS`` (``parent`` is None but for function records).
RawRecord = tuple

#: Names a code object (the registry's ``name``).
if TYPE_CHECKING:
    NameOf = Callable[[CodeType], str]


class NativeRingUnavailable(ImportError):
    """The C ring extension (``rethook.buffer._cring``) is not built."""


def ring_type() -> Any:
    """The ``Ring`` class, or :class:`NativeRingUnavailable` saying why there is none."""
    if _cring is None:
        raise NativeRingUnavailable(
            "rethook.buffer._cring (the C ring buffer native tracers write into) is not built"
            f" ({_UNAVAILABLE_REASON}); build it with `pip install -e .` or `python setup.py"
            " build_ext --inplace` (needs a C compiler and Python's headers). The pure-Python"
            " tracers work without it."
        )
    return _cring.Ring


def native_capacity(size_kb: int) -> int:
    """Records in one thread's native ring for a per-thread budget of ``size_kb`` KiB."""
    return max(1, size_kb * 1024 // RECORD_BYTES)


def default_name_of(code: CodeType) -> str:
    """Names codes until a native user says how (``native_local(name_of)``)."""
    return getattr(code, "co_qualname", None) or getattr(code, "co_name", "?")


def decode(records: Iterable[RawRecord], tid: int, name_of: NameOf) -> list[Event]:
    """Turn raw records into the event tuples the pure-Python tracers append.

    The reference for the ring's own decoding (``Ring.events(tid, name_of)``,
    ``Ring.consume(tid, name_of)``, in C), which readers use; tests hold the two equal.

    Names are cached by code id for this call only: ``records`` keeps the codes alive while
    it runs, so an id cannot be reused by another code object meanwhile (it could between
    calls).
    """
    names: dict[int, str] = {}

    def name(code: CodeType | None) -> str:
        if code is None:  # only after the GC emptied a ring (tp_clear): nothing to name
            return "?"
        key = id(code)
        try:
            return names[key]
        except KeyError:
            text = names[key] = name_of(code)
            return text

    out: list[Event] = []
    append = out.append
    for rtype, ts, code, parent, depth, calltime, sleep, flags, overrun in records:
        if rtype == RH_FUNCGRAPH_ENTRY:
            append((2, ts, tid, depth, name(code), ""))
        elif rtype == RH_FUNCGRAPH_EXIT:
            append((3, ts, tid, depth, name(code), calltime, overrun, sleep, flags, ""))
        elif rtype == RH_FUNCTION:
            # depth holds the caller's line for function events
            append((1, ts, tid, name(code), name(parent) if parent is not None else "", depth))
        elif rtype == RH_FUNCGRAPH_SUSPEND or rtype == RH_FUNCGRAPH_RESUME:
            append((rtype, ts, tid, depth, name(code)))
        else:
            append((_PRINT, ts, tid, f"rethook: native record of unknown type {rtype}"))
    return out


def consumed_items(taken: tuple[int, list[Event], int], tid: int) -> list[Event | Lost]:
    """A ``Ring.consume(tid, name_of)`` result (records decoded in C) as pipe items: a Lost
    for the records overwritten since the last read, the events, a Lost for the records
    refused since then."""
    lost_before, events, lost_after = taken
    items: list[Event | Lost] = []
    if lost_before:
        items.append(Lost(tid, lost_before))
    items += events
    if lost_after:
        items.append(Lost(tid, lost_after))
    return items


def merge_events(native: list[Event], python: list[Event]) -> list[Event]:
    """One thread's events of both halves, by timestamp; native first at equal timestamps
    (heapq.merge is stable: ties go to the earlier input). Each input keeps its order."""
    if not native:
        return python
    if not python:
        return native
    import heapq  # (start-up: test_startup)

    return list(heapq.merge(native, python, key=itemgetter(1)))
