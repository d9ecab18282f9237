"""The binary trace file: :class:`TraceWriter` writes it, :class:`TraceReader` streams it back.

The format is specified byte by byte in docs/trace-format.md; this module is
its reference implementation. In short: a 20-byte header, then self-delimiting
chunks, each ``tag, length, payload, CRC-32``. Event batches are stored column
by column per event format, every integer column in the narrowest fixed width
that holds it (timestamps as deltas), every string as an index into a string
table that grows in ``STR`` chunks. Encoding is done with C-level bulk
operations (``map``/``itemgetter`` to pull columns, :mod:`array` to pack them),
which is what lets pure Python write a million events in well under a second.

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
import warnings
import zlib
from array import array
from itertools import accumulate, chain, compress, islice, repeat, zip_longest
from operator import eq, itemgetter, sub

from rethook import jsontext
from rethook.buffer.events import (
    COMMON_COUNT,
    FIELD_TYPES,
    Event,
    EventFormat,
    Field,
    FormatRegistry,
    Lost,
)
from rethook.buffer.native import consumed_items
from rethook.frozen import Row

TYPE_CHECKING = False
if TYPE_CHECKING:
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
        if array(tc).itemsize == size:
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


def _pack(values: list, n: int, guess: _Width | None) -> tuple[_Width | None, array | None]:
    """Pack ints in the narrowest width: start from the guess, let array() verify it."""
    if guess is not None:
        try:
            return guess, array(guess.typecode, values)
        except OverflowError:
            pass  # the sample missed the extremes
    width = _narrowest(min(values), max(values))
    if width is None:
        return None, None
    return width, array(width.typecode, values)


def _array_bytes(arr: array) -> bytes:
    if _BIG_ENDIAN_HOST:
        arr = array(arr.typecode, arr)
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
                    out.append(_array_bytes(array("d", values)))
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
        lengths = array(_UNSIGNED[2].typecode, map(len, raw))
        if first is None:
            first = len(self._strings) - len(strings)
        head = _U32.pack(first) + _U32.pack(len(strings))
        self._chunk(TAG_STRINGS, head + _array_bytes(lengths) + b"".join(raw))

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
    they grow (:class:`TraceTail`)."""
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
