"""Observers of a run, one per output mode, each with the background thread it needs.

An observer is started right before the program and finished after it: :class:`Recorder`
drains the ring buffer into a trace file from a background thread (``rethook record``: long
runs lose nothing to a full buffer unless the program outruns the writer, and then the loss
is counted and written), :class:`Streamer` prints events live (``rethook stream``), and
:class:`ProfileObserver` turns the function profiler on for the run (``rethook profile``).
"""

from __future__ import annotations

import _thread
import errno
import os
import stat
import sys
import time
import types

import rethook
from rethook import jsontext
from rethook.buffer.tracefile import DEFAULT_BATCH_EVENTS, TraceWriter
from rethook.control.hidden import HiddenThread, hush_fork_warning, unhush_fork_warning
from rethook.control.tracefs import Tracefs
from rethook.engine import clock
from rethook.engine.core import notrace
from rethook.runner import exits
from rethook.runner.program import Program
from rethook.runner.settings import SettingError, TraceSettings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any

#: How long a drain thread waits for events before looking again (it wakes at once when a
#: page of events completes).
DRAIN_POLL_SECONDS = 0.1
#: How long starting a drain thread waits for it to reach its loop (see _Drain._spawn).
READY_SECONDS = 0.5


class Observer:
    """Something that watches a run: started right before the program, finished after it."""

    def start(self, fs: Tracefs) -> None:
        """Called with tracing about to go on."""

    def stop(self, fs: Tracefs) -> None:
        """Called when the program is over, before tracing stops (open calls are still to be
        delivered as unfinished). Other threads may still be making events."""

    def finish(self, fs: Tracefs) -> None:
        """Called after the program ended and tracing stopped."""

    def forget(self) -> None:
        """In a fork child: let go of what the parent's observer holds, touching nothing the
        parent still uses (its file is the parent's to write)."""

    def report(self, fs: Tracefs, abrupt: bool) -> None:
        """Say what the run gave (summary, table), last. ``abrupt``: the process is ending by
        a signal, so the program's buffered output is not flushed (it would not be, untraced)
        and rethook writes to the file descriptors directly."""


class _Drain(Observer):
    """A background thread that consumes the ring buffer (``trace_pipe``) in batches.

    The thread is not a :class:`threading.Thread`: the program must not see it
    (``threading.enumerate()``, ``active_count()``). It is stopped around the program's
    ``os.fork()``: so the child inherits no lock it holds, and Python sees no other thread
    and has no reason to warn that forking a multi-threaded process is unsafe.
    """

    def __init__(self) -> None:
        self._thread: HiddenThread | None = None
        self._stopping = False
        self._running = False
        self._pid = os.getpid()
        self.error: BaseException | None = None
        self.fs: Any = None  # set by start()

    def start(self, fs: Tracefs) -> None:
        self.fs = fs
        self._pipe = fs.ctx.buffer.pipe()
        self._spawn(wait=True)
        os.register_at_fork(before=self._before_fork, after_in_parent=self._after_fork_parent,
                            after_in_child=self._after_fork_child)

    def _spawn(self, wait: bool = False) -> None:
        """Start the thread; ``wait``: until it reaches its loop. Until the thread first
        waits, it needs the GIL, which the program's thread keeps for a switch interval (5
        ms) as the program starts: meanwhile nobody pages in the rings' first parts ahead of
        their writers (engine/_ccore.c, "Paging ahead"), and the program's thread faults on
        every fresh page of them. Waiting costs two hand-offs of the GIL. (Not after a fork:
        the thread would lift the hushed fork warning before ``os.fork()`` gives it.)"""
        self._stopping = False
        self._running = True
        ready = _thread.allocate_lock()
        ready.acquire()
        self._thread = HiddenThread(self._run, ready)
        self._thread.start()
        if wait:
            ready.acquire(timeout=READY_SECONDS)  # (bounded: it may fail before its loop)

    def _join(self, until_gone: bool = False) -> None:
        if self._running and self._thread is not None:
            self._stopping = True
            self._pipe.close()  # wakes a read that is waiting,
            self.fs.ctx.engine.core.drain_wake()  # or the native rings' wait
            self._thread.join(until_gone=until_gone)
            self._running = False

    def _run(self, ready: Any) -> None:
        ready.release()  # (it goes on to its first wait, where it lets the GIL go)
        try:
            while not self._stopping:
                # rethook's own work: the stdlib code it runs is not the program's (-l '*').
                # Not one notrace() around the loop: a sweep waits for notrace sections.
                with notrace():
                    self._round(self._pipe, DRAIN_POLL_SECONDS)
                    self.fs.check_hook()  # another tool took the hook: stop tracing now
                    exits.check_signals()  # a fatal signal the main thread did not handle
        except BaseException as e:  # noqa: BLE001 - reported by finish(), in the main thread
            self.error = e
        finally:
            self.fs.ctx.engine.core.drain_end()  # (a round the last wait began: see _ccore.c)

    # The at-fork hooks and stop() run in the program's threads, with tracing on: what they
    # do is rethook's work, not the program's.
    def _before_fork(self) -> None:
        with notrace():
            self._paused = os.getpid() == self._pid and self._running
            if self._paused:
                self._join(until_gone=True)
                hush_fork_warning()

    def _after_fork_parent(self) -> None:
        with notrace():
            if self._paused and self.error is None:
                self._pipe = self.fs.ctx.buffer.pipe()  # the old one is closed
                self._spawn()

    def _after_fork_child(self) -> None:
        with notrace():
            unhush_fork_warning()

    # No stop(): the thread drains until tracing has stopped. The program's daemon threads
    # make events until then (a run ended by SIGTERM: millions a second), and a ring with no
    # drain behind it fills and loses them.

    def _drain_rest(self) -> None:
        """End the thread and consume what is left (tracing is off by now)."""
        with notrace():
            self._join()
        if self.error is not None or self.fs is None:
            return
        with notrace():
            pipe = self.fs.ctx.buffer.pipe()
            try:
                while self._round(pipe, 0):
                    pass
            except Exception as e:  # noqa: BLE001 - e.g. the file size limit: report() says
                self.error = e

    def _round(self, pipe: Any, timeout: float) -> bool:
        """One consuming read (waiting up to ``timeout`` seconds for something), consumed;
        False when nothing came."""
        items = pipe.read(timeout)
        if items:
            self.consume(items)
        return bool(items)

    def consume(self, items: list) -> None:
        raise NotImplementedError


#: Whether recorders write a thread's native records straight from its
#: ring (TraceWriter.write_native) rather than through event tuples. Private switch, for
#: tests and measurements: RETHOOK_FUSED_DRAIN=0 turns it off (the files are the same).
FUSED_DRAIN = os.environ.get("RETHOOK_FUSED_DRAIN", "1") != "0"


class Recorder(_Drain):
    """Writes the run's events to a trace file as they come (``rethook record``).

    In each drain round, a thread that has nothing but native records -- a call storm under
    the native function_graph user, in any number of threads -- is written with
    :meth:`TraceWriter.write_native`: the records go from its ring into the file's event
    chunks in C, without an event tuple each, several times faster than the tuple path, and
    into the same bytes."""

    def __init__(self, path: str, meta: dict[str, Any],
                 sections: Callable[[TraceWriter], list[str]] | None = None,
                 quiet: bool = False, blocking_ms: int | None = None) -> None:
        super().__init__()
        # how long the program's threads may wait for the drain when a ring is three
        # quarters full (engine/_ccore.c, "Blocking"); None or 0: they never wait
        self.blocking_ms = blocking_ms or 0
        self.path = path
        self._abspath = os.path.abspath(path)  # the program may chdir
        self.meta = dict(meta)
        self.sections = sections  # appends the other processes' sections before the end
        self.quiet = quiet  # a child's recorder: the first process gives the summary
        self.notes: list[str] = []
        # Unbuffered: a forked child of the program inherits no half-written buffer to flush.
        self._file: IO[bytes] = open(path, "wb", buffering=0)  # noqa: SIM115 - closed in finish
        self.writer: TraceWriter | None = None
        self._named: dict[int, str] = {}
        self.batch_events = DEFAULT_BATCH_EVENTS  # events per chunk at most
        self.events = 0
        self.lost = 0
        self.size = 0

    def start(self, fs: Tracefs) -> None:
        for key, value in clock.start_times(self.meta.get("start_time")).items():
            self.meta.setdefault(key, value)  # (unless the caller's meta has them)
        try:
            self.writer = TraceWriter(self._file, self.meta, formats=fs.ctx.formats,
                                      batch_events=self.batch_events)
        except OSError as e:  # /dev/full, a full disk: nothing runs
            self._discard()
            raise SettingError("-o", self.path, f"cannot write: {e.strerror or e}") from None
        if FUSED_DRAIN and getattr(getattr(fs.tracer, "ops", None), "native", None) is not None:
            # native users will fill rings fast: the first drain rounds must not page in
            # the encoder's memory while the program races them
            try:
                self.writer.prepare_native(fs.ctx.buffer.native_capacity)
            except MemoryError:  # before the program starts: leave no half-made file
                self._discard()
                kb = fs.ctx.buffer.size_kb
                raise SettingError("-b", str(kb), "not enough memory to drain a buffer of "
                                   f"{kb} KiB per thread") from None
            # This thread, the program's, writes first, as the program starts: its ring made
            # now has its first part paged in by the drain meanwhile (_Drain._spawn), which
            # would otherwise reach the ring's request a switch interval late.
            fs.ctx.buffer.native_local(fs.ctx.registry.name)
        super().start(fs)

    def _spawn(self, wait: bool = False) -> None:
        # from now until the thread's drain_end, the program's threads may wait for it
        self.fs.ctx.engine.core.drain_blocking(self.blocking_ms / 1000)
        super()._spawn(wait)

    def _discard(self) -> None:
        """Close the file and remove it, if it is one (not /dev/full, not a pipe)."""
        self._file.close()
        try:
            if stat.S_ISREG(os.stat(self._abspath).st_mode):
                os.unlink(self._abspath)
        except OSError:
            pass

    def consume(self, items: list) -> None:
        writer = self.writer
        assert writer is not None
        self._name_threads()
        writer.write_events(items)

    def _round(self, pipe: Any, timeout: float) -> bool:
        if not FUSED_DRAIN:
            return super()._round(pipe, timeout)
        items = pipe.read_or_feed(timeout, self._feed, self.fs.ctx.engine.core.drain_wait)
        if items:
            self.consume(items)
        return items is None or bool(items)

    def _feed(self, ring: Any, tid: int, name_of: Callable[[types.CodeType], str]) -> None:
        """Write one thread's native records of a round (see TracePipe.read_or_feed)."""
        writer = self.writer
        assert writer is not None
        self._name_threads()
        writer.write_native(ring, tid, name_of)

    def _name_threads(self) -> None:
        assert self.writer is not None
        for tid, name in self.fs.ctx.buffer.threads().items():
            if self._named.get(tid) != name:
                self._named[tid] = name
                self.writer.set_thread_name(tid, name)

    def finish(self, fs: Tracefs) -> None:
        writer = self.writer
        if writer is None:  # never started (the process ended while it was starting)
            return
        try:
            self._drain_rest()
            if self.error is None:
                self._name_threads()
                writer.write_stats(fs.ctx.buffer.stats())
                writer.set_meta("end_time", time.time())
                hists = {name: e.read_hist() for name, e in fs.dynamic.events.items()
                         if e.read_hist()}
                if hists:  # histograms live in the trace instance: keep them with the trace
                    writer.set_meta("histograms", hists)
                # where the functions the trace names are defined (pstats, speedscope)
                writer.set_meta("functions", fs.function_locations(writer.has_string))
                if self.sections is not None:
                    self.notes = self.sections(writer)
                writer.close(release_memory=not fs.ctx.engine.ending)
            self.size = os.fstat(self._file.fileno()).st_size  # the program may have chdir'd
        finally:
            self._file.close()
        self.events = writer.events_written
        totals = fs.ctx.buffer.totals()
        self.lost = totals.lost + (writer.sections_lost if writer is not None else 0)
        if self.error is not None:  # what counts is what a reader will find in the file
            from rethook.buffer.traceread import events_in_file  # (not loaded to record)

            self.events = events_in_file(self._abspath)
            self.lost = max(self.lost, totals.written - self.events)
        patterns = fs.ctx.ftrace_filter.filter_patterns
        if not self.events and not self.lost and patterns:  # nothing silently: say why
            shown = ", ".join(f"'{p}'" for p in patterns[:4]) + (", ..." if patterns[4:] else "")
            self.notes.append(f"no function the filter selects ({shown}) ran; see "
                              "`rethook list -f PATTERN -- PROGRAM` for what it matches")

    def forget(self) -> None:
        self.sections = None
        self._file.close()  # this process's copy of the descriptor; nothing is written

    def flush(self, fs: Tracefs, note: dict[str, Any] | None = None) -> None:
        """Write everything recorded so far (the drain paused meanwhile), and ``note`` as
        META: before this process is replaced by ``exec``."""
        writer = self.writer
        if writer is None or self.error is not None:
            return
        running = self._running
        self._join()
        try:
            if note:
                for key, value in note.items():
                    writer.set_meta(key, value)
            self._drain_rest()
            writer.flush()
        finally:
            if running and self.error is None:
                self._pipe = fs.ctx.buffer.pipe()
                self._spawn()

    def report(self, fs: Tracefs, abrupt: bool) -> None:
        if self.quiet:
            return
        if self.error is not None:
            emit(2, f"rethook: error writing {self.path}: {self.error}", abrupt)
        emit(2, self.summary(), abrupt)

    def summary(self) -> str:
        """``rethook: 12,345 events (0 lost) written to trace.dat (123.4 KB)``, and a hint
        that fits the cause when events were lost."""
        line = (f"rethook: {self.events:,} events ({self.lost:,} lost) written to "
                f"{self.path} ({human_size(self.size)})")
        if self.error is not None:
            line += f"\nrethook: the events after writing failed were not saved: {self._advice()}"
        elif self.lost:
            line += f"\nrethook: {LOSS_ADVICE}"
        for note in self.notes:
            line += f"\nrethook: {note}"
        return line

    def _advice(self) -> str:
        err = getattr(self.error, "errno", None)
        if err in (errno.ENOSPC, errno.EDQUOT):
            what = "the disk is full" if err == errno.ENOSPC else "the disk quota is used up"
            return f"{what}; free space, or write the trace elsewhere (-o)"
        if err == errno.EFBIG:
            return ("the file reached the size limit (ulimit -f); raise it, or record fewer "
                    "functions (-l)")
        if err == errno.EIO:
            return "the disk reported an I/O error; write the trace elsewhere (-o)"
        return "write the trace elsewhere (-o)"


class Streamer(Recorder):
    """Prints events while the program runs, in the tracer's text format (``trace_pipe``).

    The events are recorded exactly as ``record`` does, into a temporary trace file, and a
    printer process (:mod:`rethook.runner.printer`) prints the file as it grows, with the
    children's files: printing text is far slower than a call storm makes events, and in the
    program's process it would take the program's interpreter lock; so the stream loses
    nothing ``record`` would not, and what is not printed yet waits in the file. At the end
    the recorder writes the file's end and waits for the printer to print the rest.
    """

    def __init__(self, out: IO[str] | None = None, children: Any = None) -> None:
        if children is not None:  # the run's directory (not a .dat: not a child's trace)
            children.make()
            path = os.path.join(children.rundir, f"{os.getpid()}.stream")
        else:
            import tempfile

            fd, path = tempfile.mkstemp(prefix="rethook-stream-", suffix=".dat")
            os.close(fd)
        super().__init__(path, {}, quiet=True)
        self.out = out
        self.children = children  # the run's Follow: its processes' files are printed too
        self._printer: Any = None  # the printer process (subprocess.Popen)
        self.printer_error = ""

    def start(self, fs: Tracefs) -> None:
        import subprocess

        out = self.out if self.out is not None else sys.stdout
        try:
            out.flush()  # what was printed before the program belongs before its events
            fd = out.fileno()
        except (OSError, ValueError, AttributeError):
            fd = None
        self.meta.update(process_meta(fs))
        try:
            super().start(fs)
            # Started before the run's child processes are followed: it is rethook's, not
            # the program's. It ignores Ctrl-C: it ends when the file does.
            argv = [sys.executable, "-m", "rethook.runner.printer", self._abspath]
            if self.children is not None:
                argv.append(self.children.rundir)
            # its stdin is how it learns that the file will not grow: end of file there
            self._printer = subprocess.Popen(argv, stdout=fd, stdin=subprocess.PIPE,
                                             stderr=subprocess.PIPE)
        except BaseException:
            self._unlink()
            raise

    def finish(self, fs: Tracefs) -> None:
        try:
            super().finish(fs)  # the rest of the events into the file, and its end
        finally:
            printer = self._printer
            if printer is not None:
                _, err = printer.communicate()  # (closes its stdin: nothing more will come)
                if printer.returncode:
                    self.printer_error = err.decode("utf-8", "replace").strip().splitlines()
            self._unlink()

    def _unlink(self) -> None:
        try:
            os.unlink(self._abspath)
        except OSError:
            pass

    def forget(self) -> None:
        super().forget()
        if self._printer is not None:
            self._printer.stdin.close()  # this process's copy: the parent's printer
            self._printer = None

    def report(self, fs: Tracefs, abrupt: bool) -> None:
        line = f"rethook: {self.events:,} events ({self.lost:,} lost) streamed"
        if self.error is not None:
            line += (f"\nrethook: saving events not yet printed in {self.path} failed "
                     f"({self.error}); the events after that were not streamed (set TMPDIR "
                     "to a place with room)")
        elif self.lost:
            line += f"\nrethook: {LOSS_ADVICE}"
        if self.printer_error:
            line += f"\nrethook: printing the stream failed: {self.printer_error[-1]}"
        emit(2, line, abrupt)


#: What a summary says when the program made events faster than they could be saved.
LOSS_ADVICE = ("the program made events faster than they could be written; a larger "
               "per-thread buffer (-b KB) or a narrower filter (-l) keeps them")


class ProfileObserver(Observer):
    """Turns the function profiler on for the run (``rethook profile``) and hands its table
    to ``show`` at the end; with ``children``, the followed processes' tables too. In a child
    process (``save``: its ``PID.profile`` file) it saves its own table instead, and in a fork
    child only what was counted since the fork (the parent's counts up to then are the
    parent's).

    ``show(tables, abrupt)`` gets ``[(pid, stats), ...]``, this process first."""

    def __init__(self, children: Any = None, save: str | None = None, forked: bool = False,
                 show: Callable[[list[tuple[int, list[Any]]], bool], None] | None = None
                 ) -> None:
        self.children = children
        self.save = save
        self.forked = forked
        self.show = show
        self._baseline: list[Any] = []

    def start(self, fs: Tracefs) -> None:
        if self.forked:
            self._baseline = fs.profile_stats()
            return
        fs.write("function_profile_enabled", "1")

    def finish(self, fs: Tracefs) -> None:
        fs.write("function_profile_enabled", "0")
        if self.save is None:
            return
        from rethook.tracers.profiler import add_stats, stat_row

        table: dict[str, Any] = {}
        add_stats(table, fs.profile_stats())
        add_stats(table, self._baseline, -1)
        rows = [stat_row(st) for st in table.values() if st.hit]
        with open(self.save, "w", encoding="utf-8") as f:
            f.write(jsontext.dumps({"pid": os.getpid(), "argv": sys.argv, "rows": rows}))

    def report(self, fs: Tracefs, abrupt: bool) -> None:
        if self.save is not None or self.show is None:
            return
        from rethook.tracers.profiler import stat_from_row

        tables = [(os.getpid(), fs.profile_stats())]
        if self.children is not None:
            for pid, rows in self.children.profiles():
                try:
                    tables.append((pid, [stat_from_row(row) for row in rows]))
                except (TypeError, ValueError):  # a file cut short by the child's end
                    continue
        self.show(tables, abrupt)


class ControlObserver(Observer):
    """Opens the control channel for the run (``rethook run``): listening from the first line
    of the program to the end of its ``atexit`` handlers, nothing traced until asked."""

    def __init__(self, program: Program, follow_forks: bool = True) -> None:
        self.program = program
        self.follow_forks = follow_forks
        self.channel: Any = None

    def start(self, fs: Any) -> None:
        from rethook.control.channel import listen
        from rethook.runner.settings import default_filter

        try:
            self.channel = listen(fs, default_filter=default_filter(self.program),
                                  follow_forks=self.follow_forks, how="run",
                                  argv=self.program.command_line)
        except OSError as e:
            print(f"rethook: error: cannot open the control channel: {e}", file=sys.stderr)

    def stop(self, fs: Any) -> None:
        if self.channel is not None:
            self.channel.close()


def emit(fd: int, text: str, abrupt: bool, end: str = "\n") -> None:
    """Write rethook's own output (summary to 2, tables to 1). Normally through the Python
    streams, after the program's buffered output; ``abrupt`` (a signal ends the process):
    straight to the file descriptor, leaving the program's buffered output as unwritten as
    it would be untraced."""
    text += end
    if not abrupt:
        stream = sys.__stdout__ if fd == 1 else sys.__stderr__
        try:
            if fd == 1:
                sys.stdout.flush()
            stream = stream or (sys.stdout if fd == 1 else sys.stderr)
            stream.write(text)
            stream.flush()
            return
        except BrokenPipeError:
            return
        except Exception:  # noqa: BLE001 - a closed stream: try the descriptor
            pass
    data = text.encode("utf-8", "backslashreplace")
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass


def human_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1024  # type: ignore[assignment]
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def trace_meta(fs: Tracefs, program: Program, filters: list[str],
               settings: TraceSettings) -> dict[str, Any]:
    """The META keys a recorded trace starts with."""
    meta = {
        "argv": program.argv,
        "command": program.command_line,
        "rethook_command": ["rethook", *sys.argv[1:]],
        "filter": filters,
        "notrace": list(settings.notrace),
        "graph_function": list(settings.graph_functions),
        "graph_notrace": list(settings.graph_notrace),
        "event_filters": dict(settings.event_filters),
        "event_triggers": dict(settings.event_triggers),
    }
    meta.update(process_meta(fs))
    return meta


def process_meta(fs: Tracefs) -> dict[str, Any]:
    """The META keys of any process's trace: how it traces, with what, where."""
    return {
        "tracer": fs.tracer.name,
        "options": fs.ctx.options.as_dict(),
        "probe_events": dict(fs.dynamic.printed),
        "max_graph_depth": fs.ctx.max_graph_depth,
        "tracing_thresh_us": fs.ctx.tracing_thresh_ns // 1000,
        "buffer_size_kb": fs.ctx.buffer.size_kb,
        "python": sys.version.split()[0],
        "python_implementation": sys.implementation.name,
        "engine": fs.ctx.engine.core.name,
        "rethook_version": rethook.__version__,
        "pid": os.getpid(),
        "clock": "monotonic_ns",
        "clock_source": clock.source,
    }
