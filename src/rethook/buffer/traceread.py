"""Reading the binary trace file (docs/trace-format.md) that :mod:`rethook.buffer.tracefile`
writes: :class:`TraceReader` streams a file back, :class:`TraceTail` follows one another
process is still writing, :func:`events_in_file` counts what a reader would find.

Damage is reported as :class:`~rethook.buffer.tracefile.TraceFileError`, naming the file and
the byte offset of the first damaged chunk; everything before it is still read (with
``strict=False``, as :class:`~rethook.buffer.tracefile.TraceFileWarning`).
"""

from __future__ import annotations

import os
import struct
import warnings
import zlib
from array import array
from itertools import accumulate, chain, compress, repeat, zip_longest
from operator import eq, itemgetter

from rethook.buffer.events import FIELD_TYPES, Event, EventFormat, Field, FormatRegistry, Lost
from rethook.buffer.tracefile import (
    _BIG_ENDIAN_HOST,
    _CHUNK_HEAD,
    _CRC,
    _END,
    _FORMAT_HEAD,
    _HEADER,
    _I64,
    _INT_BIG,
    _INT_CONST,
    _INT_DELTA,
    _INT_PLAIN,
    _LOST,
    _TID_NAME,
    _U16,
    _U32,
    _UNSIGNED,
    _WIDTH_BY_CODE,
    HEADER_SIZE,
    MAGIC,
    MAX_BATCH_EVENTS,
    MAX_CHUNK_PAYLOAD,
    READ_MAJORS,
    TAG_END,
    TAG_EVENTS,
    TAG_FORMATS,
    TAG_LOST,
    TAG_META,
    TAG_PROC,
    TAG_STATS,
    TAG_STRINGS,
    TAG_THREADS,
    TraceFileError,
    TraceFileWarning,
    _chunks_of,
    _open_for,
    _tag_name,
    _Width,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import IO, Any

__all__ = ["META_TYPES", "TraceReader", "TraceTail", "events_in_file"]


# -- reader ---------------------------------------------------------------------------


class _Damage(Exception):
    """Internal: damage inside a chunk whose CRC was fine (offset added by the caller)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_map(v: Any, values: Callable[[Any], bool]) -> bool:
    return isinstance(v, dict) and all(values(x) for x in v.values())


#: META keys rethook's readers rely on, with what each must be: a META chunk that gives one
#: of them another type is damage (docs/trace-format.md, 3.1). Other keys are free-form.
META_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "tracer": ("a string", lambda v: isinstance(v, str)),
    "options": ("an object of booleans", lambda v: _is_map(v, lambda x: isinstance(x, bool))),
    "probe_events": ("an object of strings", lambda v: _is_map(v, lambda x: isinstance(x, str))),
    "histograms": ("an object of strings", lambda v: _is_map(v, lambda x: isinstance(x, str))),
}


def _json_kind(v: Any) -> str:
    if v is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (int, "a number"), (float, "a number"),
                       (str, "a string"), (list, "an array"), (dict, "an object")):
        if isinstance(v, kind):
            return name
    return type(v).__name__


def _check_meta(meta: dict[str, Any]) -> None:
    for key, (want, ok) in META_TYPES.items():
        if key in meta and not ok(meta[key]):
            raise _Damage(f"META key {key!r} is {_json_kind(meta[key])}, expected {want}")


def _is_stats(raw: Any) -> bool:
    if not _is_map(raw, lambda counts: _is_map(counts, _is_int)):
        return False
    try:
        for tid in raw:
            int(tid)
    except ValueError:
        return False
    return True


class _Section:
    """One process's part of the file: the string table and format ids its chunks use.

    The first section (before any PROC chunk) is the recording process's own, whose format
    ids are the file's; a later section's formats are mapped onto the file's by name (the
    same format keeps its id; another one gets a free id), so readers see one id space."""

    def __init__(self, pid: int | None, formats: FormatRegistry) -> None:
        self.pid = pid
        self.strings: list[str] = []
        self.formats = formats  # this section's own ids
        self.fids: dict[int, int] = {}  # own id -> the file's, where they differ


class _State:
    """What one pass over the file has learned so far."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.formats = FormatRegistry()
        self.threads: dict[int, str] = {}
        self.stats: dict[int, dict[str, Any]] = {}
        self.events = 0
        self.complete = False
        self.section = _Section(None, self.formats)
        #: pid -> what the file says of that process (PROC info, "meta" of its META chunks)
        self.processes: dict[int, dict[str, Any]] = {}
        self.thread_pids: dict[int, int] = {}  # tid -> pid

    @property
    def strings(self) -> list[str]:
        return self.section.strings

    def begin_process(self, info: dict[str, Any]) -> None:
        pid = info.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            raise _Damage(f"PROC without a pid: {info!r}")
        self.main_process()
        self.section = _Section(pid, FormatRegistry())
        entry = self.processes.setdefault(pid, {"meta": {}})
        entry.update(info)

    def main_process(self) -> None:
        """Name the recording process (its pid is in META) once it is known."""
        pid = self.meta.get("pid")
        if self.section.pid is None and isinstance(pid, int) and not isinstance(pid, bool):
            self.section.pid = pid
            entry = self.processes.setdefault(pid, {"meta": self.meta})
            entry.update(pid=pid, ppid=self.meta.get("ppid"), argv=self.meta.get("argv"),
                         how="main", complete=True)
            for tid, owner in list(self.thread_pids.items()):
                if owner is None:
                    self.thread_pids[tid] = pid

    def add_format(self, fmt: EventFormat) -> None:
        section = self.section
        if section.formats is self.formats:
            self.formats.add(fmt)
            return
        section.formats.add(fmt)
        known = self.formats.get(fmt.id)
        if known is not None and known.name == fmt.name and known.fields == fmt.fields:
            return
        same = next((f for f in self.formats if f.name == fmt.name), None)
        if same is not None and same.fields == fmt.fields:
            section.fids[fmt.id] = same.id
            return
        name = fmt.name if same is None else f"{fmt.name}@{section.pid}"
        fid = fmt.id if known is None else max((f.id for f in self.formats), default=-1) + 1
        self.formats.add(EventFormat(fid, name, fmt.fields))
        if fid != fmt.id:
            section.fids[fmt.id] = fid

    def add_threads(self, threads: dict[int, str]) -> None:
        self.threads.update(threads)
        for tid in threads:
            self.thread_pids[tid] = self.section.pid


def events_in_file(path: str | os.PathLike) -> int:
    """How many events a reader finds in the trace file at ``path``: those of its intact
    chunks, before any damage (0 if it is no trace file or cannot be read)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceFileWarning)
            with TraceReader(path, strict=False) as reader:
                return reader.event_count
    except (TraceFileError, OSError):
        return 0


class TraceReader:
    """Reads a trace file back, streaming.

    ``events()`` decodes one chunk at a time, so a file of any size is read in
    bounded memory. ``meta`` holds the META keys seen so far (all of those
    written before the first events once the reader is open); ``formats``,
    ``threads`` and ``stats`` are complete: reading one of them before a full
    ``events()`` pass has finished makes a quick pass that skips event decoding.

    Damage (truncation, corruption) raises :class:`TraceFileError` once every
    complete chunk before it has been delivered; with ``strict=False`` a
    :class:`TraceFileWarning` is issued instead and reading stops there. The
    error of the last pass is kept in ``damage``.
    """

    def __init__(self, source: str | os.PathLike | IO[bytes], *, strict: bool = True) -> None:
        self._file, self.path, self._owns_file = _open_for(source, "rb")
        self.strict = strict
        self.damage: TraceFileError | None = None
        #: Byte offset of the chunk the events being read come from (for errors a reader's
        #: consumer meets in them).
        self.chunk_offset = HEADER_SIZE
        self._file.seek(0, os.SEEK_END)
        self._size = self._file.tell()
        self._file.seek(0)
        head = self._file.read(HEADER_SIZE)
        if len(head) < HEADER_SIZE and MAGIC.startswith(head[: len(MAGIC)]):
            self._fail_open(f"truncated file header ({len(head)} of {HEADER_SIZE} bytes)")
        if head[: len(MAGIC)] != MAGIC:
            self._fail_open("not a rethook trace file (bad magic)")
        magic, major, minor, crc = _HEADER.unpack(head)
        if zlib.crc32(head[:16]) != crc:
            self._fail_open("corrupt file header (CRC mismatch)")
        if major not in READ_MAJORS:
            self._fail_open(f"unsupported format version {major}.{minor}")
        self.version = (major, minor)
        self._done: _State | None = None
        # read the definitions that precede the first events
        self._leading = _State()
        try:
            for offset, tag, payload in self._chunks():
                if tag in (TAG_EVENTS, TAG_LOST, TAG_STATS, TAG_END):
                    break
                self._apply(self._leading, offset, tag, payload)
        except TraceFileError as exc:
            if self.strict and self._owns_file:
                self._file.close()  # raised from the constructor: nobody else will
            self._report(exc)

    def _fail_open(self, reason: str) -> None:
        if self._owns_file:
            self._file.close()
        raise TraceFileError(self.path, 0, reason)

    # -- public views ---------------------------------------------------------------------

    @property
    def meta(self) -> dict[str, Any]:
        return (self._done or self._leading).meta

    @property
    def all_meta(self) -> dict[str, Any]:
        """Every META key in the file, also those written after the events (a quick pass)."""
        return self._complete().meta

    @property
    def formats(self) -> FormatRegistry:
        return self._complete().formats

    @property
    def threads(self) -> dict[int, str]:
        return self._complete().threads

    @property
    def stats(self) -> dict[int, dict[str, Any]]:
        return self._complete().stats

    @property
    def event_count(self) -> int:
        """Events in the file (before any damage), counted by a quick pass."""
        return self._complete().events

    @property
    def processes(self) -> dict[int, dict[str, Any]]:
        """Every process of the trace by pid: the recording process first, then the ones whose
        sections were appended (PROC chunks), with ``ppid``, ``how`` (main, fork, spawn,
        exec), ``argv``, ``complete`` (its recording had its end), ``note`` and ``meta``."""
        return self._complete().processes

    @property
    def thread_pids(self) -> dict[int, int]:
        """Which process each thread belongs to (tid -> pid)."""
        return self._complete().thread_pids

    def _complete(self) -> _State:
        if self._done is None:
            self.scan()
        elif self.damage is not None and self.strict:
            raise self.damage
        assert self._done is not None
        return self._done

    def scan(self) -> None:
        """Walk the whole file, checking every chunk, without decoding events."""
        for _ in self._pass(decode=False, lost=False):
            pass

    def events(self, lost: bool = False) -> Iterator[Event | Lost]:
        """Every event in file order; with ``lost=True`` also the recorded Lost markers."""
        return self._pass(decode=True, lost=lost)

    def __iter__(self) -> Iterator[Event | Lost]:
        return self.events()

    def ordered_events(self, lost: bool = False, lookahead: bool = False) -> Iterator[Any]:
        """Every event in time order across threads: what the views show.

        The file's own order is time order within each thread only: a recorder drains the
        threads one after another, and an event stamped before a drain round may be written
        after it. So, the way ``trace-cmd report`` merges per-CPU streams, this merges the
        threads' streams by timestamp (ties: the thread met first in the file first), each
        thread's events staying in their recorded order. A first pass notes which threads
        each events chunk holds (decoding only the thread-id columns); the merge then decodes
        each chunk once, when the first of its events is due, and keeps only the events
        decoded but not yet due. With ``lost=True`` each Lost marker comes where it fell in
        its thread's stream. With ``lookahead=True`` each item comes as a pair ``(item,
        next)``: ``next`` is the following item of the same thread (None at its end), which a
        function_graph view needs to tell a leaf call when its entry is due, as the kernel's
        peeks at the next event of the same CPU. Damage ends the first pass: everything
        before it is merged and delivered, then the error is raised (or warned about), as
        with :meth:`events`.
        """
        return chain.from_iterable(self._runs_by_time(lost, lookahead))

    def _runs_by_time(self, lost: bool, lookahead: bool) -> Iterator[list]:
        """:meth:`ordered_events` as runs of one thread's items at a time."""
        state = _State()
        streams: dict[int, list[int | Lost]] = {}  # tid -> chunk offsets and Lost, file order
        chunk_tids: dict[int, set[int]] = {}  # chunk offset -> its threads
        chunk_sections: dict[int, _Section] = {}  # chunk offset -> the process it is of
        damage: TraceFileError | None = None
        try:
            for offset, tag, payload in self._chunks():
                if tag == TAG_EVENTS:
                    try:
                        n, tids = _batch_threads(state.section, payload)
                    except (_Damage, ValueError, struct.error, IndexError) as exc:
                        raise self._bad_chunk(offset, TAG_EVENTS, exc) from None
                    state.events += n
                    chunk_tids[offset] = tids
                    chunk_sections[offset] = state.section
                    for tid in tids:
                        streams.setdefault(tid, []).append(offset)
                elif tag == TAG_LOST:
                    item = self._decode_lost(offset, payload)
                    streams.setdefault(item.tid, []).append(item)
                else:
                    self._apply(state, offset, tag, payload)
        except TraceFileError as exc:
            damage = exc
        parts: dict[int, dict[int, list[Event]]] = {}  # decoded chunks' events not yet due

        def take(offset: int, tid: int) -> list[Event]:
            by_tid = parts.get(offset)
            if by_tid is None:
                payload = self._payload_at(offset)
                try:
                    events = _decode_batch(chunk_sections.pop(offset), payload)
                except (_Damage, ValueError, struct.error, IndexError, KeyError) as exc:
                    raise self._bad_chunk(offset, TAG_EVENTS, exc) from None
                tids = chunk_tids.pop(offset)
                if len(tids) == 1:
                    by_tid = {tid: events}
                else:  # one C-speed pass per thread
                    column = list(map(itemgetter(2), events))
                    by_tid = {t: list(compress(events, map(eq, column, repeat(t)))) for t in tids}
                parts[offset] = by_tid
            mine = by_tid.pop(tid, [])
            if not by_tid:
                del parts[offset]
            return mine

        try:
            yield from _merge_by_time(streams, take, lost, lookahead)
        except TraceFileError as exc:  # a chunk whose thread ids were fine but not the rest
            damage = exc
        self._done = state
        self.damage = damage
        if damage is not None:
            self._report(damage)

    def _payload_at(self, offset: int) -> memoryview:
        """The payload of the (already checked) chunk at ``offset``."""
        f = self._file
        f.seek(offset)
        _tag, length = _CHUNK_HEAD.unpack(f.read(_CHUNK_HEAD.size))
        return memoryview(f.read(length))

    # -- passes ---------------------------------------------------------------------------

    def _pass(self, decode: bool, lost: bool) -> Iterator[Event | Lost]:
        state = _State()
        try:
            for offset, tag, payload in self._chunks():
                if tag == TAG_EVENTS:
                    if decode:
                        self.chunk_offset = offset
                        yield from self._decode_events(state, offset, payload)
                    else:
                        state.events += _U32.unpack_from(payload)[0] if len(payload) >= 4 else 0
                elif tag == TAG_LOST:
                    item = self._decode_lost(offset, payload)
                    if lost:
                        yield item
                else:
                    self._apply(state, offset, tag, payload)
        except TraceFileError as exc:
            self.damage = exc
            self._done = state
            self._report(exc)
            return
        self.damage = None
        self._done = state

    def _report(self, exc: TraceFileError) -> None:
        if self.strict:
            raise exc
        warnings.warn(str(exc), TraceFileWarning, stacklevel=3)

    def _error(self, offset: int, reason: str, truncated: bool = False) -> TraceFileError:
        return TraceFileError(self.path, offset, reason, truncated)

    def _bad_chunk(self, offset: int, tag: bytes, exc: Exception) -> TraceFileError:
        return self._error(offset, f"bad {_tag_name(tag)} chunk: {exc}")

    def _chunks(self) -> Iterator[tuple[int, bytes, memoryview]]:
        """Yield ``(offset, tag, payload)`` of each intact chunk, up to END."""
        f = self._file
        offset = HEADER_SIZE
        size = self._size
        while True:
            if offset == size:
                raise self._error(offset, "file ends without an END chunk", truncated=True)
            f.seek(offset)  # passes may interleave on the one file object
            head = f.read(_CHUNK_HEAD.size)
            if len(head) < _CHUNK_HEAD.size:
                raise self._error(offset, "truncated chunk header", truncated=True)
            tag, length = _CHUNK_HEAD.unpack(head)
            end = offset + _CHUNK_HEAD.size + length + _CRC.size
            if length > MAX_CHUNK_PAYLOAD or end > size:
                raise self._error(
                    offset,
                    f"truncated or corrupt chunk {_tag_name(tag)}"
                    f" (needs {end - offset} bytes, the file has {size - offset} left)",
                    truncated=length <= MAX_CHUNK_PAYLOAD,  # a chunk cut short by the end
                )
            body = f.read(length + _CRC.size)
            if len(body) < length + _CRC.size:
                raise self._error(offset, f"truncated chunk {_tag_name(tag)}")
            payload = memoryview(body)[:length]
            if zlib.crc32(payload, zlib.crc32(head)) != _CRC.unpack_from(body, length)[0]:
                raise self._error(offset, f"corrupt chunk {_tag_name(tag)} (CRC mismatch)")
            yield offset, tag, payload
            if tag == TAG_END:
                if end != size:
                    raise self._error(end, "data after the END chunk")
                return
            offset = end

    def _apply(self, state: _State, offset: int, tag: bytes, payload: memoryview) -> None:
        """Take in a definition chunk (anything but events and Lost markers)."""
        try:
            _apply_chunk(state, tag, payload)
        except (_Damage, ValueError, TypeError, AttributeError, struct.error, IndexError) as exc:
            raise self._bad_chunk(offset, tag, exc) from None

    def _decode_lost(self, offset: int, payload: memoryview) -> Lost:
        try:
            tid, count = _LOST.unpack(payload)
        except struct.error as exc:
            raise self._bad_chunk(offset, TAG_LOST, exc) from None
        return Lost(tid, count)

    def _decode_events(self, state: _State, offset: int, payload: memoryview) -> Iterator[Event]:
        try:
            events = _decode_batch(state.section, payload)
        except (_Damage, ValueError, struct.error, IndexError, KeyError) as exc:
            raise self._bad_chunk(offset, TAG_EVENTS, exc) from None
        state.events += len(events)
        return iter(events)

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_file:
            self._file.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- chunk decoders ---------------------------------------------------------------------


def _apply_chunk(state: _State, tag: bytes, payload: memoryview) -> None:
    """Take in a definition chunk (anything but events and Lost markers); other tags are
    chunks added by later minor versions, skipped. Raises on a chunk that breaks a rule."""
    import json  # (the readers'; writing needs none: jsontext)

    if tag == TAG_META:
        meta = json.loads(bytes(payload).decode("utf-8", "surrogatepass"))
        if not isinstance(meta, dict):
            raise _Damage(f"META is {_json_kind(meta)}, expected an object")
        _check_meta(meta)
        pid = state.section.pid
        if pid is not None and pid in state.processes and state.processes[pid].get(
                "how") != "main":
            state.processes[pid]["meta"].update(meta)  # a process section's own
        else:
            state.meta.update(meta)
            state.main_process()
    elif tag == TAG_FORMATS:
        for fmt in _decode_formats(payload):
            state.add_format(fmt)
    elif tag == TAG_STRINGS:
        first, strings = _decode_strings(payload)
        if first != len(state.strings):
            raise _Damage(f"string table resumes at {first}, expected {len(state.strings)}")
        state.strings.extend(strings)
    elif tag == TAG_THREADS:
        state.add_threads(_decode_threads(payload))
    elif tag == TAG_STATS:
        raw = json.loads(bytes(payload).decode("utf-8"))
        if not _is_stats(raw):
            raise _Damage("STAT is not an object of per-thread objects of integers")
        state.stats.update({int(tid): dict(counts) for tid, counts in raw.items()})
    elif tag == TAG_PROC:
        info = json.loads(bytes(payload).decode("utf-8"))
        if not isinstance(info, dict):
            raise _Damage(f"PROC is {_json_kind(info)}, expected an object")
        state.begin_process(info)
    elif tag == TAG_END:
        (total,) = _END.unpack(payload)
        if total != state.events:
            raise _Damage(f"END chunk counts {total} events, the file holds {state.events}")
        state.complete = True


class _Cursor:
    """Reads primitives from a payload, raising _Damage when it runs out."""

    __slots__ = ("data", "pos")

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> memoryview:
        start = self.pos
        end = start + n
        if n < 0 or end > len(self.data):
            raise _Damage(f"payload ends {end - len(self.data)} bytes early")
        self.pos = end
        return self.data[start:end]

    def unpack(self, st: struct.Struct) -> tuple:
        return st.unpack(self.take(st.size))

    def byte(self) -> int:
        return self.take(1)[0]

    def text(self) -> str:
        (n,) = self.unpack(_U32)
        return bytes(self.take(n)).decode("utf-8", "surrogatepass")

    def bigint(self) -> int:
        (n,) = self.unpack(_U32)
        if n == 0:
            raise _Damage("empty big integer")
        return int.from_bytes(self.take(n), "little", signed=True)

    def array(self, width: _Width, count: int) -> list[int]:
        arr = array(width.typecode)
        arr.frombytes(self.take(width.size * count))
        if _BIG_ENDIAN_HOST:
            arr.byteswap()
        return arr.tolist()

    def floats(self, count: int) -> list[float]:
        arr = array("d")
        arr.frombytes(self.take(arr.itemsize * count))
        if _BIG_ENDIAN_HOST:
            arr.byteswap()
        return arr.tolist()

    def ints(self, count: int) -> list[int]:
        kind = self.byte()
        if kind == _INT_PLAIN:
            return self.array(self.width(), count)
        if kind == _INT_DELTA:
            (first,) = self.unpack(_I64)
            deltas = self.array(self.width(), count - 1)
            return list(accumulate(deltas, initial=first))
        if kind == _INT_CONST:
            return [self.bigint()] * count
        if kind == _INT_BIG:
            return [self.bigint() for _ in range(count)]
        raise _Damage(f"unknown integer column encoding {kind}")

    def width(self) -> _Width:
        code = self.byte()
        try:
            return _WIDTH_BY_CODE[code]
        except KeyError:
            raise _Damage(f"unknown integer width code {code:#x}") from None

    def end(self) -> None:
        if self.pos != len(self.data):
            raise _Damage(f"{len(self.data) - self.pos} unexpected bytes at the end")


def _decode_formats(payload: memoryview) -> list[EventFormat]:
    cur = _Cursor(payload)
    (count,) = cur.unpack(_U32)
    formats = []
    for _ in range(count):
        (fid,) = cur.unpack(_FORMAT_HEAD)
        name = cur.text()
        (nfields,) = cur.unpack(_U16)
        fields = []
        for _ in range(nfields):
            fname = cur.text()
            code = cur.byte()
            if code >= len(FIELD_TYPES):
                raise _Damage(f"unknown field type code {code}")
            fields.append(Field(fname, FIELD_TYPES[code]))
        formats.append(EventFormat(fid, name, tuple(fields)))
    cur.end()
    return formats


def _decode_strings(payload: memoryview) -> tuple[int, list[str]]:
    cur = _Cursor(payload)
    first, count = cur.unpack(_U32)[0], cur.unpack(_U32)[0]
    lengths = cur.array(_UNSIGNED[2], count)
    blob = bytes(cur.take(sum(lengths)))
    cur.end()
    strings = []
    pos = 0
    for n in lengths:
        strings.append(blob[pos : pos + n].decode("utf-8", "surrogatepass"))
        pos += n
    return first, strings


def _decode_threads(payload: memoryview) -> dict[int, str]:
    cur = _Cursor(payload)
    (count,) = cur.unpack(_U32)
    threads = {}
    for _ in range(count):
        (tid,) = cur.unpack(_TID_NAME)
        threads[tid] = cur.text()
    cur.end()
    return threads


def _skip_column(cur: _Cursor, ftype: str, count: int) -> None:
    """Step over one column of ``count`` values without decoding it."""
    if ftype == "f64":
        cur.take(8 * count)
        return
    kind = cur.byte()
    if kind == _INT_PLAIN:
        cur.take(cur.width().size * count)
    elif kind == _INT_DELTA:
        cur.take(_I64.size)
        cur.take(cur.width().size * (count - 1))
    elif kind == _INT_CONST:
        cur.bigint()
    elif kind == _INT_BIG:
        for _ in range(count):
            cur.bigint()
    else:
        raise _Damage(f"unknown integer column encoding {kind}")


def _batch_head(cur: _Cursor) -> tuple[int, list[tuple[int, int]]]:
    """A batch's event count and its table of (format id, count)."""
    (n,) = cur.unpack(_U32)
    (k,) = cur.unpack(_U16)
    if k == 0 or n == 0 or n > MAX_BATCH_EVENTS:
        raise _Damage(f"batch of {n} events in {k} formats")
    table = [struct.unpack("<II", cur.take(8)) for _ in range(k)]
    if sum(count for _, count in table) != n:
        raise _Damage("format counts do not add up to the batch size")
    return n, table


def _batch_threads(section: _Section, payload: memoryview) -> tuple[int, set[int]]:
    """The number of events of a batch and the thread ids among them (only the thread-id
    columns are decoded)."""
    cur = _Cursor(payload)
    n, table = _batch_head(cur)
    if len(table) > 1:
        _skip_column(cur, "u64", n)
    tids: set[int] = set()
    for fid, count in table:
        fmt = section.formats.get(fid)
        if fmt is None:
            raise _Damage(f"events of undefined format {fid}")
        _skip_column(cur, "u64", count)  # common_ts
        tids.update(cur.ints(count))
        for field in fmt.fields:
            _skip_column(cur, field.type, count)
    cur.end()
    return n, tids


_AFTER_EVERYTHING = 1 << 64  # above any timestamp (u64 nanoseconds)


class _Stream:
    """One thread's events for :func:`_merge_by_time`: its segments (chunk offsets and Lost
    markers, in file order) and the items loaded from them and not yet due, with their merge
    keys."""

    __slots__ = ("tid", "order", "segments", "next", "items", "keys", "pos", "last")

    def __init__(self, tid: int, order: int, segments: list[int | Lost]) -> None:
        self.tid = tid
        self.order = order
        self.segments = segments
        self.next = 0  # the next segment to load
        self.items: list[Event | Lost] = []
        self.keys: list[int] = []  # timestamps of items (a Lost: its next event's)
        self.pos = 0  # the next item due
        # the last timestamp loaded: the key of Lost markers that end a stream (a thread
        # whose stream holds nothing but Lost markers has them merged last)
        self.last = _AFTER_EVERYTHING

    def load(self, take: Callable[[int, int], list[Event]], lost: bool) -> bool:
        """Append the next chunk's events (after the Lost markers before them) to the items
        not yet due; False when the stream has nothing more."""
        pending: list[Lost] = []
        segments = self.segments
        events: list[Event] = []
        while self.next < len(segments) and not events:
            seg = segments[self.next]
            self.next += 1
            if isinstance(seg, Lost):
                if lost:
                    pending.append(seg)
            else:
                events = take(seg, self.tid)
        if not events and not pending:
            return False
        keys = [ev[1] for ev in events]
        if keys:
            self.last = keys[-1]
        first = keys[0] if keys else self.last
        if self.pos:  # drop what is already due
            del self.items[:self.pos], self.keys[:self.pos]
            self.pos = 0
        self.items += pending
        self.items += events
        self.keys += [first] * len(pending)
        self.keys += keys
        return True


def _merge_by_time(streams: dict[int, list[int | Lost]],
                   take: Callable[[int, int], list[Event]],
                   lost: bool, lookahead: bool) -> Iterator[list]:
    """Merge per-thread streams by timestamp (see :meth:`TraceReader.ordered_events`),
    yielding runs of one thread: its items due before the next thread's head (with
    ``lookahead``, as pairs of an item and the next item of its thread, or None)."""
    import bisect
    import heapq  # (start-up: test_startup)

    states = [_Stream(tid, order, segs) for order, (tid, segs) in enumerate(streams.items())]
    heap = [(st.keys[0], st.order) for st in states if st.load(take, lost)]
    heapq.heapify(heap)
    while heap:
        st = states[heap[0][1]]
        if len(heap) > 1:
            key, order = heap[1] if len(heap) == 2 or heap[1] < heap[2] else heap[2]
            # due: up to the next thread's head; at a tie, the thread met first goes first
            due = bisect.bisect_right if st.order < order else bisect.bisect_left
        while True:
            items, keys, pos = st.items, st.keys, st.pos
            end = len(items) if len(heap) == 1 else due(keys, key, pos)
            # the item after the run gives the thread's next key (and the run's last lookahead)
            if end < len(items) or not st.load(take, lost):
                break
        items, pos = st.items, st.pos
        if lookahead:
            yield list(zip_longest(items[pos:end], items[pos + 1:end + 1]))
        else:
            yield items[pos:end] if pos or end < len(items) else items
        st.pos = end
        if end < len(items):
            heapq.heapreplace(heap, (st.keys[end], st.order))
        else:
            heapq.heappop(heap)


def _renumbered(rows: Iterable[tuple], fid: int) -> Iterator[tuple]:
    return ((fid, *row[1:]) for row in rows)


def _decode_batch(section: _Section, payload: memoryview) -> list[Event]:
    """A batch's events, with the file's format ids (``section``: the process it is of)."""
    cur = _Cursor(payload)
    n, table = _batch_head(cur)
    k = len(table)
    order = cur.ints(n) if k > 1 else None
    strings = section.strings
    rows = {}
    for fid, count in table:
        fmt = section.formats.get(fid)
        if fmt is None:
            raise _Damage(f"events of undefined format {fid}")
        columns = [cur.ints(count), cur.ints(count)]
        for field in fmt.fields:
            if field.type == "str":
                columns.append(list(map(strings.__getitem__, cur.ints(count))))
            elif field.type == "f64":
                columns.append(cur.floats(count))
            elif field.type == "bool":
                columns.append(list(map(bool, cur.ints(count))))
            else:
                columns.append(cur.ints(count))
        rows[fid] = zip(repeat(fid, count), *columns, strict=True)
    cur.end()
    fids = section.fids
    if fids and any(fid in fids for fid, _ in table):  # a section's ids that differ
        for fid, _count in table:
            if fid in fids:
                rows[fid] = _renumbered(rows[fid], fids[fid])
    if order is None:
        return list(rows[table[0][0]])
    if len(rows) != k:
        raise _Damage("a format appears twice in the batch table")
    # an order that asks one format for too many events ends the map early (StopIteration);
    # one that names a format the batch lacks raises KeyError
    events = list(map(next, map(rows.__getitem__, order)))
    if len(events) != n:
        raise _Damage("format order column does not match the format counts")
    return events


# -- following a file another process writes ------------------------------------------


class TraceTail:
    """Follows a trace file another process is still writing: each :meth:`read` returns the
    events (and Lost markers) of the complete chunks added since the previous one.
    ``formats`` and ``threads`` grow as the file's definitions arrive; ``done`` is set once
    the END chunk has been read."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path
        self._offset = 0
        self._state = _State()
        self.done = False
        self._file: IO[bytes] | None = None  # kept open: a read is one seek and the reads

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def formats(self) -> FormatRegistry:
        return self._state.section.formats

    @property
    def threads(self) -> dict[int, str]:
        return self._state.threads

    @property
    def meta(self) -> dict[str, Any]:
        return self._state.meta

    def read(self, limit: int | None = None) -> list[Event | Lost]:
        """The items of the complete chunks added since the last read; with ``limit``, the
        reading stops after the chunk that brings the items to ``limit`` or more."""
        out: list[Event | Lost] = []
        if self.done:
            return out
        offset = self._offset
        state = self._state
        try:
            if self._file is None:
                self._file = open(self.path, "rb")  # noqa: SIM115 - closed by close()/done
            for tag, raw in _chunks_of(self._file, offset):
                if limit is not None and len(out) >= limit:
                    break
                offset = (offset or HEADER_SIZE) + len(raw)
                payload = memoryview(raw)[_CHUNK_HEAD.size:-_CRC.size]
                if tag == TAG_EVENTS:
                    out += _decode_batch(state.section, payload)
                elif tag == TAG_LOST:
                    out.append(Lost(*_LOST.unpack(payload)))
                elif tag == TAG_END:
                    self.done = True
                elif tag in (TAG_META, TAG_FORMATS, TAG_STRINGS, TAG_THREADS):
                    _apply_chunk(state, tag, payload)
        except (OSError, _Damage, ValueError, TypeError, struct.error, KeyError, IndexError):
            self.done = True  # gone or damaged: what was read is what there is
        self._offset = offset
        if self.done:
            self.close()
        return out
