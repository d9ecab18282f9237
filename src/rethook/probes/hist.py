"""Histogram triggers: ``hist:keys=...[:vals=...][:sort=...][:size=N][:name=N] [if FILTER]``.

The kernel's ``trace_events_hist.c`` rules, applied to event records (field -> Python value):

- ``keys=`` (or ``key=``): one to three fields, each with an optional modifier: ``.log2``
  (``{ len: ~ 2^5  }``, the power of two at or above the value), ``.buckets=N`` (or
  ``.bucket=N``; ``{ size: ~ 1000-1999 }``), ``.hex``, and ``.execname`` on ``common_pid``
  (the thread name seen when the entry was created). String keys group by the string (at most
  255 characters, the kernel's limit).
- ``vals=`` (``val=``/``values=``): up to two numeric fields summed per entry, ``.hex``
  allowed; ``hitcount`` is always kept, printed first and may be named here.
- ``sort=``: up to two of ``hitcount``, a val or a key (by field name), each ``.descending`` or
  ``.ascending``; the default is ``hitcount`` ascending. Ties are broken by the keys, ascending
  (the kernel leaves them in hash order).
- ``size=``: the table's entry limit, rounded up to a power of two, 128..131072 (default
  2048). A hit whose key would need a new entry in a full table is counted in ``Dropped``;
  every hit, dropped or not, counts in ``Hits``.
- ``name=``: read back as ``hist:name=N:keys=...``; ``share_data`` lets the caller make
  same-named triggers share one table, as the kernel does.
- ``pause``, ``cont``/``continue``, ``clear``: see ``triggers.apply_trigger_write``.

A key value that is not of its field's Python type (a fetch fault marker, ``None``, a missing
field) groups under one ``(fault)`` entry of that key; a faulted val adds nothing to its sum.

``render()`` produces the ``hist`` file for one trigger, character for character where the
kernel's format maps (``%10llu`` columns, ``%-50s`` strings, ``~ 2^%-2llu``...); signed values
print signed (the kernel prints them as ``u64``) and floats print as Python ``repr``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rethook.printable import printable
from rethook.probes.evfilter import (
    FILTER_ERROR_LOCATION,
    MAX_FILTER_STR_VAL,
    U64_MAX,
    EventFilter,
    FilterSyntaxError,
    compile_filter,
    kstrtoull,
    python_types,
    resolve_field,
)

__all__ = [
    "HistField",
    "HistRow",
    "HistTrigger",
    "SortKey",
    "parse_hist_trigger",
    "render_hist_file",
]

DEFAULT_SIZE = 2048  # 1 << TRACING_MAP_BITS_DEFAULT
MIN_BITS, MAX_BITS = 7, 17  # TRACING_MAP_BITS_MIN / _MAX
KEYS_MAX = 3  # TRACING_MAP_KEYS_MAX
VALS_MAX = 2  # TRACING_MAP_VALS_MAX (3) less the implicit hitcount
SORT_KEYS_MAX = 2  # TRACING_MAP_SORT_KEYS_MAX
_STR_KEY_MAX = MAX_FILTER_STR_VAL - 1

# Kernel messages (trace_events_hist.c err_text[]).
E_EMPTY_ASSIGNMENT = "Empty assignment"
E_BAD_FIELD_MODIFIER = "Invalid field modifier"
E_FIELD_NOT_FOUND = "Couldn't find field"
E_INVALID_SORT_MODIFIER = "Invalid sort modifier"
E_EMPTY_SORT_FIELD = "Empty sort field"
E_TOO_MANY_SORT_FIELDS = "Too many sort fields (Max = 2)"
E_INVALID_SORT_FIELD = "Sort field must be a key or a val"
E_TRIGGER_EEXIST = "Hist trigger already exists"
E_TRIGGER_ENOENT_CLEAR = "Can't clear or continue a nonexistent hist trigger"
E_NAMED_MISMATCH = ("Named hist trigger doesn't match existing named trigger "
                    "(includes variables)")
# Where the kernel returns -EINVAL without an error_log entry, these say why.
E_NO_KEYS = "No keys specified"
E_TOO_MANY_KEYS = "Too many keys (Max = 3)"
E_TOO_MANY_VALS = "Too many values (Max = 2, plus hitcount)"
E_VAL_NOT_NUMERIC = "Values must be numeric fields"
E_BAD_SIZE = "Invalid size (must be 128 to 131072)"
E_BAD_ATTR = "Invalid hist trigger attribute (variables and actions are not supported)"
E_MISSING_FILTER = "Missing filter after 'if'"

_KEY_MODIFIERS = ("hex", "log2", "execname")  # plus buckets=N
_UNSUPPORTED_MODIFIERS = ("sym", "sym-offset", "syscall", "usecs", "percent", "graph",
                          "stacktrace")


class _Fault:
    """The key component of every faulted key value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "(fault)"


FAULT_KEY = _Fault()


@dataclass(frozen=True, slots=True)
class HistField:
    """A key or val: ``name`` as written, ``key`` the record key, ``kind`` the field type."""

    name: str
    key: str
    kind: str
    modifier: str | None = None  # hex, log2, buckets, execname
    buckets: int = 0

    @property
    def spec(self) -> str:
        """As the trigger file prints it (the kernel's ``hist_field_print``)."""
        text = self.name if self.modifier is None else f"{self.name}.{self.modifier}"
        return f"{text}={self.buckets}" if self.modifier == "buckets" else text

    @property
    def is_string(self) -> bool:
        return self.kind == "str"


@dataclass(frozen=True, slots=True)
class SortKey:
    """``field`` None is hitcount; ``val`` tells a val (index into vals) from a key."""

    field: HistField | None
    index: int
    val: bool
    descending: bool = False

    @property
    def spec(self) -> str:
        text = "hitcount" if self.field is None else self.field.spec
        return text + (".descending" if self.descending else "")


@dataclass(frozen=True, slots=True)
class HistRow:
    """One entry: ``key`` (one component per key field), ``hitcount``, ``vals`` (the sums)."""

    key: tuple[Any, ...]
    hitcount: int
    vals: tuple[int | float, ...]
    comm: str | None = None


class _HistData:
    """The table, shared by same-named triggers; one lock, held only to update or copy."""

    __slots__ = ("lock", "table", "comms", "hits", "dropped", "size")

    def __init__(self, size: int) -> None:
        self.lock = threading.Lock()
        self.table: dict[tuple, list] = {}
        self.comms: dict[tuple, str] = {}
        self.hits = 0
        self.dropped = 0
        self.size = size


# ---------------------------------------------------------------------------------------------
# Key and val functions

def _log2(v: int) -> int:
    """ilog2(roundup_pow_of_two(v)) on the u64 value (0 and 1 give 0)."""
    u = v & U64_MAX
    return 0 if u <= 1 else (u - 1).bit_length()


def _key_fn(f: HistField) -> Callable[[Mapping[str, Any]], Any]:
    types = python_types(f.kind)
    key = f.key
    if f.kind == "str":
        def string(values: Mapping[str, Any]) -> Any:
            v = values.get(key)
            return v[:_STR_KEY_MAX] if isinstance(v, str) else FAULT_KEY
        return string
    if f.modifier == "log2":
        def log2(values: Mapping[str, Any]) -> Any:
            v = values.get(key)
            if v.__class__ is int:
                return 0 if v <= 1 and v >= 0 else _log2(v)
            if not isinstance(v, types):
                return FAULT_KEY
            if isinstance(v, float):
                if not math.isfinite(v):
                    return FAULT_KEY
                v = math.ceil(v) if v > 0 else 0
            return _log2(v)
        return log2
    if f.modifier == "buckets":
        n = f.buckets

        def bucket(values: Mapping[str, Any]) -> Any:
            v = values.get(key)
            if not isinstance(v, types):
                return FAULT_KEY
            if isinstance(v, float):
                if not math.isfinite(v):
                    return FAULT_KEY
                return math.floor(v / n) * n
            return (v // n) * n
        return bucket

    def plain(values: Mapping[str, Any]) -> Any:
        v = values.get(key)
        if v.__class__ is int or v.__class__ is float and f64:
            return v
        if not isinstance(v, types):
            return FAULT_KEY
        return int(v) if isinstance(v, bool) else v
    f64 = f.kind == "f64"
    return plain


def _val_fn(f: HistField) -> Callable[[Mapping[str, Any]], int | float]:
    types = python_types(f.kind)
    key = f.key

    def val(values: Mapping[str, Any]) -> int | float:
        v = values.get(key)
        return v if isinstance(v, types) else 0
    return val


def _fmt_key(f: HistField, comp: Any, comm: str | None) -> str:
    if comp is FAULT_KEY:
        return f"{f.name}: {'(fault)':<50}" if f.is_string else f"{f.name}: {'(fault)':>10}"
    mod = f.modifier
    if mod == "hex":
        return f"{f.name}: {comp & U64_MAX:x}"
    if mod == "log2":
        return f"{f.name}: ~ 2^{comp:<2}"
    if mod == "buckets":
        return f"{f.name}: ~ {comp}-{comp + f.buckets - 1}"
    if mod == "execname":
        name = printable(comm) if comm is not None else "(no comm)"
        return f"{f.name}: {name:<16}[{comp:>10}]"
    if f.is_string:  # the program's text: escaped, as probe string values are
        return f"{f.name}: {printable(comp):<50}"
    if isinstance(comp, float):
        return f"{f.name}: {comp!r:>10}"
    return f"{f.name}: {comp:>10}"


def _fmt_val(f: HistField, total: int | float) -> str:
    if f.modifier == "hex":
        return f" {f.name}: {int(total) & U64_MAX:>10x}"
    if isinstance(total, float):
        return f" {f.name}: {total!r:>10}"
    return f" {f.name}: {total:>10}"


def _component_order(comp: Any) -> tuple:
    return (1, 0) if comp is FAULT_KEY else (0, comp)


# ---------------------------------------------------------------------------------------------
# The trigger

class HistTrigger:
    """A parsed ``hist:`` trigger and its table.

    ``update(values)`` aggregates one hit (no filter check); ``fire(values, actions=None)``
    checks the ``if`` filter and the paused state first, as the kernel's trigger does.
    ``text`` is the ``trigger`` file line, ``render()`` the ``hist`` file section.
    Updates may come from any thread.
    """

    command = "hist"
    trigger_type = "hist"
    count = None
    post = False  # acts when the event is hit, before it is committed
    needs_record = True  # keys and vals are the event's fields

    def __init__(self, keys: Sequence[HistField], vals: Sequence[HistField],
                 sort: Sequence[SortKey], size: int = DEFAULT_SIZE, name: str | None = None,
                 filter: EventFilter | None = None, *, pause: bool = False,
                 cont: bool = False, clear: bool = False) -> None:
        self.keys = tuple(keys)
        self.vals = tuple(vals)
        self.sort = tuple(sort) or (SortKey(None, 0, True),)
        self.size = size
        self.name = name
        self.filter = filter
        self.paused = pause
        # The command's control flags, for apply_trigger_write (pause also starts it paused).
        self.pause_flag, self.cont_flag, self.clear_flag = pause, cont, clear
        self._data = _HistData(size)
        self._key_fns = tuple(_key_fn(k) for k in self.keys)
        self._val_fns = tuple(_val_fn(v) for v in self.vals)
        self._execname = any(k.modifier == "execname" for k in self.keys)
        self.update = self._make_update()

    # -- aggregation -----------------------------------------------------------------------

    def _make_update(self) -> Callable[[Mapping[str, Any]], None]:
        key_fns, val_fns, execname = self._key_fns, self._val_fns, self._execname
        width = 1 + len(val_fns)
        obj = self
        if len(key_fns) == 1:
            k0 = key_fns[0]

            def key_of(values: Mapping[str, Any]) -> tuple:
                return (k0(values),)
        else:
            def key_of(values: Mapping[str, Any]) -> tuple:
                return tuple([fn(values) for fn in key_fns])

        def new_entry(d: _HistData, key: tuple, values: Mapping[str, Any]) -> list | None:
            # Called with the lock held, for a key not in the table.
            if len(d.table) >= d.size:
                d.dropped += 1
                return None
            e = d.table[key] = [0] * width
            if execname:
                comm = values.get("comm")
                d.comms[key] = comm if isinstance(comm, str) else "(no comm)"
            return e

        if not val_fns:
            def update(values: Mapping[str, Any]) -> None:
                key = key_of(values)
                d = obj._data
                with d.lock:
                    d.hits += 1
                    e = d.table.get(key)
                    if e is None and (e := new_entry(d, key, values)) is None:
                        return
                    e[0] += 1
        elif len(val_fns) == 1:
            v0 = val_fns[0]

            def update(values: Mapping[str, Any]) -> None:
                key = key_of(values)
                a = v0(values)
                d = obj._data
                with d.lock:
                    d.hits += 1
                    e = d.table.get(key)
                    if e is None and (e := new_entry(d, key, values)) is None:
                        return
                    e[0] += 1
                    e[1] += a
        else:
            v0, v1 = val_fns

            def update(values: Mapping[str, Any]) -> None:
                key = key_of(values)
                a = v0(values)
                b = v1(values)
                d = obj._data
                with d.lock:
                    d.hits += 1
                    e = d.table.get(key)
                    if e is None and (e := new_entry(d, key, values)) is None:
                        return
                    e[0] += 1
                    e[1] += a
                    e[2] += b
        update.__doc__ = "Aggregate one hit (thread-safe)."
        return update

    def fire(self, values: Mapping[str, Any], actions: Any = None) -> None:
        """The trigger: filter, paused check, then ``update``. ``actions`` is unused."""
        if self.paused:
            return
        f = self.filter
        if f is not None and not f.match(values):
            return
        self.update(values)

    def clear(self) -> None:
        """Empty the table and zero Hits/Dropped (the ``:clear`` command)."""
        d = self._data
        with d.lock:
            d.table.clear()
            d.comms.clear()
            d.hits = 0
            d.dropped = 0

    @property
    def fields_used(self) -> frozenset[str]:
        """Record keys this trigger reads (keys, vals, filter; ``comm`` for ``.execname``)."""
        used = {f.key for f in self.keys} | {f.key for f in self.vals}
        if self._execname:
            used.add("comm")
        if self.filter is not None:
            used |= self.filter.fields_used
        return frozenset(used)

    @property
    def hits(self) -> int:
        return self._data.hits

    @property
    def dropped(self) -> int:
        return self._data.dropped

    @property
    def entries(self) -> int:
        return len(self._data.table)

    # -- named triggers --------------------------------------------------------------------

    def compatible(self, other: HistTrigger) -> bool:
        """Same keys and vals (names, types, modifiers): may share one table."""
        return self.keys == other.keys and self.vals == other.vals

    def share_data(self, other: HistTrigger, text: str = "", location: str = "hist") -> None:
        """Use ``other``'s table (same-named triggers); raises when not ``compatible``."""
        if not self.compatible(other):
            raise FilterSyntaxError(E_NAMED_MISMATCH, text, 0, location)
        self._data = other._data

    def matches(self, other: object, ignore_filter: bool = False) -> bool:
        """The kernel's ``hist_trigger_match``: same name, keys, vals, sort (and filter)."""
        if not isinstance(other, HistTrigger):
            return False
        if (self.name != other.name or self.keys != other.keys or self.vals != other.vals
                or self.sort != other.sort):
            return False
        if ignore_filter:
            return True
        mine = self.filter.text if self.filter is not None else None
        theirs = other.filter.text if other.filter is not None else None
        return mine == theirs

    # -- read-back -------------------------------------------------------------------------

    @property
    def spec_text(self) -> str:
        """``hist:...:size=N[ if FILTER]`` without the state suffix."""
        parts = ["hist:"]
        if self.name is not None:
            parts.append(f"name={self.name}:")
        parts.append("keys=" + ",".join(k.spec for k in self.keys))
        parts.append(":vals=hitcount" + "".join("," + v.spec for v in self.vals))
        parts.append(":sort=" + ",".join(s.spec for s in self.sort))
        parts.append(f":size={self.size}")
        if self.filter is not None:
            parts.append(f" if {self.filter.text}")
        return "".join(parts)

    @property
    def text(self) -> str:
        """The ``trigger`` file line (without the newline)."""
        return self.spec_text + (" [paused]" if self.paused else " [active]")

    def _snapshot(self) -> tuple[list[HistRow], int, int]:
        d = self._data
        with d.lock:
            snap = [(k, tuple(e), d.comms.get(k)) for k, e in d.table.items()]
            hits, dropped = d.hits, d.dropped
        snap.sort(key=lambda r: tuple(_component_order(c) for c in r[0]))
        for s in reversed(self.sort):
            if s.field is None:
                snap.sort(key=lambda r: r[1][0], reverse=s.descending)
            elif s.val:
                i = s.index + 1
                snap.sort(key=lambda r, i=i: r[1][i], reverse=s.descending)
            else:
                j = s.index
                snap.sort(key=lambda r, j=j: _component_order(r[0][j]), reverse=s.descending)
        return [HistRow(k, e[0], e[1:], comm) for k, e, comm in snap], hits, dropped

    def rows(self) -> list[HistRow]:
        """The entries in display order (sort keys, then the keys ascending)."""
        return self._snapshot()[0]

    def render_entries(self) -> tuple[list[str], int, int, int]:
        """The entry lines, Hits, Entries and Dropped (one consistent snapshot)."""
        rows, hits, dropped = self._snapshot()
        lines = []
        for r in rows:
            keys = ", ".join(_fmt_key(f, c, r.comm) for f, c in zip(self.keys, r.key, strict=True))
            line = [f"{{ {keys} }}", f" hitcount: {r.hitcount:>10}"]
            for f, total in zip(self.vals, r.vals, strict=True):
                line.append(" " + _fmt_val(f, total))
            lines.append("".join(line))
        return lines, hits, len(rows), dropped

    def render(self) -> str:
        """This trigger's section of the ``hist`` file."""
        lines, hits, entries, dropped = self.render_entries()
        out = ["# event histogram\n#\n# trigger info: ", self.text, "\n#\n\n"]
        out.extend(line + "\n" for line in lines)
        out.append(f"\nTotals:\n    Hits: {hits}\n    Entries: {entries}\n"
                   f"    Dropped: {dropped}\n")
        return "".join(out)

    def __repr__(self) -> str:
        return f"HistTrigger({self.text!r})"


def render_hist_file(triggers: Iterable[Any]) -> str:
    """The ``hist`` file of an event: every hist trigger's section, in list order."""
    sections = [t.render() for t in triggers if isinstance(t, HistTrigger)]
    return "\n\n".join(sections)


# ---------------------------------------------------------------------------------------------
# Parsing

class _Ctx:
    def __init__(self, text: str, fields: Mapping[str, str], location: str) -> None:
        self.text = text
        self.fields = fields
        self.location = location

    def error(self, message: str, pos: int) -> FilterSyntaxError:
        return FilterSyntaxError(message, self.text, pos, self.location)


def _split(text: str, start: int, end: int, sep: str) -> list[tuple[str, int]]:
    """``text[start:end]`` split on ``sep``, each part with its index in ``text``."""
    out, pos = [], start
    while True:
        k = text.find(sep, pos, end)
        if k < 0:
            out.append((text[pos:end], pos))
            return out
        out.append((text[pos:k], pos))
        pos = k + 1


def _parse_field(ctx: _Ctx, s: str, pos: int, *, is_key: bool) -> HistField:
    name, dot, modifier = s.partition(".")
    mod: str | None = None
    buckets = 0
    mpos = pos + len(name) + 1
    if dot:
        if modifier in _KEY_MODIFIERS and not (modifier == "execname" and name != "common_pid"):
            mod = modifier
        elif modifier.startswith("bucket"):
            rest = modifier[6:]
            rest = rest[1:] if rest.startswith("s") else rest
            n = kstrtoull(rest[1:]) if rest.startswith("=") else None
            if not n:
                raise ctx.error(E_BAD_FIELD_MODIFIER, mpos)
            mod, buckets = "buckets", n
        else:
            raise ctx.error(E_BAD_FIELD_MODIFIER, mpos)
    resolved = resolve_field(name, ctx.fields) if name else None
    if resolved is None:
        raise ctx.error(E_FIELD_NOT_FOUND, pos)
    key, kind = resolved
    if is_key:
        if mod in ("hex", "log2", "buckets") and kind == "str":
            raise ctx.error(E_BAD_FIELD_MODIFIER, mpos)
        if mod == "hex" and kind == "f64":
            raise ctx.error(E_BAD_FIELD_MODIFIER, mpos)
    else:
        if mod not in (None, "hex") or (mod == "hex" and kind == "f64"):
            raise ctx.error(E_BAD_FIELD_MODIFIER, mpos)
        if kind == "str":
            raise ctx.error(E_VAL_NOT_NUMERIC, pos)
    return HistField(name, key, kind, mod, buckets)


def _parse_size(ctx: _Ctx, s: str, pos: int) -> int:
    n = kstrtoull(s)
    if not n:
        raise ctx.error(E_BAD_SIZE, pos)
    bits = (n - 1).bit_length()
    if not MIN_BITS <= bits <= MAX_BITS:
        raise ctx.error(E_BAD_SIZE, pos)
    return 1 << bits


def _parse_sort(ctx: _Ctx, s: str, pos: int, sort_pos: int, vals: Sequence[HistField],
                keys: Sequence[HistField]) -> list[SortKey]:
    out: list[SortKey] = []
    parts = _split(ctx.text, pos, pos + len(s), ",")
    for i, (part, ppos) in enumerate(parts):
        if not part:
            raise ctx.error(E_EMPTY_SORT_FIELD, sort_pos)
        if i == SORT_KEYS_MAX - 1 and i + 1 < len(parts):
            raise ctx.error(E_TOO_MANY_SORT_FIELDS, sort_pos)
        name, dot, modifier = part.partition(".")
        if not name:
            raise ctx.error(E_EMPTY_SORT_FIELD, sort_pos)
        descending = False
        if dot:
            if modifier == "descending":
                descending = True
            elif modifier != "ascending":
                raise ctx.error(E_INVALID_SORT_MODIFIER, ppos + len(name) + 1)
        if name == "hitcount":
            out.append(SortKey(None, 0, True, descending))
            continue
        for j, v in enumerate(vals):
            if v.name == name:
                out.append(SortKey(v, j, True, descending))
                break
        else:
            for j, k in enumerate(keys):
                if k.name == name:
                    out.append(SortKey(k, j, False, descending))
                    break
            else:
                raise ctx.error(E_INVALID_SORT_FIELD, ppos)
    return out


def _find_if(text: str, start: int) -> int:
    """Index of the ``if`` that starts the filter (whitespace on both sides), or -1."""
    p = start
    while True:
        k = text.find("if", p)
        if k < 0 or k == start:
            return -1
        before_ok = text[k - 1] in " \t"
        after = text[k + 2:k + 3]
        if before_ok and (after in (" ", "\t") or after == ""):
            return k
        p = k + 1


def _parse_hist(text: str, start: int, fields: Mapping[str, str], location: str,
                is_fault: Callable[[Any], bool] | None = None) -> HistTrigger:
    """Parse the parameter of a hist command: ``text[start:]`` (``text`` is the whole command,
    for error carets)."""
    ctx = _Ctx(text, fields, location)
    k = _find_if(text, start)
    end = len(text)
    filt: EventFilter | None = None
    if k >= 0:
        fstart = k + 2
        while fstart < end and text[fstart] in " \t":
            fstart += 1
        if fstart >= end:
            raise ctx.error(E_MISSING_FILTER, k + 2)
        try:
            filt = compile_filter(text[fstart:], fields, is_fault=is_fault)
        except FilterSyntaxError as e:
            raise e.shifted(text, fstart, FILTER_ERROR_LOCATION) from None
        end = k
        while end > start and text[end - 1] in " \t":
            end -= 1
    keys_at = vals_at = sort_at = None
    name = None
    size = DEFAULT_SIZE
    pause = cont = clear = False
    if start >= end:
        raise ctx.error(E_NO_KEYS, start)
    for seg, pos in _split(text, start, end, ":"):
        lhs, eq, rhs = seg.partition("=")
        if eq:
            if not rhs:
                raise ctx.error(E_EMPTY_ASSIGNMENT, pos)
            rpos = pos + len(lhs) + 1
            if lhs in ("key", "keys"):
                keys_at = (rhs, rpos)
            elif lhs in ("val", "vals", "values"):
                vals_at = (rhs, rpos)
            elif lhs == "sort":
                sort_at = (rhs, rpos, pos)
            elif lhs == "name":
                name = rhs
            elif lhs == "clock":
                pass  # only meaningful with common_timestamp, which events here do not have
            elif lhs == "size":
                size = _parse_size(ctx, rhs, rpos)
            else:
                raise ctx.error(E_BAD_ATTR, pos)
        elif seg == "pause":
            pause = True
        elif seg in ("cont", "continue"):
            cont = True
        elif seg == "clear":
            clear = True
        else:
            raise ctx.error(E_BAD_ATTR, pos)
    if keys_at is None:
        raise ctx.error(E_NO_KEYS, start)
    vals: list[HistField] = []
    if vals_at is not None:
        for part, ppos in _split(text, vals_at[1], vals_at[1] + len(vals_at[0]), ","):
            if part == "hitcount":
                continue
            if len(vals) == VALS_MAX:
                raise ctx.error(E_TOO_MANY_VALS, ppos)
            vals.append(_parse_field(ctx, part, ppos, is_key=False))
    keys: list[HistField] = []
    for part, ppos in _split(text, keys_at[1], keys_at[1] + len(keys_at[0]), ","):
        if len(keys) == KEYS_MAX:
            raise ctx.error(E_TOO_MANY_KEYS, ppos)
        keys.append(_parse_field(ctx, part, ppos, is_key=True))
    sort: list[SortKey] = []
    if sort_at is not None:
        sort = _parse_sort(ctx, sort_at[0], sort_at[1], sort_at[2], vals, keys)
    return HistTrigger(keys, vals, sort, size, name, filt, pause=pause, cont=cont, clear=clear)


def parse_hist_trigger(text: str, fields: Mapping[str, str], *, event: str | None = None,
                       is_fault: Callable[[Any], bool] | None = None) -> HistTrigger:
    """Parse ``hist:...[ if FILTER]`` for an event with ``fields``.

    ``event`` (``GRP:EVENT``) names the error_log location (``hist:GRP:EVENT``), as the
    kernel's does. Outer whitespace is stripped first; error positions index what remains.
    """
    text = text.strip()
    location = f"hist:{event}" if event else "hist"
    if not (text.startswith("hist") and text[4:5] in ("", ":", " ", "\t")):
        raise FilterSyntaxError("Not a hist trigger", text, 0, location)
    start = 5
    while start < len(text) and text[start] in " \t":
        start += 1
    return _parse_hist(text, min(start, len(text)), fields, location, is_fault)
