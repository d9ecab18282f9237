"""Following child processes: every process a traced program starts records with the same
settings, and the run ends with one result (docs/cli.md, "Child processes").

A run that follows has a directory of its own (:class:`Follow`): next to the output file
(``trace.dat.procs/``) for ``record``, made when the program first starts or forks another
(most start none, and making and removing it costs a few ms on a file system that discards
freed blocks), a temporary one for ``stream`` (at once: its printer reads it) and ``profile``
(when first needed, as for ``record``). Every process but the first
writes its results there, as it runs:

* a fork child (``os.fork``, multiprocessing's fork and forkserver workers,
  ``ProcessPoolExecutor``) goes on with the parent's tracer and rings (emptied, see
  rethook.buffer.ring), and its observers are replaced by a recorder of its own file,
  ``PID.dat`` (``profile``: its table, ``PID.profile``, written when it ends);
* a program started with ``subprocess``, ``os.posix_spawn``, ``os.exec*`` or ``os.system``
  gets rethook's start-up directory first on ``PYTHONPATH`` and the run's directory in
  ``RETHOOK_FOLLOW`` (only in the environment handed to the new program: the traced program's
  own ``os.environ`` is untouched). A Python among them imports the start-up hook
  (``runner/boot/sitecustomize.py``), which puts ``sys.path`` and ``os.environ`` back, and
  calls :func:`boot`: tracing starts with the run's settings when the program's ``__main__``
  starts, and is finished when the interpreter exits. A program that cannot be traced is
  recorded in the run's ledger with the reason (not Python, a Python without rethook...).

At the end the first process gathers the rest (:meth:`Follow.append_sections` copies each
process file into the trace as a section; :meth:`Follow.profiles` merges the tables;
``stream`` prints children's events while they run, :meth:`Follow.tails`) and names the
children that were not traced. A process file is a complete trace file on its own: if the
first process is killed, they stay readable in the run's directory.
"""

from __future__ import annotations

import os
import sys
import threading
import types

from rethook import jsontext
from rethook.buffer.tracefile import TAG_END, TraceWriter, iter_chunks
from rethook.engine.registry import find_spec_after
from rethook.runner.settings import TraceSettings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from rethook.buffer.traceread import TraceTail

#: What the start-up hook is told, in the environment of a program the run starts.
ENV_RUN = "RETHOOK_FOLLOW"
#: The program's own PYTHONPATH ("-": it had none), put back by the start-up hook.
ENV_PYTHONPATH = "RETHOOK_FOLLOW_PYTHONPATH"
#: The directory whose sitecustomize.py starts tracing in a new Python.
BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")

#: multiprocessing's helper processes (see multiprocessing_helper).
FORK_SERVER = "multiprocessing's fork server"
_HELPERS = {"multiprocessing.forkserver": FORK_SERVER,
            "multiprocessing.resource_tracker": "multiprocessing's resource tracker"}

_SETTINGS = "settings.json"
_LEDGER = "started"


class Follow:
    """The directory of one run's processes, and what each process does with it."""

    def __init__(self, rundir: str, mode: str, settings: TraceSettings, root: int,
                 temporary: bool) -> None:
        self.rundir = rundir
        self.mode = mode  # record, stream or profile
        self.settings = settings
        self.root = root  # pid of the first process
        self.temporary = temporary  # a directory of its own, removed at the end
        self.merged: set[int] = set()  # pids whose files append_sections took in
        self._made = False  # the directory and its settings exist (make())

    @classmethod
    def create(cls, mode: str, settings: TraceSettings, output: str | None = None) -> Follow:
        """The first process's: a new run directory, next to ``output`` if given (made when
        it is first needed: :meth:`make`)."""
        if output is not None:
            rundir = os.path.abspath(output) + ".procs"
            if os.path.isdir(rundir):  # a previous run's leftovers
                for name in os.listdir(rundir):
                    os.unlink(os.path.join(rundir, name))
                os.rmdir(rundir)
            follow = cls(rundir, mode, settings, os.getpid(), False)
        else:  # stream and profile: a temporary directory, named when it is made
            follow = cls("", mode, settings, os.getpid(), True)
        return follow

    @classmethod
    def load(cls, rundir: str) -> Follow:
        import json  # (a child's start-up: the reader's; jsontext writes)

        with open(os.path.join(rundir, _SETTINGS), encoding="utf-8") as f:
            data = json.load(f)
        settings = TraceSettings.from_json(json.dumps(data["settings"]))
        follow = cls(rundir, data["mode"], settings, data["root"], data["temporary"])
        follow._made = True
        return follow

    def make(self) -> None:
        """Make the run's directory and its settings file, unless made: before the program
        starts or forks another process (the only ones that use them). The settings are
        written whole or not at all: a child of another process may make them too."""
        if self._made:
            return
        if not self.rundir:  # a temporary one
            import tempfile  # (start-up: test_startup)

            self.rundir = tempfile.mkdtemp(prefix="rethook-run-")
        os.makedirs(self.rundir, exist_ok=True)
        path = os.path.join(self.rundir, _SETTINGS)
        part = f"{path}.{os.getpid()}"
        with open(part, "w", encoding="utf-8") as f:
            f.write(jsontext.dumps({"mode": self.mode, "settings": self.settings.as_dict(),
                                    "root": self.root, "temporary": self.temporary}))
        os.replace(part, path)
        self._made = True

    def _names(self) -> list[str]:
        """The files in the run's directory (none if it was never made)."""
        if not self.rundir:
            return []
        try:
            return os.listdir(self.rundir)
        except FileNotFoundError:
            return []

    # --- the files of the run --------------------------------------------------------------
    def process_file(self, suffix: str = ".dat") -> str:
        """A new file for this process (``PID.dat``; ``PID.N.dat`` after an exec)."""
        self.make()
        pid = os.getpid()
        n = 0
        while True:
            name = f"{pid}{suffix}" if n == 0 else f"{pid}.{n}{suffix}"
            path = os.path.join(self.rundir, name)
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                return path
            except FileExistsError:
                n += 1

    def note_started(self, pid: int, how: str, executable: str, argv: list[str]) -> None:
        """Add a started program to the ledger (one short line: an atomic append)."""
        line = jsontext.dumps({"pid": pid, "parent": os.getpid(), "how": how,
                               "executable": executable, "argv": argv[:8]}) + "\n"
        try:
            self.make()
            fd = os.open(os.path.join(self.rundir, _LEDGER),
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode("utf-8", "backslashreplace"))
            finally:
                os.close(fd)
        except OSError:
            pass  # the run's directory is gone (the first process finished): nothing to tell

    def trace_files(self) -> list[tuple[str, dict[str, Any]]]:
        """The children's trace files with their META, oldest first."""
        out = []
        for name in self._names():
            if not name.endswith(".dat"):
                continue
            path = os.path.join(self.rundir, name)
            meta = _first_meta(path)
            out.append((path, meta))
        out.sort(key=lambda pm: (pm[1].get("start_time", 0), pm[0]))
        return out

    # --- what the first process does at the end --------------------------------------------
    def append_sections(self, writer: TraceWriter) -> list[str]:
        """Copy every child's trace file into ``writer`` as a section; returns notes for the
        summary. Files that were complete are removed."""
        notes = []
        for path, meta in self.trace_files():
            pid = meta.get("pid")
            if not isinstance(pid, int):
                continue
            info = {"pid": pid, "ppid": meta.get("ppid"), "how": meta.get("how", "?"),
                    "argv": meta.get("argv", [])}
            complete = _complete(path)
            if not complete:
                if _exec_note(path):
                    info["note"] = "replaced itself by exec"
                elif _alive(pid):
                    info["note"] = "still running when the trace was finished"
                    notes.append(f"process {pid} was still running: its trace stops here "
                                 f"(the rest goes on in {path})")
                else:
                    info["note"] = "ended without finishing its trace (killed?)"
                    notes.append(f"process {pid} ended without finishing its trace: "
                                 "its events up to then are kept")
            writer.append_process(path, info)
            self.merged.add(pid)
            if complete or info.get("note") != "still running when the trace was finished":
                _unlink(path)
        return notes

    def profiles(self) -> list[tuple[int, list[list[Any]]]]:
        """The children's profile tables: ``(pid, [[name, hit, time_ns, time_sq], ...])``."""
        out = []
        for name in sorted(self._names()):
            if name.endswith(".profile"):
                import json  # (only if there are some: see jsontext)

                try:
                    with open(os.path.join(self.rundir, name), encoding="utf-8") as f:
                        data = json.load(f)
                    out.append((int(data["pid"]), data["rows"]))
                except (OSError, ValueError, KeyError, TypeError):
                    continue
        return out

    def untraced(self) -> list[str]:
        """Lines naming the started programs that were not traced, with the reason."""
        traced = set()
        for name in self._names():
            stem = name.split(".")[0]
            if stem.isdigit() and name.endswith((".dat", ".profile", ".helper")):
                traced.add(int(stem))
        traced |= self.merged
        lines = []
        for entry in self._ledger():
            pid = entry.get("pid")
            if not isinstance(pid, int) or pid in traced:
                continue
            reason = _read(os.path.join(self.rundir, f"{pid}.untraced"))
            exe = str(entry.get("executable") or "?")
            if not reason:
                reason = _why_untraced(exe, [str(a) for a in entry.get("argv") or []])
            lines.append(f"process {pid} ({' '.join(entry.get('argv') or [exe])[:60]}) "
                         f"not traced: {reason}")
        return lines

    def _ledger(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        if not self.rundir:
            return entries
        text = _read(os.path.join(self.rundir, _LEDGER))
        if text:
            import json  # (only if programs were started: see jsontext)
        for line in text.splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
        return entries

    def _done_with(self, name: str) -> bool:
        """Whether a process's trace file left in the run's directory at the end is of no
        more use: stream printed it, once it was complete (record merged and removed the
        ones it could: the rest stay)."""
        return self.mode == "stream" and _complete(os.path.join(self.rundir, name))

    def finish(self, keep: bool = False) -> None:
        """Remove the run's directory, unless something in it is still useful."""
        if keep or not self.rundir:
            return
        try:
            names = self._names()
            if any(name.endswith(".dat") and not self._done_with(name) for name in names):
                return  # a child still writing, or a file not merged: it stays readable
            for name in names:
                _unlink(os.path.join(self.rundir, name))
            os.rmdir(self.rundir)  # (never made: FileNotFoundError, caught below)
        except OSError:
            pass

    # --- stream: children's events while they run ------------------------------------------
    def tails(self, known: dict[str, TraceTail]) -> Iterator[tuple[int, TraceTail]]:
        """Every child trace file as a :class:`TraceTail` (new ones added to ``known``)."""
        from rethook.buffer.traceread import TraceTail  # (stream's: record needs no reader)

        try:
            names = sorted(os.listdir(self.rundir)) if self.rundir else []
        except OSError:
            return
        for name in names:
            if name.endswith(".dat"):
                path = os.path.join(self.rundir, name)
                if path not in known:
                    known[path] = TraceTail(path)
        for tail in known.values():
            pid = tail.meta.get("pid")
            yield (pid if isinstance(pid, int) else 0), tail

    # --- starting programs -------------------------------------------------------------------
    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` for a program this run starts: the start-up hook first on PYTHONPATH."""
        self.make()
        env = dict(env)
        saved = env.get("PYTHONPATH")
        env[ENV_PYTHONPATH] = "-" if saved is None else saved
        env["PYTHONPATH"] = BOOT_DIR if not saved else BOOT_DIR + os.pathsep + saved
        env[ENV_RUN] = self.rundir
        return env


# --- wrapping the ways a program starts another ------------------------------------------------
_current: Follow | None = None  # the run this process belongs to
_before_exec: Callable[[list[str]], None] | None = None  # flushes this process's trace
_originals: dict[tuple[Any, str], Any] = {}


def install(follow: Follow, before_exec: Callable[[list[str]], None]) -> None:
    """Wrap ``os.exec*``, ``os.posix_spawn*``, ``os.system``, subprocess's fork_exec and
    runpy's code runner for this run (once per process)."""
    global _current, _before_exec
    _current = follow
    _before_exec = before_exec
    if _originals:
        return
    os.register_at_fork(before=_before_fork)
    _wrap(os, "execv", lambda real: lambda path, args: _execve(real, path, args, None))
    _wrap(os, "execve", lambda real: lambda path, args, env: _execve(real, path, args, env))
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            _wrap(os, name, _spawn_wrapper)
    _wrap(os, "system", _system_wrapper)
    # subprocess and multiprocessing start programs with _posixsubprocess.fork_exec; most
    # programs never import it, and importing it here cost every start-up ~2 ms (a shared
    # library, met by the registry's import watcher): wrapped as it is imported instead,
    # before subprocess binds it (importing subprocess here would cost ~10 ms)
    _when_imported("_posixsubprocess",
                   lambda module: _wrap(module, "fork_exec", _fork_exec_wrapper))
    subprocess = sys.modules.get("subprocess")
    if hasattr(subprocess, "_fork_exec"):
        _wrap(subprocess, "_fork_exec", _fork_exec_wrapper)


def _when_imported(name: str, then: Callable[[types.ModuleType], None]) -> None:
    """``then(module)`` once module ``name`` is imported: now if it is (or is built in: then
    importing it costs nothing), else as its body has run (:class:`_OnImport`)."""
    module = sys.modules.get(name)
    if module is None and name in sys.builtin_module_names:
        import importlib

        module = importlib.import_module(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _OnImport(name, then))


class _OnImport:
    """A meta-path finder for one module: it lets the finders after it find the module, and
    wraps the loader they return so that ``then(module)`` runs once the module's body has run,
    before the import returns it. It leaves ``sys.meta_path`` once it has found the module.
    (The loader keeps its type: only this instance's ``exec_module`` is wrapped, as the
    registry's import watcher does.)"""

    def __init__(self, name: str, then: Callable[[types.ModuleType], None]) -> None:
        self.name, self.then = name, then
        self._finding = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self._finding:
            return None
        self._finding = True
        try:
            spec = find_spec_after(self, fullname, path, target)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return None  # (nothing to wrap: the import goes on without this finder)
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        loader, then = spec.loader, self.then
        exec_module = getattr(loader, "exec_module", None)
        if isinstance(loader, type) or exec_module is None:
            spec.loader = _ThenLoader(loader, then)  # (a loader shared by many modules)
            return spec

        def exec_then(module: types.ModuleType) -> None:
            exec_module(module)
            then(module)

        loader.exec_module = exec_then
        return spec

    def invalidate_caches(self) -> None:
        pass


class _ThenLoader:
    """A loader that runs another's, then ``then(module)``: for :class:`_OnImport` when the
    loader found is shared by many modules and cannot be wrapped itself."""

    def __init__(self, loader: Any, then: Callable[[types.ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: Any) -> Any:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: types.ModuleType) -> None:
        exec_module = getattr(self.loader, "exec_module", None)
        if exec_module is not None:
            exec_module(module)
        else:  # a legacy loader
            self.loader.load_module(module.__name__)
        self.then(module)


def _before_fork() -> None:
    """A fork child writes its file in the run's directory: made before the fork, by the
    process that will look into it."""
    follow = _current
    if follow is not None:
        try:
            follow.make()
        except OSError:
            pass  # (the child's process_file() says so, where it can)


def _wrap(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    real = getattr(owner, name)
    wrapper = make(real)
    try:
        wrapper.__name__ = real.__name__
        wrapper.__qualname__ = getattr(real, "__qualname__", real.__name__)
        wrapper.__doc__ = real.__doc__
        wrapper.__wrapped__ = real
    except (AttributeError, TypeError):
        pass
    _originals[(owner, name)] = real
    setattr(owner, name, wrapper)


def _execve(real: Callable[..., Any], path: Any, args: Any, env: Any) -> Any:
    from rethook.engine.core import notrace

    follow = _current
    if follow is None:
        return real(path, args, *(() if env is None else (env,)))
    with notrace():
        argv = [os.fsdecode(a) for a in args]
        follow.note_started(os.getpid(), "exec", os.fsdecode(path), argv)
        if _before_exec is not None:
            _before_exec(argv)
        env = follow.environment(os.environ if env is None else env)
    return _originals[(os, "execve")](path, args, env)


def _spawn_wrapper(real: Callable[..., Any]) -> Callable[..., Any]:
    def spawn(path: Any, argv: Any, env: Any, *args: Any, **kwargs: Any) -> int:
        from rethook.engine.core import notrace

        follow = _current
        if follow is None:
            return real(path, argv, env, *args, **kwargs)
        with notrace():
            env = follow.environment(os.environ if env is None else env)
        pid = real(path, argv, env, *args, **kwargs)
        with notrace():
            follow.note_started(pid, "spawn", os.fsdecode(path), [os.fsdecode(a) for a in argv])
        return pid

    return spawn


def _fork_exec_wrapper(real: Callable[..., Any]) -> Callable[..., Any]:
    def fork_exec(args: Any, executable_list: Any, close_fds: Any, pass_fds: Any, cwd: Any,
                  env_list: Any, *rest: Any) -> int:
        from rethook.engine.core import notrace

        follow = _current
        if follow is None:
            return real(args, executable_list, close_fds, pass_fds, cwd, env_list, *rest)
        with notrace():
            if env_list is None:
                env = dict(os.environ)
            else:
                env = {}
                for item in env_list:
                    key, _, value = os.fsdecode(item).partition("=")
                    env[key] = value
            env_list = [os.fsencode(f"{k}={v}") for k, v in follow.environment(env).items()]
        pid = real(args, executable_list, close_fds, pass_fds, cwd, env_list, *rest)
        with notrace():
            argv = [os.fsdecode(a) for a in args] if args else []
            exe = os.fsdecode(executable_list[0]) if executable_list else (argv or ["?"])[0]
            follow.note_started(pid, "spawn", exe, argv)
        return pid

    return fork_exec


def _system_wrapper(real: Callable[..., Any]) -> Callable[..., Any]:
    lock = threading.Lock()

    def system(command: Any) -> int:
        follow = _current
        if follow is None:
            return real(command)
        # the C library's system() reads the process environment: lend it ours meanwhile
        with lock:
            added = {k: v for k, v in follow.environment(dict(os.environ)).items()
                     if os.environ.get(k) != v}
            for k, v in added.items():
                os.putenv(k, v)
            try:
                return real(command)
            finally:
                for k in added:
                    if k in os.environ:
                        os.putenv(k, os.environ[k])
                    else:
                        os.unsetenv(k)

    return system


# --- a started Python program (the start-up hook) ----------------------------------------------
def boot(rundir: str) -> None:
    """Called by the start-up hook: trace this program, which Python is about to run, with
    the run's settings, from its ``__main__`` on."""
    try:
        follow = Follow.load(rundir)
    except (OSError, ValueError, KeyError, TypeError) as e:
        _note_untraced(rundir, f"cannot read the run's settings ({e})")
        return

    helper = multiprocessing_helper(getattr(sys, "orig_argv", []))
    if helper is not None:
        _note(rundir, ".helper", helper)
        if helper != FORK_SERVER:
            return  # none of the program's code runs there, nor starts from there

    def hook(frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call" or frame.f_code.co_name != "<module>" \
                or frame.f_globals.get("__name__") != "__main__":
            return
        sys.setprofile(None)
        try:
            from rethook.runner.run import start_in_child

            start_in_child(follow, frame.f_code, dormant=helper is not None)
        except BaseException as e:  # noqa: BLE001 - the program runs on, untraced
            _note_untraced(rundir, f"rethook failed to start ({type(e).__name__}: {e})")

    sys.setprofile(hook)


def multiprocessing_helper(argv: list[str]) -> str | None:
    """What a process started as multiprocessing's fork server or resource tracker is (from
    its command line, ``python -c 'from multiprocessing.X import main; ...'``), else None.
    They live as long as the program, so their trace could never be finished with the run's:
    the resource tracker is not traced, the fork server traces only the workers it forks."""
    if "-c" not in argv[:-1]:
        return None
    command = argv[argv.index("-c") + 1]
    for module, what in _HELPERS.items():
        if command.startswith(f"from {module} import main"):
            return what
    return None


def _complete(path: str) -> bool:
    """Whether a process's trace file is finished (its END chunk written): what is left of
    it once its events are in the run's result (record: appended; stream: printed)."""
    return any(tag == TAG_END for tag, _ in iter_chunks(path))


def _note_untraced(rundir: str, reason: str) -> None:
    _note(rundir, ".untraced", reason)


def _note(rundir: str, suffix: str, text: str) -> None:
    """This process's ``PID<suffix>`` file in the run's directory."""
    try:
        with open(os.path.join(rundir, f"{os.getpid()}{suffix}"), "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        pass


# --- small helpers -----------------------------------------------------------------------------
def is_python(executable: str) -> bool:
    """Whether a program looks like a Python interpreter (by name, or this one)."""
    if _is_python_name(os.path.basename(executable)):
        return True
    try:
        return os.path.realpath(executable) == os.path.realpath(sys.executable)
    except (OSError, ValueError):
        return False


def _is_python_name(base: str) -> bool:
    """``python``, a version (``python3.12``), ABI letters (``python3.13d``), ``.exe``."""
    if not base.startswith("python"):
        return False
    rest = base[len("python"):].removesuffix(".exe")
    version = len(rest) - len(rest.lstrip("0123456789."))
    return all(c in "dmu" for c in rest[version:])


def _why_untraced(executable: str, argv: list[str]) -> str:
    if not is_python(executable):
        return "not a Python program"
    flags = [a for a in argv[1:] if a.startswith("-") and not a.startswith("--")]
    for flag in flags:
        if "I" in flag[1:] or "E" in flag[1:]:
            return "Python in isolated mode (-I or -E) ignores PYTHONPATH"
        if "S" in flag[1:]:
            return "Python without the site module (-S) runs no start-up hook"
        if flag in ("-c", "-m"):
            break
    return ("a Python that did not start tracing (it may have ended before its program ran, "
            "or its environment was replaced)")


def _first_meta(path: str) -> dict[str, Any]:
    """The META keys of a trace file's first chunks (before any events)."""
    meta: dict[str, Any] = {}
    for tag, raw in iter_chunks(path):
        if tag == b"META":
            import json  # (a child's trace, at the end: see jsontext)

            try:
                meta.update(json.loads(raw[8:-4].decode("utf-8", "surrogatepass")))
            except ValueError:
                pass
        elif tag in (b"EVTS", b"END ", b"STAT", b"LOST"):
            break
    return meta


def _exec_note(path: str) -> bool:
    for tag, raw in iter_chunks(path):
        if tag == b"META" and b'"exec_argv"' in raw:
            return True
    return False


def _alive(pid: int) -> bool:
    """Whether a process still runs (a zombie, ended but not yet waited for, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
