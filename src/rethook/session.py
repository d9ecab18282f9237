"""Run a program the way ``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` would, under a trace.

The pieces, in the order the command line uses them:

* :class:`Program` finds and compiles the script or module *before* anything runs, so its
  functions are in the registry (as ``__main__.*``) when the filters are written;
* :class:`TraceSettings` and :func:`configure` turn trace-cmd's flags into writes to a
  :class:`~rethook.control.tracefs.Tracefs` (with tracing still off);
* :class:`Session` runs the program as Python would (``sys.argv``, a fresh ``__main__``,
  ``sys.path[0]``, exit status, uncaught exception, waiting for non-daemon threads, ``atexit``
  handlers) with tracing on exactly while the program's code runs;
* observers watch the run: :class:`Recorder` drains the ring buffer into a trace file from a
  background thread (so long runs lose nothing to a full buffer unless the program outruns the
  writer, and then the loss is counted and written), :class:`Streamer` prints events live, and
  :class:`ProfileObserver` turns the function profiler on for the run.
"""

from __future__ import annotations

import _thread
import ast
import atexit
import builtins
import datetime
import importlib.machinery
import importlib.util
import io
import os
import re
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import rethook
from rethook.buffer.tracefile import TraceWriter
from rethook.control.tracefs import Tracefs
from rethook.engine import clock
from rethook.engine.core import notrace

#: How long a drain thread waits for events before looking again (it wakes at once when a
#: page of events completes).
DRAIN_POLL_SECONDS = 0.1

#: Most local modules the default filter's import walk reads (bounds work on huge trees).
MAX_LOCAL_FILES = 500


class ProgramError(Exception):
    """The program cannot be started: no such script, no such module (a usage error)."""


class Program:
    """A script path or a module name, with its arguments; :meth:`load` compiles it."""

    def __init__(self, script: str | None = None, module: str | None = None,
                 args: Sequence[str] = ()) -> None:
        if (script is None) == (module is None):
            raise ValueError("give exactly one of script and module")
        self.script = script
        self.module = module
        self.args = list(args)
        self.code: types.CodeType | None = None
        self.path = ""  # the file the code came from (the program's __file__)
        self.path0 = ""  # what sys.path[0] becomes
        self.spec: importlib.machinery.ModuleSpec | None = None
        self.loader: Any = None

    @property
    def argv(self) -> list[str]:
        """The program's ``sys.argv``: as Python sets it for a script or for ``-m``."""
        first = self.script if self.script is not None else self.path
        return [first, *self.args]

    @property
    def command_line(self) -> list[str]:
        """How the program would be started without rethook (for the trace's metadata)."""
        if self.script is not None:
            return ["python", self.script, *self.args]
        return ["python", "-m", str(self.module), *self.args]

    def load(self) -> types.CodeType:
        """Find and compile the program (nothing of it runs), and point ``sys.path[0]`` where
        Python would. Raises :class:`ProgramError` if it cannot be found, SyntaxError if it
        does not compile."""
        if self.script is not None:
            self._load_script(self.script)
        else:
            self._load_module(str(self.module))
        assert self.code is not None
        return self.code

    def _load_script(self, script: str) -> None:
        path = os.path.abspath(script)
        if os.path.isdir(path):
            raise ProgramError(f"can't run {script!r}: it is a directory (give its __main__.py)")
        try:
            with io.open_code(path) as f:
                source = f.read()
        except OSError as e:
            raise ProgramError(f"can't open file {script!r}: [Errno {e.errno}] {e.strerror}") \
                from None
        # dont_inherit: this module's own __future__ imports must not leak into the program
        self.code = compile(source, path, "exec", dont_inherit=True)
        self.path = path
        self.path0 = os.path.dirname(os.path.realpath(path))  # as Python does: links resolved
        self.loader = importlib.machinery.SourceFileLoader("__main__", path)
        _set_path0(self.path0)

    def _load_module(self, name: str) -> None:
        if not name or name.startswith("."):
            raise ProgramError(f"relative module names are not supported: {name!r}")
        self.path0 = os.getcwd()
        _set_path0(self.path0)  # python -m looks in the current directory first
        spec = _find_spec(name)
        if spec.submodule_search_locations is not None:  # a package: run its __main__
            if name.endswith(".__main__"):
                raise ProgramError(f"cannot use package {name!r} as the __main__ module")
            main = _find_spec(name + ".__main__", package=name)
            spec = main
        loader = spec.loader
        code = None
        if loader is not None and hasattr(loader, "get_code"):
            try:
                code = loader.get_code(spec.name)
            except ImportError as e:
                raise ProgramError(f"can't load module {spec.name!r}: {e}") from None
        if code is None:
            raise ProgramError(f"no code object available for module {spec.name!r}")
        self.code = code
        self.spec = spec
        self.loader = loader
        self.path = spec.origin or ""

    # --- the default filter ---------------------------------------------------------------------
    def own_modules(self) -> list[str]:
        """Modules that are the program's own code: those its imports (followed through its
        own files) find in its directory -- ``sys.path[0]`` -- plus, for ``-m pkg.mod``, the
        top-level package ``pkg``. Found by reading sources; nothing is imported."""
        top: list[str] = []
        if self.module is not None:
            top.append(self.module.split(".")[0])
        root = self.path0
        todo = [self.path] if self.path.endswith(".py") else []
        seen_files: set[str] = set()
        while todo and len(seen_files) < MAX_LOCAL_FILES:
            path = todo.pop()
            if path in seen_files:
                continue
            seen_files.add(path)
            for name in _imported_names(path):
                if name in top:
                    continue
                found = _local_module(root, name)
                if found is None:
                    continue
                top.append(name)
                todo.extend(found)
        return top


def _set_path0(path0: str) -> None:
    if sys.path:
        sys.path[0] = path0
    else:
        sys.path.append(path0)


def _find_spec(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec:
    try:
        spec = importlib.util.find_spec(name)
    except ImportError as e:  # a parent package is missing or fails to import
        raise ProgramError(f"error while finding module {name!r} ({type(e).__name__}: {e})") \
            from None
    except Exception as e:  # noqa: BLE001 - a parent package's code failed: report, not crash
        raise ProgramError(f"error while finding module {name!r} ({type(e).__name__}: {e})") \
            from None
    if spec is None:
        if package is not None:
            raise ProgramError(f"no module named {name!r}; {package!r} is a package and "
                               "cannot be directly executed")
        raise ProgramError(f"no module named {name!r}")
    return spec


def _imported_names(path: str) -> list[str]:
    """Top-level names of the absolute imports anywhere in a source file."""
    try:
        with io.open_code(path) as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return list(dict.fromkeys(names))


def _local_module(root: str, name: str) -> list[str] | None:
    """If ``name`` is a module or package in ``root``, the source files to follow; else None."""
    if not name.isidentifier():
        return None
    single = os.path.join(root, name + ".py")
    if os.path.isfile(single):
        return [single]
    pkg = os.path.join(root, name)
    if os.path.isdir(pkg):
        files = []
        for dirpath, _dirs, filenames in os.walk(pkg):
            files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
            if len(files) > MAX_LOCAL_FILES:
                break
        return files if files or os.path.isfile(os.path.join(pkg, "__init__.py")) else None
    return None


# --- settings ----------------------------------------------------------------------------------
@dataclass
class TraceSettings:
    """trace-cmd's record flags, as data."""

    tracer: str = "function_graph"  # -p
    filters: list[str] = field(default_factory=list)  # -l (empty: the program's own code)
    notrace: list[str] = field(default_factory=list)  # -n
    graph_functions: list[str] = field(default_factory=list)  # -g
    graph_notrace: list[str] = field(default_factory=list)  # --graph-notrace
    events: list[str] = field(default_factory=list)  # -e: probe definitions, made and enabled
    event_filters: dict[str, list[str]] = field(default_factory=dict)  # -f, per -e definition
    event_triggers: dict[str, list[str]] = field(default_factory=dict)  # -R, per -e definition
    options: list[str] = field(default_factory=list)  # -O NAME / -O noNAME
    max_graph_depth: int | None = None
    tracing_thresh: int | None = None  # microseconds
    buffer_kb: int | None = None  # -b


class SettingError(ValueError):
    """A flag the trace refuses; ``flag`` names it (``-l``, ``-O``...), the message says why."""

    def __init__(self, flag: str, value: str, message: str) -> None:
        self.flag = flag
        self.value = value
        super().__init__(f"{flag} {value!r}: {message}")


def default_filter(program: Program) -> list[str]:
    """The filter used when no ``-l`` is given: the program's own code (see
    :meth:`Program.own_modules`), never the whole standard library."""
    return ["*:mod:__main__", *(f"*:mod:{name}" for name in program.own_modules())]


def configure(fs: Tracefs, settings: TraceSettings, program: Program | None,
              tracer: bool = True) -> list[str]:
    """Apply ``settings`` to ``fs`` with tracing off; returns the filter patterns in force.

    Raises :class:`SettingError` naming the flag whose value was refused.
    """
    from rethook.control.tracefs import TracefsError

    def write(flag: str, value: str, path: str, text: str, append: bool = False) -> None:
        try:
            fs.write(path, text, append=append)
        except TracefsError as e:
            # "PATH: " and error_log's "[timestamp] " say nothing about the flag
            message = re.sub(r"^\[ *[\d.]+\] ", "", str(e).removeprefix(f"{path}: "))
            raise SettingError(flag, value, message) from None

    write("tracing_on", "0", "tracing_on", "0")
    if settings.buffer_kb is not None:
        write("-b", str(settings.buffer_kb), "buffer_size_kb", str(settings.buffer_kb))
    for opt in settings.options:
        write("-O", opt, "trace_options", opt)
    filters = list(settings.filters)
    if filters:
        for text in filters:
            write("-l", text, "set_ftrace_filter", text, append=True)
    elif program is not None:
        filters = _write_default_filter(fs, program)
    for text in settings.notrace:
        write("-n", text, "set_ftrace_notrace", text, append=True)
    for text in settings.graph_functions:
        write("-g", text, "set_graph_function", text, append=True)
    for text in settings.graph_notrace:
        write("--graph-notrace", text, "set_graph_notrace", text, append=True)
    for text in settings.events:
        before = set(fs.dynamic.events)
        write("-e", text, "dynamic_events", text, append=True)
        for name in [n for n in fs.dynamic.events if n not in before]:
            for flt in settings.event_filters.get(text, ()):
                write("-f", flt, f"events/{name}/filter", flt)
            for trig in settings.event_triggers.get(text, ()):
                write("-R", trig, f"events/{name}/trigger", trig)
            write("-e", text, f"events/{name}/enable", "1")
    if settings.max_graph_depth is not None:
        write("--max-graph-depth", str(settings.max_graph_depth), "max_graph_depth",
              str(settings.max_graph_depth))
    if settings.tracing_thresh is not None:
        write("--tracing-thresh", str(settings.tracing_thresh), "tracing_thresh",
              str(settings.tracing_thresh))
    if tracer:
        write("-p", settings.tracer, "current_tracer", settings.tracer)
    return filters


def _write_default_filter(fs: Tracefs, program: Program) -> list[str]:
    from rethook.control.tracefs import TracefsError

    used = []
    for pattern in default_filter(program):
        try:
            fs.write("set_ftrace_filter", pattern, append=True)
        except TracefsError:
            continue  # e.g. a script that defines no functions: nothing of __main__ to hook
        used.append(pattern)
    if not used:
        # An empty filter means "every function"; the default never means that.
        fs.write("set_ftrace_notrace", "*", append=True)
        print("rethook: the program defines no functions of its own: nothing is traced "
              "(choose functions with -l)", file=sys.stderr)
    return used


# --- observers ----------------------------------------------------------------------------------
class Observer:
    """Something that watches a run: started right before the program, finished after it."""

    def start(self, fs: Tracefs) -> None:
        """Called with tracing about to go on."""

    def stop(self, fs: Tracefs) -> None:
        """Called when the program is over, before tracing stops (open calls are still to be
        delivered as unfinished)."""

    def finish(self, fs: Tracefs) -> None:
        """Called after the program ended and tracing stopped (never in a forked child)."""


class _Drain(Observer):
    """A background thread that consumes the ring buffer (``trace_pipe``) in batches.

    The thread is not a :class:`threading.Thread`: the program must not see it
    (``threading.enumerate()``, ``active_count()``). It is stopped around the program's
    ``os.fork()``: so the child inherits no lock it holds, and Python sees no other thread
    and has no reason to warn that forking a multi-threaded process is unsafe.
    """

    def __init__(self) -> None:
        self._done: Any = None  # a lock held while the thread runs: joining is acquiring it
        self._stopping = False
        self._running = False
        self._pid = os.getpid()
        self.error: BaseException | None = None

    def start(self, fs: Tracefs) -> None:
        self.fs = fs
        self._pipe = fs.ctx.buffer.pipe()
        self._spawn()
        os.register_at_fork(before=self._before_fork, after_in_parent=self._after_fork_parent,
                            after_in_child=self._after_fork_child)

    def _spawn(self) -> None:
        self._stopping = False
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._running = True
        _thread.start_new_thread(self._run, (self._done,))

    def _join(self, until_gone: bool = False) -> None:
        if self._running:
            self._stopping = True
            self._pipe.close()  # wakes a read that is waiting
            self._done.acquire()
            self._done.release()
            self._running = False
            if until_gone:
                _wait_thread_gone(self._native_id)

    def _run(self, done: Any) -> None:
        self._native_id = threading.get_native_id()
        try:
            with notrace():
                _unhush_fork_warning()
            while not self._stopping:
                # rethook's own work: the stdlib code it runs is not the program's (-l '*').
                # Not one notrace() around the loop: a sweep waits for notrace sections.
                with notrace():
                    self._round(self._pipe, DRAIN_POLL_SECONDS)
        except BaseException as e:  # noqa: BLE001 - reported by finish(), in the main thread
            self.error = e
        finally:
            done.release()

    # The at-fork hooks and stop() run in the program's threads, with tracing on: what they
    # do is rethook's work, not the program's.
    def _before_fork(self) -> None:
        with notrace():
            self._paused = os.getpid() == self._pid and self._running
            if self._paused:
                self._join(until_gone=True)
                _hush_fork_warning()

    def _after_fork_parent(self) -> None:
        with notrace():
            if self._paused and self.error is None:
                self._pipe = self.fs.ctx.buffer.pipe()  # the old one is closed
                self._spawn()

    def _after_fork_child(self) -> None:
        with notrace():
            _unhush_fork_warning()

    def stop(self, fs: Tracefs) -> None:
        """The program is over: end the thread (finish() takes what is left)."""
        with notrace():
            self._join()

    def _drain_rest(self) -> None:
        """Consume what is left (tracing is off by now)."""
        if self.error is not None:
            return
        with notrace():
            pipe = self.fs.ctx.buffer.pipe()
            while self._round(pipe, 0):
                pass

    def _round(self, pipe: Any, timeout: float) -> bool:
        """One consuming read (waiting up to ``timeout`` seconds for something), consumed;
        False when nothing came."""
        items = pipe.read(timeout)
        if items:
            self.consume(items)
        return bool(items)

    def consume(self, items: list) -> None:
        raise NotImplementedError


#: Python's warning on ``os.fork()`` in a process with several threads.
_FORK_WARNING = r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead"
_hushed: list[tuple] = []


def _os_threads() -> int | None:
    """How many threads the OS says this process has (Linux), as Python's fork warning
    counts them; None where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[17])
    except (OSError, ValueError, IndexError):
        return None


def _hush_fork_warning() -> None:
    """The program forks with only its one thread: Python 3.13+ would still warn, because it
    counts threads after the at-fork hooks, which restart the drain thread. Hide that one
    warning (the drain thread lifts the filter as soon as it runs)."""
    if sys.version_info >= (3, 13) and _os_threads() == 1:
        warnings.filterwarnings("ignore", message=_FORK_WARNING, category=DeprecationWarning)
        _hushed.append(warnings.filters[0])


def _unhush_fork_warning() -> None:
    while _hushed:
        entry = _hushed.pop()
        try:
            warnings.filters.remove(entry)
        except ValueError:
            continue  # the program reset the filters meanwhile
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:
            mutated()  # as filterwarnings() does: cached decisions are stale


def _wait_thread_gone(native_id: int, limit: float = 0.2) -> None:
    """Wait (briefly) until a thread that has finished its function is gone from the OS too:
    Python's fork warning counts the threads the OS still lists (on Linux)."""
    task = f"/proc/self/task/{native_id}"
    deadline = time.monotonic() + limit
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.0005)


#: Whether recorders write a round that is one thread's native records straight from the
#: ring (TraceWriter.write_native) rather than through event tuples. Private switch, for
#: tests and measurements: RETHOOK_FUSED_DRAIN=0 turns it off (the files are the same).
FUSED_DRAIN = os.environ.get("RETHOOK_FUSED_DRAIN", "1") != "0"


class Recorder(_Drain):
    """Writes the run's events to a trace file as they come (``rethook record``).

    A drain round that holds nothing but one thread's native records -- a call storm under
    the native function_graph user -- is written with :meth:`TraceWriter.write_native`:
    the records go from the ring into the file's event chunks in C, without an event tuple
    each, several times faster than the tuple path, and into the same bytes."""

    def __init__(self, path: str, meta: dict[str, Any]) -> None:
        super().__init__()
        self.path = path
        self.meta = dict(meta)
        # Unbuffered: a forked child of the program inherits no half-written buffer to flush.
        self._file: IO[bytes] = open(path, "wb", buffering=0)  # noqa: SIM115 - closed in finish
        self.writer: TraceWriter | None = None
        self._named: dict[int, str] = {}
        self.events = 0
        self.lost = 0
        self.size = 0

    def start(self, fs: Tracefs) -> None:
        self.meta.setdefault("start_time", time.time())
        self.meta.setdefault("start_time_iso",
                             datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
        self.writer = TraceWriter(self._file, self.meta, formats=fs.ctx.formats)
        if FUSED_DRAIN and getattr(getattr(fs.tracer, "ops", None), "native", None) is not None:
            # native users will fill rings fast: the first drain rounds must not page in
            # the encoder's memory while the program races them
            self.writer.prepare_native(fs.ctx.buffer.native_capacity)
        super().start(fs)

    def consume(self, items: list) -> None:
        writer = self.writer
        assert writer is not None
        self._name_threads()
        writer.write_events(items)

    def _round(self, pipe: Any, timeout: float) -> bool:
        if not FUSED_DRAIN:
            return super()._round(pipe, timeout)
        items = pipe.read_or_feed(timeout, self._feed)
        if items:
            self.consume(items)
        return items is None or bool(items)

    def _feed(self, ring: Any, tid: int, name_of: Callable[[types.CodeType], str]) -> None:
        """Write a round that is one native ring's records (see TracePipe.read_or_feed)."""
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
        assert writer is not None
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
                writer.close()
            self.size = os.fstat(self._file.fileno()).st_size  # the program may have chdir'd
        finally:
            self._file.close()
        self.events = writer.events_written
        self.lost = fs.ctx.buffer.totals().lost

    def summary(self) -> str:
        """``rethook: 12,345 events (0 lost) written to trace.dat (123.4 KB)``, and a hint
        when events were lost."""
        line = (f"rethook: {self.events:,} events ({self.lost:,} lost) written to "
                f"{self.path} ({human_size(self.size)})")
        if self.lost:
            line += ("\nrethook: the program made events faster than they could be written;"
                     " a larger per-thread buffer (-b KB) or a narrower filter (-l) keeps them")
        return line


class Streamer(_Drain):
    """Prints events while the program runs, in the tracer's text format (``trace_pipe``).

    Lines go straight to the output's file descriptor, one ``write`` per batch, never
    through the program's ``sys.stdout``: flushing that from another thread would push out
    the program's half-written lines and change how its output is buffered.
    """

    def __init__(self, out: IO[str] | None = None) -> None:
        super().__init__()
        self.out = out
        self._fd: int | None = None
        self.lines = 0

    def start(self, fs: Tracefs) -> None:
        from rethook.output.text import Threads, renderer_for  # only stream renders text

        out = self.out if self.out is not None else sys.stdout
        try:
            out.flush()  # what was printed before the program belongs before its events
            self._fd = os.dup(out.fileno())  # ours, even if the program closes its stdout
        except (OSError, ValueError, AttributeError):
            self._fd = None  # no file descriptor (a StringIO...): write to the stream
        self.out = out
        self.threads = Threads(fs.ctx.buffer.threads())
        self.renderer = renderer_for(fs.tracer.name, fs.ctx.formats, self.threads,
                                     fs.ctx.options.as_dict(), describe=fs.describe())
        super().start(fs)

    def consume(self, items: list) -> None:
        self.threads.names.update(self.fs.ctx.buffer.threads())
        feed = self.renderer.feed
        self._emit(line for item in items for line in feed(item))

    def _emit(self, lines: Iterable[str]) -> None:
        text = "".join(line + "\n" for line in lines)
        if not text:
            return
        self.lines += text.count("\n")
        if self._fd is None:
            assert self.out is not None
            self.out.write(text)
            self.out.flush()
            return
        data = text.encode(getattr(self.out, "encoding", None) or "utf-8", "backslashreplace")
        while data:
            data = data[os.write(self._fd, data):]

    def finish(self, fs: Tracefs) -> None:
        try:
            self._drain_rest()
            self._emit(self.renderer.flush())
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class ProfileObserver(Observer):
    """Turns the function profiler on for the run (``rethook profile``)."""

    def start(self, fs: Tracefs) -> None:
        fs.write("function_profile_enabled", "1")

    def finish(self, fs: Tracefs) -> None:
        fs.write("function_profile_enabled", "0")


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
    return {
        "tracer": fs.tracer.name,
        "options": fs.ctx.options.as_dict(),
        "argv": program.argv,
        "command": program.command_line,
        "rethook_command": ["rethook", *sys.argv[1:]],
        "filter": filters,
        "notrace": list(settings.notrace),
        "graph_function": list(settings.graph_functions),
        "graph_notrace": list(settings.graph_notrace),
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


# --- running -----------------------------------------------------------------------------------
@dataclass
class Outcome:
    """How the program ended."""

    exit_code: int = 0
    interrupted: bool = False  # an uncaught KeyboardInterrupt: Python exits by SIGINT
    in_child: bool = False  # this is a forked child of the program that got back here


class Session:
    """Runs a loaded :class:`Program` once, with ``fs`` tracing it, and says how it ended."""

    def __init__(self, program: Program, fs: Tracefs) -> None:
        if program.code is None:
            raise ValueError("load() the program first")
        self.program = program
        self.fs = fs

    def run(self, observers: Sequence[Observer] = ()) -> Outcome:
        program, fs = self.program, self.fs
        assert program.code is not None
        pid = os.getpid()
        globals_ = self._install_main()
        for obs in observers:
            obs.start(fs)
        outcome = Outcome()
        # outermost: the code of the frame an uncaught exception's traceback starts at
        run, outermost = _runner(program, globals_)
        fs.write("tracing_on", "1")
        try:
            run()
        except SystemExit as e:
            with notrace():  # what the interpreter does, not the program: not traced
                outcome.exit_code = _exit_status(e)
        except BaseException as e:  # noqa: BLE001 - the program's uncaught exception
            with notrace():
                _print_uncaught(e, outermost)
            outcome.exit_code = 1
            outcome.interrupted = isinstance(e, KeyboardInterrupt)
        # What Python's finalization does next, still traced: wait for non-daemon threads
        # (after threading's own atexit callbacks, which e.g. stop executor workers), then run
        # the atexit handlers.
        try:
            _wait_for_threads()
            atexit._run_exitfuncs()
        except KeyboardInterrupt:
            outcome.interrupted = True
            outcome.exit_code = outcome.exit_code or 1
        if os.getpid() == pid:
            for obs in observers:
                obs.stop(fs)
        fs.close()  # calls still open now (daemon threads) are delivered as unfinished
        fs.write("tracing_on", "0")
        if os.getpid() != pid:
            outcome.in_child = True
            return outcome
        for obs in observers:
            obs.finish(fs)
        return outcome

    def _install_main(self) -> dict[str, Any]:
        """A fresh ``__main__`` for the program, with the attributes Python gives it."""
        program = self.program
        main = types.ModuleType("__main__")
        g = main.__dict__
        g["__file__"] = program.path
        g["__cached__"] = None
        g["__builtins__"] = builtins
        g["__loader__"] = program.loader
        if program.spec is not None:
            g["__spec__"] = program.spec
            g["__package__"] = program.spec.parent
            g["__cached__"] = program.spec.cached
        else:
            g["__spec__"] = None
            g["__package__"] = None
        sys.modules["__main__"] = main
        sys.argv = program.argv
        _set_path0(program.path0)
        return g


def _runner(program: Program, globals_: dict[str, Any]
            ) -> tuple[Callable[[], None], types.CodeType]:
    """How to start the program, and the code of its outermost frame.

    A script's code is executed in its ``__main__``. A ``-m`` module runs as Python runs it,
    through runpy, so its frames (and an uncaught exception's traceback, which starts in
    ``<frozen runpy>``) are Python's; runpy is handed the code compiled and registered
    already.
    """
    import runpy

    code, spec = program.code, program.spec
    assert code is not None
    run_main = getattr(runpy, "_run_module_as_main", None)
    find = getattr(runpy, "_get_module_details", None)
    if spec is None or run_main is None or find is None:
        return (lambda: exec(code, globals_)), code

    def found(mod_name: str, error: type = ImportError) -> tuple:
        runpy._get_module_details = find  # once: runpy is the program's again
        return spec.name, spec, code

    def run() -> None:
        runpy._get_module_details = found
        try:
            run_main(program.module, alter_argv=True)
        finally:
            runpy._get_module_details = find

    return run, run_main.__code__


def _exit_status(e: SystemExit) -> int:
    """What Python does with an uncaught SystemExit: None is 0, an int is the status, anything
    else is printed to stderr and the status is 1."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stderr.write(f"{code}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a broken stderr: Python ignores it too
        pass
    return 1


def _print_uncaught(e: BaseException, code: types.CodeType) -> None:
    """Print an uncaught exception as Python would, starting at the program's own frame."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code is not code:
        tb = tb.tb_next
    if tb is not None:
        e.__traceback__ = tb
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - as Python: a failing flush must not hide the error
        pass
    sys.excepthook(type(e), e, e.__traceback__)


def _wait_for_threads() -> None:
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()  # Python calls it again at exit: it returns at once the second time
        return
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join()
