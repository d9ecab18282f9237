"""The binary trace file: its layout, and :class:`TraceWriter`, which writes it
(:mod:`rethook.buffer.traceread` reads it back).

The format is specified byte by byte in docs/trace-format.md; this module and traceread are
its reference implementation. In short: a 20-byte header, then self-delimiting
chunks, each ``tag, length, payload, CRC-32``. Event batches are stored column
by column per event format, every integer column in the narrowest fixed width
that holds it (timestamps as deltas), every string as an index into a string
table that grows in ``STR`` chunks. The C encoder (``_tfenc``) writes the usual batches;
the Python encoding below, the reference it is checked against, uses C-level bulk
operations (``map``/``itemgetter`` to pull columns, :mod:`array` to pack them).

Damage is reported as :class:`TraceFileError`, naming the file and the byte
offset of the first damaged chunk; everything before it is still read.
"""

from __future__ import annotations

import _thread
import io
import os
import stat
import struct
import sys
import zlib
from _operator import eq, itemgetter, sub
from itertools import compress, islice, repeat

from rethook import jsontext
from rethook.buffer.events import (
    COMMON_COUNT,
    FIELD_TYPES,
    Event,
    EventFormat,
    FormatRegistry,
    Lost,
)
from rethook.buffer.native import consumed_items
from rethook.frozen import Row

TYPE_CHECKING = False
if TYPE_CHECKING:
    from array import array
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from typing import IO, Any

#: First bytes of every trace file: a non-ASCII byte, the name, and line-ending bytes
#: that a text-mode transfer would mangle (the PNG trick).
MAGIC = b"\x89rethook\r\n\x1a\n"

#: Version written: readers accept any minor version of their major version, and version 1
#: (2.0 added process sections, PROC chunks, which change what the chunks after them mean).
VERSION_MAJOR = 2
VERSION_MINOR = 0
READ_MAJORS = (1, 2)

_HEADER = struct.Struct("<12sHHI")  # magic, major, minor, CRC-32 of the first 16 bytes
_CHUNK_HEAD = struct.Struct("<4sI")  # tag, payload length
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size
CHUNK_OVERHEAD = _CHUNK_HEAD.size + _CRC.size

#: Larger payloads are treated as damage rather than allocated.
MAX_CHUNK_PAYLOAD = 1 << 30

#: Most events one EVTS chunk may hold (a reader refuses more: constant columns make
#: events nearly free in bytes, so the count alone must be bounded).
MAX_BATCH_EVENTS = 1 << 24

#: Events per EVTS chunk by default: big enough to amortise the per-chunk work, small
#: enough that damage costs little and readers stream in modest steps.
DEFAULT_BATCH_EVENTS = 65536

TAG_META = b"META"
TAG_FORMATS = b"FMT "
TAG_STRINGS = b"STR "
TAG_THREADS = b"THRD"
TAG_EVENTS = b"EVTS"
TAG_LOST = b"LOST"
TAG_STATS = b"STAT"
TAG_END = b"END "
TAG_PROC = b"PROC"

# integer column encodings
_INT_PLAIN = 0
_INT_DELTA = 1
_INT_CONST = 2
_INT_BIG = 3

#: Columns are sampled at about this many points to guess their width before packing.
_WIDTH_SAMPLES = 64

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_TID_NAME = struct.Struct("<q")
_LOST = struct.Struct("<qQ")
_END = struct.Struct("<Q")
_FORMAT_HEAD = struct.Struct("<I")

_TYPE_CODES = {name: code for code, name in enumerate(FIELD_TYPES)}
_BIG_ENDIAN_HOST = sys.byteorder == "big"


def _tag_name(tag: bytes) -> str:
    return repr(tag.decode("latin-1"))


class TraceFileError(Exception):
    """A trace file is damaged (truncated, corrupt) or not a trace file at all.

    ``truncated`` says the damage is only that the file stops early (its writer was killed,
    or is still writing): every chunk in it is intact, it just has no END."""

    def __init__(self, path: str, offset: int, reason: str, truncated: bool = False) -> None:
        super().__init__(f"{path}: {reason} (at byte offset {offset})")
        self.path = path
        self.offset = offset
        self.reason = reason
        self.truncated = truncated


class TraceFileWarning(UserWarning):
    """Damage met by a reader opened with ``strict=False``."""


# -- integer widths -------------------------------------------------------------------


class _Width(Row):  # (a Row: a dataclass costs ~1 ms of every start-up)
    code: int  # the byte in the file: size in bytes, | 0x80 when signed
    typecode: str  # the array typecode with that size and signedness
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.code & 0x0F


def _typecode(size: int, signed: bool) -> str:
    for tc in "bhilq" if signed else "BHILQ":
        if struct.calcsize(tc) == size:  # (the native sizes: an array's itemsize)
            return tc
    raise RuntimeError(f"no array typecode of {size} bytes on this platform")


_UNSIGNED = tuple(
    _Width(size, _typecode(size, False), 0, (1 << (8 * size)) - 1) for size in (1, 2, 4, 8)
)
_SIGNED = tuple(
    _Width(0x80 | size, _typecode(size, True), -(1 << (8 * size - 1)), (1 << (8 * size - 1)) - 1)
    for size in (1, 2, 4, 8)
)
_WIDTH_BY_CODE = {w.code: w for w in _UNSIGNED + _SIGNED}
_I64_MIN, _I64_MAX = _SIGNED[3].lo, _SIGNED[3].hi

# The optional C twin of _encode_group's column encoding (same bytes; it declines what it
# does not handle). Imported here, after the constants it checks against its own.
try:
    from rethook.buffer import _tfenc
except ImportError:
    _tfenc = None

#: ``os.read(fd, n)`` for a descriptor that never blocks, without letting the GIL go where the
#: C encoder is built: read by the drain thread between its rounds (the signal wakeup pipe),
#: where each release hands the GIL to the program, which keeps it until the drain asks back.
read_held: Callable[[int, int], bytes] = getattr(_tfenc, "read_held", os.read)


def _narrowest(lo: int, hi: int) -> _Width | None:
    """The smallest width holding [lo, hi], or None beyond 64 bits."""
    for width in _UNSIGNED if lo >= 0 else _SIGNED:
        if width.lo <= lo and hi <= width.hi:
            return width
    return None


def _sample_width(values: list, n: int) -> _Width | None:
    """Guess a column's width from about _WIDTH_SAMPLES evenly spread values."""
    step = n // _WIDTH_SAMPLES
    sample = values[::step] if step > 1 else values
    return _narrowest(min(sample), max(sample))


def _array(typecode: str, values: Iterable = ()) -> array:
    """``array.array(typecode, values)``, its module imported at the first use: it imports
    collections (~1.7 ms of a start-up), and the C encoder, which writes the usual batches,
    needs neither."""
    from array import array

    return array(typecode, values)


def _pack(values: list, n: int, guess: _Width | None) -> tuple[_Width | None, array | None]:
    """Pack ints in the narrowest width: start from the guess, let array() verify it."""
    if guess is not None:
        try:
            return guess, _array(guess.typecode, values)
        except OverflowError:
            pass  # the sample missed the extremes
    width = _narrowest(min(values), max(values))
    if width is None:
        return None, None
    return width, _array(width.typecode, values)


def _array_bytes(arr: array) -> bytes:
    if _BIG_ENDIAN_HOST:
        arr = _array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def _bigint(value: int) -> bytes:
    if not isinstance(value, int):
        raise TypeError(f"expected int, got {value!r}")
    raw = value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
    return _U32.pack(len(raw)) + raw


def _text(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogatepass")
    return _U32.pack(len(raw)) + raw


def _deltas_stay_i64(values: list, n: int, dwidth: _Width) -> bool:
    """Whether every value fits i64, as the DELTA encoding promises readers."""
    reach = (n - 1) * max(-dwidth.lo, dwidth.hi)
    first = values[0]
    if _I64_MIN <= first - reach and first + reach <= _I64_MAX:
        return True  # no run of such steps can leave the range: no need to look
    return _I64_MIN <= min(values) and max(values) <= _I64_MAX


def _encode_ints(values: list, out: list[bytes], try_delta: bool) -> None:
    """Append one integer column to ``out`` (see "Integer columns" in the format doc)."""
    n = len(values)
    first = values[0]
    if values[-1] == first and values.count(first) == n:
        out += (bytes((_INT_CONST,)), _bigint(first))
        return
    guess = _sample_width(values, n)
    if try_delta and (guess is None or guess.size == 8) and _I64_MIN <= first <= _I64_MAX:
        # wide values (timestamps): the differences between neighbours are usually narrow
        deltas = list(map(sub, islice(values, 1, None), values))
        dwidth, dpacked = _pack(deltas, n - 1, _sample_width(deltas, n - 1))
        if dwidth is not None and dwidth.size < 8 and _deltas_stay_i64(values, n, dwidth):
            out += (bytes((_INT_DELTA,)), _I64.pack(first), bytes((dwidth.code,)))
            out.append(_array_bytes(dpacked))
            return
    width, packed = _pack(values, n, guess)
    if width is None:
        big = [_bigint(value) for value in values]
        out.append(bytes((_INT_BIG,)))
        out += big
        return
    out += (bytes((_INT_PLAIN, width.code)), _array_bytes(packed))


# -- writer ---------------------------------------------------------------------------

def _iov_max() -> int:
    """Most pieces one os.writev takes (POSIX guarantees 16; Linux takes 1024)."""
    try:
        n = os.sysconf("SC_IOV_MAX")
    except (AttributeError, ValueError, OSError):
        return 16
    return min(n, 1024) if n > 0 else 16


_IOV_MAX = _iov_max()

#: Bytes of output a native record usually takes in an event chunk (a function_graph trace
#: takes about 6.5): what prepare_native sizes write_native's output buffer for.
_OUT_BYTES_PER_RECORD = 8


def _open_for(target: str | os.PathLike | IO[bytes], mode: str) -> tuple[IO[bytes], str, bool]:
    """Return (file, name for messages, whether we opened it)."""
    if isinstance(target, str | os.PathLike):
        return open(target, mode), os.fspath(target), True
    return target, str(getattr(target, "name", "<stream>")), False


class TraceWriter:
    """Writes a trace file.

    ``meta`` is any JSON-serialisable mapping (tracer name, options, command
    line, start time...). ``formats``, when given, is consulted for event
    formats that events use but that were not added with :meth:`add_format` --
    hand it the trace's live :class:`FormatRegistry` and formats registered while
    tracing are written as they first appear. A file object passed in is
    flushed but not closed by :meth:`close`.
    """

    def __init__(
        self,
        file: str | os.PathLike | IO[bytes],
        meta: Mapping[str, Any] | None = None,
        *,
        formats: FormatRegistry | Iterable[EventFormat] | None = None,
        batch_events: int = DEFAULT_BATCH_EVENTS,
    ) -> None:
        self._file, self.name, self._owns_file = _open_for(file, "wb")
        self._registry = formats if isinstance(formats, FormatRegistry) else None
        self._batch = min(max(1, int(batch_events)), MAX_BATCH_EVENTS)
        self._formats: dict[int, EventFormat] = {}  # written, or pending in _new_formats
        self._new_formats: list[EventFormat] = []
        self._strings: dict[str, int] = {}
        self._threads: dict[int, str] = {}
        self._new_threads: dict[int, str] = {}
        self._new_meta: dict[str, Any] = {}
        self._events = 0
        self._closed = False
        self._sections = False  # append_process was called: the file's own events are over
        self._sections_lost = 0  # events the appended sections' LOST chunks count
        self._gathered: list[bytes] | None = None  # chunks held for one write (write_native)
        self._scratch_used = False  # the C encoder keeps memory for write_native
        # write_native's names table, kept between its calls (_tfenc.NameCache): a code's name
        # is fixed for a recording, so name_of runs once per code, not once per code per round
        self._names: Any = None
        self._out = bytearray()  # write_native's output buffer, kept between calls
        # an unbuffered file: write_native writes its chunks with one os.writev, uncopied;
        # to a regular file, with the GIL held (_tfenc.write_held says why)
        self._writev = type(self._file) is io.FileIO and hasattr(os, "writev")
        self._held = (self._writev and _tfenc is not None and hasattr(_tfenc, "write_held")
                      and stat.S_ISREG(os.fstat(self._file.fileno()).st_mode))
        # held by write_native for its whole call, and by close(): a close() from another
        # thread waits for the call, which may be writing its chunks with the GIL released;
        # one from the call's own thread (its name_of) is done when the call ends
        self._native_lock = _thread.RLock()
        self._native_depth = 0
        self._close_pending = False
        self._release_memory = True  # (close()'s)
        try:
            head = _HEADER.pack(MAGIC, VERSION_MAJOR, VERSION_MINOR, 0)[:16]
            self._write(head + _CRC.pack(zlib.crc32(head)))
            self._chunk(TAG_META, self._meta_payload(dict(meta or {})))
            if formats is not None and self._registry is None:
                for fmt in formats:
                    self.add_format(fmt)
        except BaseException:
            if self._owns_file:
                self._file.close()
            raise

    # -- definitions ------------------------------------------------------------------

    def add_format(self, fmt: EventFormat) -> None:
        """Define an event format (written before the first events that use it)."""
        old = self._formats.get(fmt.id)
        if old is not None:
            if old != fmt:
                raise ValueError(f"format id {fmt.id} is already defined as {old}")
            return
        self._formats[fmt.id] = fmt
        self._new_formats.append(fmt)

    def set_thread_name(self, tid: int, name: str) -> None:
        """Name a thread; a later name for the same tid replaces the earlier one."""
        if not _I64_MIN <= tid <= _I64_MAX:
            raise ValueError(f"thread id {tid} does not fit 64 bits")
        if not isinstance(name, str):
            raise TypeError(f"thread name must be a str, got {name!r}")
        if self._threads.get(tid) != name:
            self._threads[tid] = name
            self._new_threads[tid] = name

    def set_meta(self, key: str, value: Any) -> None:
        """Add or replace one META key (written with the next chunk)."""
        self._new_meta[key] = value

    # -- process sections -----------------------------------------------------------------

    def append_process(self, source: str | os.PathLike,
                       info: Mapping[str, Any]) -> tuple[int, bool]:
        """Append another process's trace file as a section of this one: a PROC chunk with
        ``info`` (``pid`` at least), then the source's chunks copied verbatim, up to its END
        (not copied) or its last complete chunk. Returns (events copied, whether the source
        had its END). After the first section this writer writes no events of its own.
        """
        self._check_open()
        self._flush_definitions()
        self._sections = True
        events = 0
        complete = False
        info = dict(info)
        chunks = list(iter_chunks(source))
        for tag, _raw in chunks:
            if tag == TAG_END:
                complete = True
        info.setdefault("complete", complete)
        self._chunk(TAG_PROC, jsontext.dumps(info, default=str).encode())
        for tag, raw in chunks:
            if tag == TAG_END:
                break
            if tag == TAG_EVENTS:
                events += _U32.unpack_from(raw, _CHUNK_HEAD.size)[0]
            elif tag == TAG_LOST:
                self._sections_lost += _LOST.unpack_from(raw, _CHUNK_HEAD.size)[1]
            self._file.write(raw)
        self._events += events
        return events, complete

    def has_string(self, value: str) -> bool:
        """Whether ``value`` is in the file's string table (some event holds it)."""
        return value in self._strings

    # -- events ---------------------------------------------------------------------------

    def write_events(self, events: Iterable[Event | Lost]) -> int:
        """Write events (and :class:`Lost` markers) in order; returns how many events."""
        self._check_open()
        self._check_own_section()
        written = 0
        if isinstance(events, list):
            for start in range(0, len(events), self._batch):
                written += self._write_batch(events[start : start + self._batch])
            return written
        it = iter(events)
        while batch := list(islice(it, self._batch)):
            written += self._write_batch(batch)
        return written

    def write_lost(self, tid: int, count: int) -> None:
        """Record that ``count`` events of thread ``tid`` were lost at this point."""
        self._check_open()
        self._flush_definitions()
        self._chunk(TAG_LOST, _LOST.pack(tid, count))

    def write_native(self, ring: Any, tid: int, name_of: Callable[[Any], str]) -> int:
        """Consume every record of a native ring and write the events they are; returns
        how many events.

        ``ring`` is a thread's C ring (``rethook.buffer._cring.Ring``). The file gets what
        ``write_events(native.consumed_items(ring.consume(tid, name_of), tid))`` writes --
        the same chunks, Lost markers, string table entries and batches -- and the ring is
        left as that consume leaves it. With the C encoder (:mod:`rethook.buffer._tfenc`)
        and the built-in layouts for formats 1-5, the records are encoded in C from the
        ring, with no event tuple per record -- a call of many records with the GIL
        released once the ring's array is taken out with them (the ring goes on in a spare
        one), so the program runs meanwhile (``_tfenc.c``, "The detached drain"). Such a
        call also writes its chunks to a regular file itself (the STR chunks of the strings
        it adds among them), still without the GIL, when nothing must come before them (a
        loss to report, a definition); otherwise the chunks of the call go to the file in
        one write, the GIL held (the drain thread of ``rethook record``: each time it lets
        the GIL go, a CPU-bound program keeps it a switch interval once the drain wants it
        back, filling the ring meanwhile). The caller's ring may then have a new array, of
        the same size. Otherwise it is that very call. One thread at a time may use a writer;
        :meth:`close` from another thread waits for a call in progress to end, and one
        from ``name_of`` takes effect when the call ends.

        The C encoder keeps the names between calls (a ``_tfenc.NameCache``, released by
        :meth:`close`, holding the codes it names): a code's name is fixed for a recording
        (the registry's ``name``), so ``name_of`` is called once per code this writer meets,
        not once per code per call. It must name a code the same way every time; another
        ``name_of`` (not the same function, or method of the same object) starts afresh.
        """
        with self._native_lock:
            self._native_depth += 1
            try:
                return self._write_native(ring, tid, name_of)
            finally:
                self._native_depth -= 1
                if self._close_pending and not self._native_depth:
                    self._close_pending = False
                    self._close()

    def _write_native(self, ring: Any, tid: int, name_of: Callable[[Any], str]) -> int:
        self._check_open()
        self._check_own_section()
        if not self._native_encodable():
            return self.write_events(consumed_items(ring.consume(tid, name_of), tid))
        new_strings: list[str] = []
        self._scratch_used = True
        names = self._names
        if names is None:
            names = self._names = _tfenc.NameCache()
        # The call may write its chunks to the file itself, without the GIL, when nothing
        # this writer holds must come first (a definition not written yet)
        fd = -1
        if self._held and not (self._new_meta or self._new_formats or self._new_threads):
            fd = self._file.fileno()
        defined = sum(1 << fid for fid in self._formats if type(fid) is int and 0 <= fid < 64)
        lost_before, lost_after, batches, events, written = _tfenc.encode_ring(
            ring, tid, name_of, self._strings, new_strings, self._batch, names, fd, defined)
        if batches is None:  # records only the tuple path writes (a PRINT event...)
            return self.write_events(consumed_items((lost_before, events, lost_after), tid))
        written = written or 0  # the events of the chunks the call wrote (then batches: [])
        self._events += written
        self._gathered = []
        try:
            if lost_before:
                self.write_lost(tid, lost_before)
            first = len(self._strings) - len(new_strings)  # the index of new_strings[0]
            done = 0  # of new_strings, defined in the file
            try:
                for payload, crc, fids, added in batches:
                    for fid in fids:
                        self._format_for(fid)
                    self._flush_definitions()
                    if added:
                        self._write_strings(new_strings[done : done + added], first + done)
                    done += added
                    self._chunk(TAG_EVENTS, payload, crc)
                    count = _U32.unpack_from(payload)[0]
                    self._events += count
                    written += count
            except BaseException:
                names.forget_strings(first + done)  # the indices it holds for them
                for value in new_strings[done:]:  # never written: forget them, as
                    del self._strings[value]  # _write_batch does
                raise
            if lost_after:
                self.write_lost(tid, lost_after)
        finally:
            gathered, self._gathered = self._gathered, None
            if gathered:
                self._write_gathered(gathered)
        return written

    def _write_gathered(self, parts: list[bytes]) -> None:
        """Write chunks in one call: to an unbuffered file with one writev, else through a
        buffer kept for the next time (a new one of a round's size, a megabyte or so, would
        be paged in at every round)."""
        if self._held:
            _tfenc.write_held(self._file.fileno(), parts)
            return
        if self._writev:
            fd = self._file.fileno()
            while parts:  # the whole of parts, in at most IOV_MAX pieces a call
                done = os.writev(fd, parts[:_IOV_MAX])
                if done <= 0:
                    raise OSError(f"{self.name}: nothing written")
                while parts and done >= len(parts[0]):
                    done -= len(parts[0])
                    del parts[0]
                if done:  # a short write, mid-piece
                    parts[0] = parts[0][done:]
            return
        total = sum(map(len, parts))
        out = self._out
        if len(out) < total:
            out = self._out = bytearray(total + total // 2)
        pos = 0
        for part in parts:
            end = pos + len(part)
            out[pos:end] = part
            pos = end
        with memoryview(out) as view:
            self._write(view[:total])

    def prepare_native(self, records: int) -> None:
        """Get ready to :meth:`write_native` rings of up to ``records`` records: the memory
        the C encoder and the output buffer need, and the rings' spare array (the one a
        ring gets when the encoder takes its array out), allocated now (MemoryError here, not
        in the middle of a recording), not paged in: their pages are met as they are used,
        a ring's array ahead of the program's writes (``_tfenc.reserve``)."""
        if not self._native_encodable():
            return
        records = max(0, int(records))
        _tfenc.reserve(records, self._batch)
        self._scratch_used = True  # close() frees what reserve() kept
        size = records * _OUT_BYTES_PER_RECORD
        if not self._writev and len(self._out) < size:
            self._out = bytearray(size)

    def _native_encodable(self) -> bool:
        """Whether write_native can encode records in C: the C encoder is built and formats
        1-5 are (or would be, when first used) the layouts it encodes."""
        if _tfenc is None or not hasattr(_tfenc, "encode_ring"):
            return False
        for fid, types in _tfenc.RING_LAYOUTS.items():
            fmt = self._formats.get(fid)
            if fmt is None and self._registry is not None:
                fmt = self._registry.get(fid)
            if fmt is None or tuple(field.type for field in fmt.fields) != types:
                return False
        return True

    def _write_batch(self, batch: list) -> int:
        try:
            fids = list(map(itemgetter(0), batch))
        except (TypeError, IndexError):
            return self._write_mixed(batch)
        distinct = set(fids)
        if len(distinct) == 1:
            groups = {fids[0]: batch}
        else:  # one pass per format, at C speed (formats keep their first-seen order)
            groups = {fid: list(compress(batch, map(eq, fids, repeat(fid))))
                      for fid in dict.fromkeys(fids)}
        formats = [self._format_for(fid) for fid in groups]
        payload: list[bytes] = [_U32.pack(len(batch)), _U16.pack(len(groups))]
        payload += [struct.pack("<II", fmt.id, len(groups[fmt.id])) for fmt in formats]
        if len(groups) > 1:  # which format each event is, in order
            if _tfenc is None or not _tfenc.encode_ints(fids, payload, False):
                _encode_ints(fids, payload, False)
        new_strings: list[str] = []
        try:
            for fmt in formats:
                self._encode_group(fmt, groups[fmt.id], payload, new_strings)
        except BaseException:
            if self._names is not None and new_strings:  # write_native's indices of them
                self._names.forget_strings(len(self._strings) - len(new_strings))
            for value in new_strings:  # never written: forget them, or later batches would
                del self._strings[value]  # point at strings the file does not have
            raise
        self._flush_definitions()
        if new_strings:
            self._write_strings(new_strings)
        self._chunk(TAG_EVENTS, b"".join(payload))
        self._events += len(batch)
        return len(batch)

    def _write_mixed(self, batch: list) -> int:
        """A batch with Lost markers (or junk): write the runs of events between them."""
        written = 0
        run: list = []
        for item in batch:
            if isinstance(item, Lost):
                if run:
                    written += self._write_batch(run)
                    run = []
                self.write_lost(item.tid, item.count)
            elif isinstance(item, tuple) and len(item) >= COMMON_COUNT:
                run.append(item)
            else:
                raise TypeError(f"not an event tuple or Lost: {item!r}")
        if run:
            written += self._write_batch(run)
        return written

    def _format_for(self, fid: Any) -> EventFormat:
        fmt = self._formats.get(fid)
        if fmt is None:
            fmt = self._registry.get(fid) if self._registry is not None else None
            if fmt is None:
                raise ValueError(f"event format id {fid!r} was not added to this trace writer")
            self.add_format(fmt)
        return fmt

    def _encode_group(
        self, fmt: EventFormat, group: list, out: list[bytes], new_strings: list[str]
    ) -> None:
        types = ("u64", "s64", *(f.type for f in fmt.fields))
        strings = self._strings
        if _tfenc is not None and _tfenc.encode_group(group, types, strings, new_strings, out):
            return  # the bytes of the code below, which runs when the C encoder declines
        arity = fmt.arity
        if sum(map(len, group)) != arity * len(group):
            self._bad_length(fmt, group)
        columns = ("common_ts", "common_tid", *fmt.field_names)
        for index, (name, ftype) in enumerate(zip(columns, types, strict=True), start=1):
            values = list(map(itemgetter(index), group))
            try:
                if ftype == "str":
                    self._encode_strings(values, out, new_strings)
                elif ftype == "f64":
                    out.append(_array_bytes(_array("d", values)))
                elif ftype == "bool":
                    try:
                        _encode_ints(values, out, False)
                    except TypeError:
                        _encode_ints(list(map(bool, values)), out, False)
                else:
                    _encode_ints(values, out, True)
            except IndexError:  # a short event (the length sum matched by chance)
                self._bad_length(fmt, group)
            except (TypeError, OverflowError) as exc:
                raise TypeError(f"format {fmt.name}, field {name} ({ftype}): {exc}") from None

    @staticmethod
    def _bad_length(fmt: EventFormat, group: list) -> None:
        bad = next(ev for ev in group if len(ev) != fmt.arity)
        raise ValueError(f"event {bad!r} does not have the {fmt.arity} items of format {fmt.name}")

    def _encode_strings(self, values: list, out: list[bytes], new_strings: list[str]) -> None:
        ids = self._strings
        try:
            indices = list(map(ids.__getitem__, values))
        except KeyError:
            for value in dict.fromkeys(values):  # first-seen order keeps files reproducible
                if value not in ids:
                    if not isinstance(value, str):
                        raise TypeError(f"expected str, got {value!r}") from None
                    value = str(value)  # a str subclass is stored as plain str
                    ids[value] = len(ids)
                    new_strings.append(value)
            indices = list(map(ids.__getitem__, values))
        _encode_ints(indices, out, False)

    # -- other chunks -----------------------------------------------------------------------

    def write_stats(self, stats: dict[int, Mapping[str, int]] | Iterable[Any]) -> None:
        """Record per-thread counters: ``{tid: {"written": n, "lost": n, ...}}``, or
        :class:`~rethook.buffer.ring.ThreadStats` items (counts of equal tids add up)."""
        self._check_open()
        table: dict[int, dict[str, Any]] = {}
        if isinstance(stats, dict):
            table = {int(tid): dict(counts) for tid, counts in stats.items()}
        else:
            for item in stats:
                counts = item._asdict()
                tid = counts.pop("tid")
                counts.pop("finished", None)
                name = counts.pop("name", None)
                if name is not None:
                    self.set_thread_name(tid, name)
                into = table.setdefault(tid, {})
                for key, value in counts.items():
                    into[key] = into.get(key, 0) + value
        self._flush_definitions()
        body = {str(tid): counts for tid, counts in table.items()}
        self._chunk(TAG_STATS, jsontext.dumps(body, sort_keys=True).encode())

    def _flush_definitions(self) -> None:
        if self._new_meta:
            meta, self._new_meta = self._new_meta, {}
            self._chunk(TAG_META, self._meta_payload(meta))
        if self._new_formats:
            formats, self._new_formats = self._new_formats, []
            parts = [_U32.pack(len(formats))]
            for fmt in formats:
                parts += (_FORMAT_HEAD.pack(fmt.id), _text(fmt.name), _U16.pack(len(fmt.fields)))
                for field in fmt.fields:
                    parts += (_text(field.name), bytes((_TYPE_CODES[field.type],)))
            self._chunk(TAG_FORMATS, b"".join(parts))
        if self._new_threads:
            threads, self._new_threads = self._new_threads, {}
            parts = [_U32.pack(len(threads))]
            for tid, name in threads.items():
                parts += (_TID_NAME.pack(tid), _text(name))
            self._chunk(TAG_THREADS, b"".join(parts))

    def _write_strings(self, strings: list[str], first: int | None = None) -> None:
        """A STR chunk defining ``strings``, the table's newest entries unless ``first`` says
        where they start."""
        raw = [s.encode("utf-8", "surrogatepass") for s in strings]
        lengths = struct.pack(f"<{len(raw)}I", *map(len, raw))
        if first is None:
            first = len(self._strings) - len(strings)
        head = _U32.pack(first) + _U32.pack(len(strings))
        self._chunk(TAG_STRINGS, head + lengths + b"".join(raw))

    @staticmethod
    def _meta_payload(meta: Mapping[str, Any]) -> bytes:
        return jsontext.dumps(meta, default=str, ensure_ascii=False).encode("utf-8",
                                                                          "surrogatepass")

    def _chunk(self, tag: bytes, payload: bytes, crc: int | None = None) -> None:
        """Write a chunk (``crc``: of its head and payload, when the caller has it)."""
        if len(payload) > MAX_CHUNK_PAYLOAD:
            raise ValueError(f"chunk of {len(payload)} bytes: lower batch_events")
        head = _CHUNK_HEAD.pack(tag, len(payload))
        gathered = self._gathered
        if gathered is not None:  # held for one write, the GIL kept (see write_native)
            if crc is None:
                crc = _tfenc.crc32(payload, _tfenc.crc32(head))
            gathered += (head, payload, _CRC.pack(crc))
            return
        if crc is None:
            crc = zlib.crc32(payload, zlib.crc32(head))
        write = self._write
        write(head)
        write(payload)
        write(_CRC.pack(crc))

    def _write(self, data: bytes | memoryview) -> None:
        """Write all of ``data``: an unbuffered file takes what it can in one call (up to a
        size limit, or a full disk), and the rest is written again, to get the error."""
        done = self._file.write(data)
        if done is None or done >= len(data):
            return
        with memoryview(data) as view:
            while done < len(view):
                n = self._file.write(view[done:])
                if not n:
                    raise OSError(f"{self.name}: nothing written")
                done += n

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.name}: trace writer is closed")

    def _check_own_section(self) -> None:
        if self._sections:
            raise ValueError(f"{self.name}: other processes' sections follow: no more events")

    # -- lifetime -----------------------------------------------------------------------------

    @property
    def events_written(self) -> int:
        return self._events

    @property
    def sections_lost(self) -> int:
        """Events the appended processes' sections say were lost (their LOST chunks)."""
        return self._sections_lost

    def flush(self) -> None:
        """Write pending definitions and flush the file."""
        self._check_open()
        self._flush_definitions()
        self._file.flush()

    def close(self, release_memory: bool = True) -> None:
        """Write the END chunk and close (only a file this writer opened). Idempotent. A
        :meth:`write_native` call in another thread ends first. ``release_memory=False``:
        the process is ending, and the memory the C encoder keeps (its scratch areas and the
        rings' spare array, paged in) goes with it; freeing it gives it back page by page
        (~1.4 ms for the default buffer)."""
        self._release_memory = release_memory
        with self._native_lock:
            if self._native_depth:  # from write_native's own name_of: once it ends
                self._close_pending = True
                return
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        try:
            self._flush_definitions()
            self._chunk(TAG_END, _END.pack(self._events))
            self._file.flush()
        finally:
            self._closed = True
            if self._owns_file:
                self._file.close()
            if self._scratch_used and self._release_memory:
                _tfenc.free_scratch()  # what encode_ring keeps between calls
            names, self._names = self._names, None
            if names is not None:
                names.clear()  # the codes it holds

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_trace(
    file: str | os.PathLike | IO[bytes],
    buffer: Any,
    formats: FormatRegistry | Iterable[EventFormat],
    meta: Mapping[str, Any] | None = None,
) -> int:
    """Save what a :class:`~rethook.buffer.ring.TraceBuffer` holds (the ``trace`` view),
    its thread table and its per-thread counters. Returns the number of events."""
    with TraceWriter(file, meta, formats=formats) as writer:
        for tid, name in buffer.threads().items():
            writer.set_thread_name(tid, name)
        count = writer.write_events(buffer.iter_trace())
        writer.write_stats(buffer.stats())
    return count


# -- reading chunks as they are ------------------------------------------------------------


def iter_chunks(source: str | os.PathLike, start: int = 0) -> Iterator[tuple[bytes, bytes]]:
    """``(tag, raw chunk bytes)`` of each intact chunk of a trace file, from ``start`` (0: the
    first chunk, after checking the header) up to its END chunk or its last complete chunk,
    whichever comes first. A file still being written (or cut short) just ends the iteration:
    this is how a finished run's process files are merged, and how they are followed while
    they grow (:class:`~rethook.buffer.traceread.TraceTail`)."""
    with open(source, "rb") as f:
        yield from _chunks_of(f, start)


def _chunks_of(f: IO[bytes], start: int) -> Iterator[tuple[bytes, bytes]]:
    """:func:`iter_chunks` of an open file."""
    if start == 0:
        f.seek(0)
        head = f.read(HEADER_SIZE)
        if len(head) < HEADER_SIZE or head[: len(MAGIC)] != MAGIC \
                or zlib.crc32(head[:16]) != _CRC.unpack_from(head, 16)[0]:
            return
        start = HEADER_SIZE
    f.seek(start)
    while True:
        head = f.read(_CHUNK_HEAD.size)
        if len(head) < _CHUNK_HEAD.size:
            return
        tag, length = _CHUNK_HEAD.unpack(head)
        if length > MAX_CHUNK_PAYLOAD:
            return
        body = f.read(length + _CRC.size)
        if len(body) < length + _CRC.size:
            return
        if zlib.crc32(memoryview(body)[:length], zlib.crc32(head)) \
                != _CRC.unpack_from(body, length)[0]:
            return
        yield tag, head + body
        if tag == TAG_END:
            return

