"""The trace ring buffer: one bounded buffer per thread, like the kernel's per-CPU buffers.

Writers
    A tracer gets the calling thread's buffer once (``buf = tb.local()``) and
    caches ``append = buf.append``; after that recording an event is one call
    that appends to a Python list and compares its length with a limit. All the
    bookkeeping (page switches, overwrite, drops, the ``tracing_on`` gate) happens
    in a slow path entered once per page, or once per batch of refused events
    while a non-overwriting buffer is full.

Pages and sequence numbers
    Each thread's events live in a deque of pages, like the kernel's page list.
    Every event made while tracing is on gets the next sequence number of its
    thread, so each page is ``(first_seq, [events])`` and a lost event is just a
    sequence number that no page holds. This is what lets readers in other
    threads account for loss exactly without the writer ever taking a lock:
    entries written = next sequence number - sequence number at the last clear;
    lost = written - entries in the buffer - entries consumed by the pipe.

Capacity
    ``size_kb`` is per thread, like the kernel's ``buffer_size_kb``. The byte
    budget is turned into events with a nominal event size,
    :data:`NOMINAL_EVENT_BYTES`; one page of it is reserved for the page being
    filled, a few events for counting refused ones, and the rest is
    :attr:`TraceBuffer.capacity`, the most events a thread's buffer ever holds
    for readers. Overwrite mode keeps the newest
    ``capacity`` events (the oldest are lost); non-overwrite mode refuses new
    events while ``capacity`` unread events are held (the newest are lost).

Readers
    :meth:`TraceBuffer.snapshot` / :meth:`TraceBuffer.iter_trace` are the
    ``trace`` file: everything held, all threads merged by timestamp, nothing
    consumed. :meth:`TraceBuffer.pipe` is ``trace_pipe``: a consuming reader that
    blocks until events arrive and reports gaps as :class:`Lost` items (loss
    after a thread's last event too, so a pipe read to the end has reported
    every lost event).

Ordering guarantee
    Within one thread, readers see events in the order they were appended,
    always. Across threads, every read merges the events it collects by
    timestamp, so a snapshot is fully ordered by timestamp. A pipe orders each
    batch it collects; an event appended after a batch was read but stamped
    before it (its writer was preempted between stamping and appending) comes
    in a later batch, so across batches the order is per thread only -- the
    same caveat as the kernel's trace_pipe.

Fork
    In a fork child only the forking thread exists, and what the buffers hold is the
    parent's to deliver: every TraceBuffer keeps that thread's buffer (tracers have cached its
    ``append`` and its C ring), emptied, its counters reset and its ``tid`` the child's,
    and forgets the others (:meth:`TraceBuffer._after_fork_in_child`).

Threads
    The writer's fast path takes no lock; everything else (the writer's slow
    path, readers, resize, clear, the gate) holds the thread buffer's lock. A buffer must be
    appended to only by its own thread. Buffers of threads that have ended stay
    readable until :meth:`TraceBuffer.clear`.

The native half
    Native tracers (written in C) do not append tuples: they write fixed-size records
    into a C ring (:mod:`rethook.buffer._cring`, layout and writer in ``cring.h``), one per
    thread, which :meth:`TraceBuffer.native_local` creates and attaches to the thread's
    ThreadBuffer -- so a thread is still one buffer to count, list and name. A C ring is a
    plain array indexed by sequence number; its accounting is the same as above (head,
    floor, clear and read positions, refused records counted), kept by its own methods,
    which run under the GIL and need no lock. It gets the same ``size_kb`` byte budget,
    in records of :data:`~rethook.buffer.native.RECORD_BYTES` bytes (fewer bytes than a
    Python event, so more of them). Every reader merges a thread's native records with
    its Python events by timestamp (native first at equal timestamps), turning them into
    the same event tuples the Python tracers append, with names from the ``name_of``
    given to ``native_local``; counters add up both halves; the configuration
    (``tracing_on``, overwrite, resize, clear) applies to both. A pipe read reports a
    ring's loss as two Lost items around its records: the overwritten ones before, the
    refused ones after (refused records get no sequence number, so where among the
    records they fell is not known). Native writers do not wake
    blocked pipe readers: while a native ring exists the pipe polls more often
    (:data:`NATIVE_PIPE_POLL_SECONDS`).

    A reader that writes a trace file need not turn records into tuples at all:
    :meth:`TracePipe.read_or_feed` hands each thread whose read is only native records to
    the caller (``TraceWriter.write_native``, which encodes them in C straight into the
    file's event chunks); the other threads' reads are merged as above.
"""

from __future__ import annotations

import os
import threading
import time
from _collections import deque  # (collections itself: ~1.7 ms of every start-up)
from _operator import itemgetter
from _weakref import ref  # (weakref, which re-exports it and WeakSet: ~0.5 ms of a start-up)
from _weakrefset import WeakSet
from itertools import zip_longest
from types import CodeType

from rethook.buffer import native as _native
from rethook.buffer.events import Event, Lost
from rethook.engine.core import notrace
from rethook.frozen import Row

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

#: Nominal memory of one event, used to turn ``size_kb`` into an event count: a 6-item
#: event tuple (88 bytes with its GC header), one fresh int for the timestamp (32 bytes;
#: small ints and interned strings are shared) and the 8-byte slot in its page.
NOMINAL_EVENT_BYTES = 128

#: The kernel's default ``buffer_size_kb``.
DEFAULT_SIZE_KB = 1408

#: Pages a buffer is split into (page size shrinks for small buffers, capped below).
PAGES_PER_BUFFER = 16

#: Upper bound of events per page: bounds the copy made when the oldest page is trimmed.
MAX_PAGE_EVENTS = 4096

#: While a full non-overwriting buffer refuses events, they are counted in batches of this
#: many (fewer for small pages); a reader that makes room ends the batch at once.
DROP_BATCH_EVENTS = 64

#: How often a blocked pipe reader looks for events in pages that are still being filled
#: (completed pages wake it at once).
PIPE_POLL_SECONDS = 0.05

#: How often a blocked pipe reader looks for events while native rings exist: their writers
#: never wake it, and a ring of the default size fills in a few ms at native speeds. When it
#: wakes, a CPU-bound program keeps the GIL for up to a switch interval (5 ms) more: the
#: ring must hold what the program makes in both (the recorder's first read of a call storm).
NATIVE_PIPE_POLL_SECONDS = 0.001
#: How long the recorder's drain waits between two rounds at most while only native rings
#: write (TracePipe.read_or_feed): the C core's wait ends as soon as a ring is a quarter full
#: (cring.h's wake mark) or the drain is stopped, so this only bounds how long the records
#: of a slow writer wait to be written, and how often the drain looks at the hook and at
#: signals between rounds.
NATIVE_DRAIN_WAIT_SECONDS = 0.05
#: How recent a thread's native records must be for it to count as writing: with two or more
#: such threads and blocking off, the drain's rounds come first (TracePipe.read_or_feed,
#: engine/_ccore.c)
WRITERS_SECONDS = 0.1

# Where appends go while tracing is off: a deque that keeps nothing, so a cached append
# stays valid and costs the same whether or not tracing is on.
_SINK: deque = deque(maxlen=0)


def buffer_geometry(size_kb: int) -> tuple[int, int]:
    """Return ``(capacity, page_events)`` for a per-thread budget of ``size_kb`` KiB.

    The budget holds ``capacity`` events for readers, plus the page being filled and
    one batch of refused events being counted: a thread's buffer never keeps more
    than ``size_kb`` KiB of events at the nominal size (see ThreadBuffer.held_events).
    """
    if not isinstance(size_kb, int) or isinstance(size_kb, bool) or size_kb < 1:
        raise ValueError(f"buffer size must be a positive number of KiB, got {size_kb!r}")
    budget = max(3, size_kb * 1024 // NOMINAL_EVENT_BYTES)
    page_events = max(1, min(MAX_PAGE_EVENTS, budget // (PAGES_PER_BUFFER + 1)))
    return budget - page_events - _drop_batch(page_events), page_events


def _drop_batch(page_events: int) -> int:
    return min(DROP_BATCH_EVENTS, page_events)


class BufferStats(Row):
    """Counts since the last clear, as tracefs shows them."""

    entries: int  #: events held and not yet consumed ("entries-in-buffer")
    written: int  #: events made while tracing was on ("entries-written"), lost ones included
    lost: int  #: events overwritten (overwrite mode) or refused (buffer full)
    read: int  #: events consumed by pipe readers


class ThreadStats(Row):
    """One thread's :class:`BufferStats`, with the thread's identity."""

    tid: int
    name: str
    entries: int
    written: int
    lost: int
    read: int
    finished: bool


def _make_writer(slow: Callable[[], None]) -> tuple[Callable[[Event], None], Callable]:
    """Build the hot append function and the setter that points it at a page.

    A closure, not a method: its state lives in cells, which is a few ns cheaper
    per call than attribute lookups on an instance.
    """
    page: list | deque = _SINK
    limit = 1

    def append(event: Event) -> None:
        p = page
        p.append(event)
        if len(p) >= limit:
            slow()

    def retarget(new_page: list | deque, new_limit: int) -> None:
        nonlocal page, limit
        # limit first: a writer racing with us then sees the new page only with the new limit
        limit = new_limit
        page = new_page

    return append, retarget


class ThreadBuffer:
    """The ring buffer of one thread. Get it with :meth:`TraceBuffer.local`.

    ``append(event)`` is the hot path; cache it, and call it only from this
    thread. ``tid`` is the thread's native id, the value tracers put in the
    events' ``tid`` field. The ring's own code must not be traced into it (its
    locks are not reentrant), which the engine's recursion guard ensures.
    """

    __slots__ = (
        "append",
        "tid",
        "_ident",
        "finished",
        "_retarget",
        "_owner",
        "_name",
        "_thread",
        "_lock",
        "_pages",
        "_closed",
        "_live",
        "_live_base",
        "_scratch",
        "_dropping",
        "_drop_base",
        "_dropped",
        "_read_pos",
        "_fed_at",
        "_clear_seq",
        "_floor",
        "_consumed",
        "_native",
        "__weakref__",
    )

    def __init__(self, owner: TraceBuffer, tid: int, thread: threading.Thread | None,
                 ident: int | None = None) -> None:
        self._owner = owner
        self.tid = tid
        self._ident = ident  # to find the Thread object later if it did not exist yet
        self._thread = ref(thread) if thread is not None else None
        self._name = thread.name if thread is not None else f"tid-{tid}"
        self.finished = False
        self._lock = threading.Lock()
        self._live: list = []
        self._live_base = 0
        self._pages: deque[tuple[int, list]] = deque([(0, self._live)])
        self._closed = 0  # events held in pages other than the live one
        self._scratch: list = []  # receives appends while a full non-overwrite buffer drops
        self._dropping = False
        self._drop_base = 0  # sequence number of the first dropped event of this episode
        self._dropped = 0  # events dropped in this episode (scratch not yet counted)
        self._read_pos = 0  # next sequence number the pipe will consume
        self._clear_seq = 0  # sequence number at the last clear: counters start here
        self._floor = 0  # events below this are gone (resize, overwrite switched off)
        self._consumed = 0
        self._native = None  # the thread's C ring (a _cring.Ring), once native_local made it
        self._fed_at = 0.0  # time.monotonic() of the last drain round that fed its ring
        self.append, self._retarget = _make_writer(self._slow)
        with self._lock:
            self._poke()

    @property
    def native(self) -> Any:
        """The thread's C ring (``rethook.buffer._cring.Ring``), or None if no native user
        has written from this thread (see :meth:`TraceBuffer.native_local`)."""
        return self._native

    @property
    def name(self) -> str:
        """The thread's current name (its last name once it has ended)."""
        if self._thread is None and self._ident is not None and not self.finished:
            thread = _known_thread(self._ident)
            if thread is not None:
                self._thread = ref(thread)
        thread = self._thread() if self._thread is not None else None
        if thread is not None:
            self._name = thread.name
        return self._name

    # -- writer side -----------------------------------------------------------------

    def _slow(self) -> None:
        """Called by ``append`` when the current page reached its limit (writer thread)."""
        owner = self._owner
        with self._lock:
            completed = self._writer_step()
        if completed and owner._waiting:
            owner._wake()

    def _writer_step(self) -> bool:
        """Account for what was appended and point the writer at the right page.

        Runs only in the owning thread (under the lock), because only there can no
        append be in flight: that is what makes it safe to give sequence numbers
        to new pages and to move events between pages. Returns True when a page
        was completed, so blocked pipe readers can be woken.
        """
        owner = self._owner
        capacity, page_events, overwrite = owner._capacity, owner._page_events, owner._overwrite
        completed = False
        self._rebase_live()
        if self._dropping:
            scratch = self._scratch
            if overwrite or self._unconsumed() < capacity:
                # room again (a reader consumed, a clear, or overwrite was switched on):
                # those poke us, so the event that found the room is the last one in
                # scratch; the ones before it came while the buffer was full.
                found_room = scratch[-1:]
                self._dropped += len(scratch) - len(found_room)
                scratch.clear()
                self._dropping = False
                self._open_page(self._drop_base + self._dropped, found_room)
                completed = True
            else:
                self._dropped += len(scratch)
                scratch.clear()
                self._set_target()
                return False
        live = self._live
        if overwrite:
            if len(live) >= page_events:
                self._open_page(self._live_base + len(live), [])
                completed = True
                self._cut_to(capacity)
            self._set_target(page_events)
            return completed
        self._cut_to(None)
        room = capacity - self._unconsumed()
        if room <= 0:
            excess = 0
            if room < 0:
                # more than capacity: appends that were in flight while a resize or an
                # overwrite switch cut the buffer down. They are the newest, all in the
                # live page: drop them, as this mode drops the newest.
                excess = min(-room, len(live) - self._below_start(self._live_base, len(live)))
                del live[len(live) - excess :]
            self._dropping = True
            self._drop_base = self._live_base + len(live)
            self._dropped = excess
            self._set_target()
            return True  # full: wake readers, they make room
        if len(live) >= page_events:
            self._open_page(self._live_base + len(live), [])
            completed = True
            live = self._live
        self._set_target(len(live) + min(page_events - len(live), room))
        return completed

    def _set_target(self, limit: int | None = None) -> None:
        """Point the writer at the page its next appends go to, and say how many it may
        append there before calling the slow path again (None: a dropping batch)."""
        if not self._owner._on:
            self._retarget(_SINK, 1)
        elif self._dropping:
            # refused events are only counted, a batch at a time
            batch = _drop_batch(self._owner._page_events) if limit is None else limit
            self._retarget(self._scratch, batch)
        else:
            self._retarget(self._live, max(1, limit or 1))

    def _poke(self) -> None:
        """From any thread: make the writer's next append take the slow path.

        Other threads never renumber pages (the owner may be mid-append); they only
        make the owner re-examine its state on its next event.
        """
        self._set_target(1)

    def _rebase_live(self) -> None:
        """Drop consumed or cleared events from the front of the live page (writer only:
        the copy replaces the list appends go to)."""
        skip = self._below_start(self._live_base, len(self._live))
        if skip:
            self._live = self._live[skip:]
            self._live_base += skip
            self._pages[-1] = (self._live_base, self._live)

    def _open_page(self, base: int, events: list) -> None:
        self._closed += len(self._live)
        self._live = events
        self._live_base = base
        self._pages.append((base, events))

    # -- shared bookkeeping (caller holds the lock) ---------------------------------------

    def _start(self) -> int:
        """The lowest sequence number still visible."""
        return max(self._floor, self._clear_seq, self._read_pos)

    def _below_start(self, base: int, n: int) -> int:
        return min(max(self._start() - base, 0), n)

    def _next_seq(self, live_len: int | None = None) -> int:
        if self._dropping:
            return self._drop_base + self._dropped + len(self._scratch)
        return self._live_base + (len(self._live) if live_len is None else live_len)

    def _unconsumed(self) -> int:
        """Events held at or above the start (ignoring the overwrite window)."""
        base, events = self._pages[0]
        return self._closed + len(self._live) - self._below_start(base, len(events))

    def _cut_to(self, keep: int | None) -> None:
        """Free pages (or the front of the oldest page) below the start, and in front of
        the newest ``keep`` events. The live page is never cut: the writer appends to it.
        """
        pages = self._pages
        start = self._start()
        total = self._closed + len(self._live)
        while len(pages) > 1:
            base, events = pages[0]
            n = len(events)
            remove = min(max(start - base, 0), n)
            if keep is not None:
                remove = max(remove, min(total - keep, n))
            if remove >= n:
                pages.popleft()
                self._closed -= n
                total -= n
                continue
            if remove > 0:
                # a new list: readers may still hold the old one
                pages[0] = (base + remove, events[remove:])
                self._closed -= remove
            break

    def _visible(self) -> tuple[list[tuple[int, list]], int]:
        """The events readers see, as ``(first_seq, events)`` segments, and the next seq."""
        owner = self._owner
        live = self._live
        live_copy = live[:]  # the only page still growing: freeze it
        start = self._start()
        segments = []
        for base, events in self._pages:
            if events is live:
                events = live_copy
            skip = start - base
            if skip >= len(events):
                continue
            if skip > 0:
                events = events[skip:]
                base = start
            segments.append((base, events))
        if owner._overwrite:
            # only the newest `capacity` events are in the ring; older ones were overwritten
            excess = sum(len(e) for _, e in segments) - owner._capacity
            while excess > 0 and segments:
                base, events = segments[0]
                if len(events) <= excess:
                    excess -= len(events)
                    segments.pop(0)
                else:
                    segments[0] = (base + excess, events[excess:])
                    excess = 0
        return segments, self._next_seq(len(live_copy))

    def _window_floor(self, keep: int) -> int:
        """The sequence number below which all but the newest ``keep`` events lie."""
        segments, next_seq = self._visible()
        held = sum(len(e) for _, e in segments)
        for base, events in segments:
            if held - len(events) < keep:
                return base + (held - keep if held > keep else 0)
            held -= len(events)
        return next_seq

    # -- reader side (any thread) --------------------------------------------------------

    @property
    def held_events(self) -> int:
        """Events physically in memory: the ones readers see, plus overwritten or consumed
        ones not reclaimed yet, plus refused ones being counted. At most ``capacity +
        page_events + min(DROP_BATCH_EVENTS, page_events)``, the ``size_kb`` budget --
        except after a resize that shrinks the pages, until the thread's next append
        (only the owning thread may cut the page it appends to). The native ring, if any,
        is not counted: it is a fixed array of ``native_capacity`` records."""
        with self._lock:
            return self._closed + len(self._live) + len(self._scratch)

    # The C ring is read outside the lock: its methods are atomic under the GIL, and building
    # its tuples may run a GC finalizer, which must not find this buffer's lock held.

    def stats(self) -> ThreadStats:
        """Counters since the last clear, both halves added up."""
        with self._lock:
            segments, next_seq = self._visible()
            entries = sum(len(e) for _, e in segments)
            written = next_seq - self._clear_seq
            read = self._consumed
        lost = written - entries - read
        ring = self._native
        if ring is not None:
            n_entries, n_written, n_lost, n_read = ring.stats()
            entries, written, lost, read = (entries + n_entries, written + n_written,
                                            lost + n_lost, read + n_read)
        return ThreadStats(self.tid, self.name, entries, written, lost, read, self.finished)

    def events(self) -> list[Event]:
        """A copy of the events held, oldest first (by timestamp, native records merged in),
        without consuming them."""
        with self._lock:
            segments, _ = self._visible()
        out: list[Event] = []
        for _, events in segments:
            out += events
        ring = self._native
        if ring is None:
            return out
        return _native.merge_events(
            ring.events(self.tid, self._owner._name_of), out)

    def _consume(self) -> list[Event | Lost]:
        """Take every visible event, with ``Lost`` items where sequence numbers skip.

        Loss after the last event (a full non-overwrite buffer still refusing) is
        reported too, so a pipe that reads to the end has seen every lost event.
        Native records are merged in by timestamp, with their own Lost items (see
        :func:`rethook.buffer.native.consumed_items`).
        """
        return self._consume_native(self._consume_python())

    def _consume_native(self, items: list[Event | Lost]) -> list[Event | Lost]:
        """The second half of :meth:`_consume`: the native ring's records (decoded) merged
        into ``items``, the Python events just consumed."""
        ring = self._native
        if ring is None:
            return items
        native = _native.consumed_items(ring.consume(self.tid, self._owner._name_of), self.tid)
        if not native:
            return items
        if not items:
            return native
        import heapq  # (start-up: test_startup)

        merged = heapq.merge(_keyed_by_time(native), _keyed_by_time(items), key=itemgetter(0))
        return [item for _, item in merged]

    def _consume_python(self) -> list[Event | Lost]:
        with self._lock:
            segments, next_seq = self._visible()
            items: list[Event | Lost] = []
            pos = self._read_pos
            taken = 0
            for base, events in segments:
                if not events:
                    continue
                if base > pos:
                    items.append(Lost(self.tid, base - pos))
                items += events
                taken += len(events)
                pos = base + len(events)
            if next_seq > pos:
                items.append(Lost(self.tid, next_seq - pos))
                pos = next_seq
            if not items:
                return items
            self._read_pos = pos
            self._consumed += taken
            self._cut_to(None)
            if self._dropping:
                self._poke()  # there is room now: the next event must not be refused
        return items

    def _clear(self) -> None:
        with self._lock:
            seq = self._next_seq()
            self._clear_seq = seq
            self._read_pos = seq
            self._consumed = 0
            self._pages = deque([(self._live_base, self._live)])
            self._closed = 0
            if self._dropping:
                self._poke()  # room again
        if self._native is not None:
            self._native.clear()  # releases code objects: not under the lock

    def __repr__(self) -> str:
        return f"<ThreadBuffer tid={self.tid} name={self.name!r}>"


def _known_thread(ident: int) -> threading.Thread | None:
    """The Thread object of a thread threading knows (not ``current_thread()``, which makes a
    dummy one for a thread still starting up or not started by threading at all)."""
    return threading._active.get(ident)  # type: ignore[attr-defined]


class _ThreadToken:
    """Lives in the owning thread's thread-local storage; dies when the thread ends, and
    marks the thread's buffer finished then (not a weakref.finalize: the weakref module is
    ~0.5 ms of a start-up)."""

    __slots__ = ("buf",)

    def __init__(self, buf: ThreadBuffer) -> None:
        self.buf = buf

    def __del__(self) -> None:
        self.buf.finished = True


class _Reconfiguring:
    """``with buffer._reconfiguring() as buffers:`` (TraceBuffer's): its lock and every
    thread buffer's held for the block; on a normal exit the writers are poked, then the
    locks released, newest first."""

    def __init__(self, owner: TraceBuffer) -> None:
        self._owner = owner
        self._held: list[Any] = []

    def __enter__(self) -> list[ThreadBuffer]:
        owner = self._owner
        owner._lock.acquire()
        self._held.append(owner._lock)
        try:
            for buf in owner._buffers:
                buf._lock.acquire()
                self._held.append(buf._lock)
        except BaseException:
            self._release()
            raise
        return owner._buffers

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                for buf in self._owner._buffers:
                    buf._poke()
        finally:
            self._release()

    def _release(self) -> None:
        while self._held:
            self._held.pop().release()


class TraceBuffer:
    """Per-thread trace ring buffers with tracefs-like accounting and two readers.

    ``size_kb`` is each thread's budget (like ``buffer_size_kb``, per CPU there);
    ``overwrite`` chooses between dropping the oldest events when full (True, the
    kernel's default) and refusing the newest (False). Native tracers write into C
    rings attached to the same per-thread buffers (:meth:`native_local`).
    """

    def __init__(self, size_kb: int = DEFAULT_SIZE_KB, overwrite: bool = True) -> None:
        self._capacity, self._page_events = buffer_geometry(size_kb)
        self._size_kb = size_kb
        self._overwrite = bool(overwrite)
        self._on = True
        self._lock = threading.Lock()  # guards the buffer list and configuration changes
        self._buffers: list[ThreadBuffer] = []
        self._tls = threading.local()
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0  # blocked pipe readers; writers only signal when there are some
        self._pipe_lock = threading.Lock()  # one consuming read at a time
        self._native_capacity = _native.native_capacity(size_kb)
        self._name_of: _native.NameOf = _native.default_name_of
        self._poll_seconds = PIPE_POLL_SECONDS  # NATIVE_PIPE_POLL_SECONDS once a ring exists
        self._writers = 0  # threads whose native records a round fed in WRITERS_SECONDS
        self._python_at = float("-inf")  # when a round of read_or_feed last had Python items
        _live_buffers.add(self)

    # -- writers --------------------------------------------------------------------------

    def local(self) -> ThreadBuffer:
        """The calling thread's buffer, created on first use. Cache ``.append``."""
        try:
            return self._tls.buf
        except AttributeError:
            return self._attach()

    def _attach(self) -> ThreadBuffer:
        # rethook's own work, even when the program calls local() itself: the Python code
        # run here (the Thread's name) traced would have a user write its first event from
        # this thread, and come back here for its buffer (native_local), to wait on the lock
        # this holds
        with notrace():
            ident = threading.get_ident()
            thread = _known_thread(ident)
            with self._lock:
                buf = ThreadBuffer(self, threading.get_native_id(), thread, ident)
                self._buffers.append(buf)
            self._tls.token = _ThreadToken(buf)
            self._tls.buf = buf
        return buf

    def append(self, event: Event) -> None:
        """Append to the calling thread's buffer (convenient; tracers cache ``local().append``)."""
        self.local().append(event)

    @staticmethod
    def native_available() -> bool:
        """Whether native rings can be made (the ``_cring`` extension is built)."""
        return _native.NATIVE_AVAILABLE

    def native_local(self, name_of: Callable[[CodeType], str]) -> Any:
        """The calling thread's C ring (a ``rethook.buffer._cring.Ring``), created on first
        use and attached to the thread's buffer (:meth:`local`). Native tracers write into
        it from C; cache it per thread, like ``local().append``.

        ``name_of(code) -> str`` names the records' code objects when they are read (the
        registry's ``name``); the last one given is used for every thread's ring. Raises
        :class:`~rethook.buffer.native.NativeRingUnavailable` (an ImportError) if the
        extension is not built: check :meth:`native_available` first.
        """
        self._name_of = name_of
        buf = self.local()
        ring = buf._native
        if ring is None:
            ring_type = _native.ring_type()
            with self._lock:  # no configuration change between reading it and attaching
                ring = ring_type(self._native_capacity, buf.tid)
                ring.on = self._on
                ring.overwrite = self._overwrite
                buf._native = ring
                first = self._poll_seconds != NATIVE_PIPE_POLL_SECONDS
                self._poll_seconds = NATIVE_PIPE_POLL_SECONDS
            if first and self._waiting:
                self._wake()  # a reader asleep for the Python rings' poll: look every ms now
        return ring

    # -- configuration ----------------------------------------------------------------------

    @property
    def size_kb(self) -> int:
        return self._size_kb

    @property
    def capacity(self) -> int:
        """Most events one thread's buffer holds for readers."""
        return self._capacity

    @property
    def page_events(self) -> int:
        return self._page_events

    @property
    def native_capacity(self) -> int:
        """Most records one thread's native ring holds: the same ``size_kb`` budget, in
        records of :data:`~rethook.buffer.native.RECORD_BYTES` bytes."""
        return self._native_capacity

    @property
    def overwrite(self) -> bool:
        return self._overwrite

    @overwrite.setter
    def overwrite(self, value: bool) -> None:
        with self._reconfiguring() as buffers:
            value = bool(value)
            if not value and self._overwrite:
                for buf in buffers:
                    # what the ring had already overwritten stays lost
                    buf._floor = max(buf._floor, buf._window_floor(self._capacity))
                    buf._cut_to(None)
            self._overwrite = value
            for buf in buffers:
                if buf._native is not None:
                    buf._native.overwrite = value

    @property
    def tracing_on(self) -> bool:
        return self._on

    @tracing_on.setter
    def tracing_on(self, value: bool) -> None:
        """The ``tracing_on`` gate: while off, appends are not made (nor counted)."""
        with self._reconfiguring() as buffers:
            self._on = bool(value)
            for buf in buffers:
                if buf._native is not None:
                    buf._native.on = self._on

    def resize(self, size_kb: int) -> None:
        """Change every thread's budget. Shrinking keeps the newest events; the older
        ones that no longer fit are counted as lost. Native rings too."""
        capacity, page_events = buffer_geometry(size_kb)
        native_capacity = _native.native_capacity(size_kb)
        with self._reconfiguring() as buffers:
            # The native rings first, each resized whole or not at all: if one cannot get
            # its memory, those already resized go back (one that had shrunk keeps only
            # what the smaller size held) and the size stays as it was.
            resized = []
            try:
                for buf in buffers:
                    if buf._native is not None:
                        buf._native.resize(native_capacity)
                        resized.append(buf._native)
            except MemoryError:
                for ring in resized:
                    ring.resize(self._native_capacity)
                raise
            for buf in buffers:
                # keep the newest that fit; and what the ring already overwrote stays lost
                # when it grows (it may still be in memory, it is not in the ring)
                keep = min(capacity, self._capacity)
                buf._floor = max(buf._floor, buf._window_floor(keep))
            self._capacity, self._page_events, self._size_kb = capacity, page_events, size_kb
            self._native_capacity = native_capacity
            for buf in buffers:
                buf._cut_to(capacity)

    def _reconfiguring(self) -> _Reconfiguring:
        """Hold every buffer's lock while the configuration changes, then poke the writers.

        Writers read the configuration only under their own buffer's lock, so none
        of them sees it half changed.
        """
        return _Reconfiguring(self)

    def clear(self) -> None:
        """Empty every buffer and reset the counters (``echo > trace``); forget ended threads."""
        with self._lock:
            for buf in self._buffers:
                buf._clear()
            self._buffers = [b for b in self._buffers if not b.finished]

    # -- accounting -------------------------------------------------------------------------

    def buffers(self) -> list[ThreadBuffer]:
        """Every thread's buffer, in order of creation (ended threads included until clear)."""
        with self._lock:
            return list(self._buffers)

    def stats(self) -> list[ThreadStats]:
        return [buf.stats() for buf in self.buffers()]

    def totals(self) -> BufferStats:
        per_thread = self.stats()
        return BufferStats(*(sum(getattr(s, f) for s in per_thread) for f in BufferStats._fields))

    def header(self) -> str:
        """The tracefs header line: ``# entries-in-buffer/entries-written: N/M   #P:threads``."""
        total = self.totals()
        return (
            f"# entries-in-buffer/entries-written: {total.entries}/{total.written}"
            f"   #P:{len(self.buffers())}"
        )

    def threads(self) -> dict[int, str]:
        """The thread table: tid -> current (or last) name."""
        return {buf.tid: buf.name for buf in self.buffers()}

    # -- readers ------------------------------------------------------------------------------

    def iter_trace(self, lookahead: bool = False) -> Iterator[Any]:
        """The ``trace`` file: every event held, all threads merged by timestamp.

        Each thread's buffer is copied when the iteration starts; nothing is consumed. With
        ``lookahead``, pairs ``(event, next event of its thread or None)``, as
        ``TraceReader.ordered_events`` gives them.
        """
        per_thread = [buf.events() for buf in self.buffers()]
        import heapq  # (start-up: test_startup)

        if lookahead:
            return heapq.merge(*(zip_longest(events, events[1:]) for events in per_thread),
                               key=_pair_time)
        return heapq.merge(*per_thread, key=itemgetter(1))

    def snapshot(self) -> list[Event]:
        """:meth:`iter_trace` as a list."""
        return list(self.iter_trace())

    def pipe(self, timeout: float | None = None) -> TracePipe:
        """The ``trace_pipe`` file: a consuming, blocking reader. See :class:`TracePipe`."""
        return TracePipe(self, timeout)

    def _consume_all(self) -> list[Event | Lost]:
        with self._pipe_lock:
            batches = [batch for buf in self.buffers() if (batch := buf._consume())]
        return _merge_threads(batches)

    def _consume_or_feed(self, feed: NativeFeed) -> list[Event | Lost] | None:
        """:meth:`_consume_all`, except that each thread whose round is only native records
        (no Python-side event or loss in that thread) has its ring handed to
        ``feed(ring, tid, name_of)``, which must consume it (``TraceWriter.write_native``:
        records encoded without event tuples). Returns the other threads' items, merged, or
        None when ``feed`` took everything there was.

        Every thread's Python side is consumed first, then the rings, as :meth:`_consume`
        does for one thread; a thread's records stay in their order, and across threads the
        order of a round's reads never mattered (each thread's writer runs meanwhile, a round
        is one moment per thread).
        """
        with self._pipe_lock:
            buffers = self.buffers()
            python = [buf._consume_python() for buf in buffers]
            batches = []
            fed = False
            now = time.monotonic()
            for buf, items in zip(buffers, python, strict=True):
                ring = buf._native
                if not items and ring is not None and _native_pending(ring):
                    feed(ring, buf.tid, self._name_of)
                    fed = True
                    buf._fed_at = now
                elif batch := buf._consume_native(items):
                    batches.append(batch)
            self._writers = sum(now - buf._fed_at < WRITERS_SECONDS for buf in buffers)
            if any(python):
                self._python_at = now
        if fed and not batches:
            return None
        return _merge_threads(batches)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _wait(self, seconds: float) -> None:
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait(seconds)
            finally:
                self._waiting -= 1


    def _after_fork_in_child(self) -> None:
        """In a fork child: keep the forking thread's buffer, empty and with the child's thread
        id; forget the other threads' (see "Fork" above). Locks are new: another thread of the
        parent may have held one at the fork."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0
        self._pipe_lock = threading.Lock()
        me: ThreadBuffer | None = getattr(self._tls, "buf", None)
        self._buffers = []
        if me is None:
            return
        me._lock = threading.Lock()
        me.tid = threading.get_native_id()
        me.finished = False
        me._clear()
        self._buffers.append(me)


_live_buffers: WeakSet[TraceBuffer] = WeakSet()


def _after_fork_in_child() -> None:
    for buffer in list(_live_buffers):
        buffer._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


#: Takes a round that is one native ring's records: ``feed(ring, tid, name_of)`` consumes
#: the ring (see :meth:`TraceBuffer._consume_or_feed`).
if TYPE_CHECKING:
    NativeFeed = Callable[[Any, int, Callable[[CodeType], str]], None]


def _pair_time(pair: tuple[Event, Any]) -> int:
    return pair[0][1]


def _native_pending(ring: Any) -> bool:
    """Whether a consuming read of a C ring would return anything: records, or loss to
    report (overwritten or refused since the last read)."""
    return ring.head != ring.read_pos or ring.refused_unreported != 0


def _merge_threads(batches: list[list[Event | Lost]]) -> list[Event | Lost]:
    """One round's non-empty per-thread batches as one list, by timestamp."""
    if len(batches) <= 1:  # one thread: already in order
        return batches[0] if batches else []
    keyed = [_keyed_by_time(batch) for batch in batches]
    import heapq  # (start-up: test_startup)

    return [item for _, item in heapq.merge(*keyed, key=itemgetter(0))]


def _keyed_by_time(items: list[Event | Lost]) -> list[tuple[int, Event | Lost]]:
    """Pair items with a merge key: an event's timestamp; a Lost takes the next event's."""
    keyed: list[tuple[int, Event | Lost]] = []
    pending: list[Lost] = []
    for item in items:
        if isinstance(item, Lost):
            pending.append(item)
            continue
        ts = item[1]
        if pending:
            keyed += [(ts, lost) for lost in pending]
            pending = []
        keyed.append((ts, item))
    if pending:
        last = keyed[-1][0] if keyed else 0
        keyed += [(last, lost) for lost in pending]
    return keyed


class TracePipe:
    """A consuming reader over every thread's buffer (``trace_pipe``).

    Iterating yields events (timestamp order within each batch it collects; see
    the module docstring) and :class:`Lost` items where a thread's events were
    dropped. Each read blocks until something arrives; with a ``timeout``,
    iteration ends once that many seconds pass with nothing new. :meth:`close`
    (from any thread) ends it too. Pipes on one TraceBuffer share its read
    position, as trace_pipe readers do.
    """

    def __init__(self, buffer: TraceBuffer, timeout: float | None = None) -> None:
        self._buffer = buffer
        self._timeout = timeout
        self._closed = False
        self._pending: deque[Event | Lost] = deque()
        self._fed = False  # the last read_or_feed fed native rings (see _poll)

    def read(self, timeout: float | None = None) -> list[Event | Lost]:
        """Consume what is there, waiting up to ``timeout`` seconds (None: forever) for
        something to arrive. Returns [] on timeout or when the pipe is closed."""
        items = self._poll(self._buffer._consume_all, timeout)
        assert items is not None
        return items

    def read_or_feed(self, timeout: float | None, feed: NativeFeed,
                     wait: Callable[[float, bool], object] | None = None
                     ) -> list[Event | Lost] | None:
        """:meth:`read`, except that the native records of each thread that has nothing else
        go to ``feed(ring, tid, name_of)``, which consumes the ring (a trace writer's
        ``write_native``); None when that was the whole round. [] on timeout or close.

        ``wait(seconds, first)``, if given, is how the reader waits between two rounds while
        native rings exist (the engine core's ``drain_wait``, which a ring a quarter full
        ends): up to NATIVE_DRAIN_WAIT_SECONDS, or a poll's length while Python-side events
        came in the last WRITERS_SECONDS (their writers do not end it); ``first`` when two
        or more threads wrote native records in that time: the next round then has the GIL
        ahead of the program's threads. Without native rings the wait is :meth:`read`'s,
        which Python writers end. Whoever closes the pipe must end that wait too."""
        return self._poll(lambda: self._buffer._consume_or_feed(feed), timeout, wait)

    def _poll(self, consume: Callable[[], list[Event | Lost] | None],
              timeout: float | None, native_wait: Callable[[float, bool], object] | None = None
              ) -> list[Event | Lost] | None:
        """Call ``consume`` until it gives something (items, or None: fed), the timeout
        passes or the pipe is closed ([])."""
        buffer = self._buffer
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._fed and not self._closed:
            # Right after a round that fed native rings, wait for the next wake before
            # reading: what the program wrote while that round was encoded goes with the next
            # one, not in a round of its own (richards: every wake made a round of ~67 k
            # records and one of ~13 k, each a handoff of the GIL).
            wait, _, drain = self._next_wait(native_wait)
            if drain:
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                native_wait(wait, buffer._writers >= 2)  # type: ignore[misc]
        self._fed = False
        while not self._closed:
            items = consume()
            if items is None or items:
                self._fed = items is None
                return items
            wait, native, _ = self._next_wait(native_wait)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                wait = min(wait, remaining)
            if native:
                native_wait(wait, buffer._writers >= 2)  # type: ignore[misc]
            else:
                buffer._wait(wait)
        return []

    def _next_wait(self, native_wait: Callable[[float, bool], object] | None
                   ) -> tuple[float, bool, bool]:
        """How long to wait before reading again; whether through ``native_wait`` (native
        rings exist); whether it is the drain's long wait (only native rings wrote lately: a
        ring's wake mark, not a poll, ends it)."""
        buffer = self._buffer
        wait = buffer._poll_seconds
        native = native_wait is not None and wait <= NATIVE_PIPE_POLL_SECONDS
        if native and time.monotonic() - buffer._python_at >= WRITERS_SECONDS:
            return NATIVE_DRAIN_WAIT_SECONDS, True, True
        return wait, native, False

    def __iter__(self) -> Iterator[Event | Lost]:
        return self

    def __next__(self) -> Event | Lost:
        if not self._pending:
            self._pending.extend(self.read(self._timeout))
            if not self._pending:
                raise StopIteration
        return self._pending.popleft()

    def close(self) -> None:
        self._closed = True
        self._buffer._wake()

    def __enter__(self) -> TracePipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
