"""Find, compile and run a program exactly as ``python SCRIPT ARGS``, ``python -m MODULE ARGS``
or ``python -c COMMAND ARGS`` would (the role of coverage.py's execfile.py).

:meth:`Program.load` finds and compiles the program *before* anything of it runs, so that its
functions are in the registry (as ``__main__.*``) when the filters are written. For ``-m`` the
modules of the program's package are compiled too, without importing them
(:func:`prepare_package`): ``-l 'pkg.*'`` and probes on ``pkg.mod.func`` resolve
against modules the program has not imported yet. The parent packages of a ``-m`` module are
imported when the program runs (traced, as ``python -m`` imports them before ``__main__``).

:func:`run_main` runs the loaded program in a fresh ``__main__`` and turns its end into an
:class:`Outcome`, as the interpreter does: ``sys.exit`` statuses, an uncaught exception
printed from the program's own frame, non-daemon threads waited for, ``atexit`` handlers.
"""

from __future__ import annotations

import atexit
import builtins
import io
import os
import sys
import threading
import types

# The interpreter's own import machinery, which importlib.machinery re-exports: the importlib
# package is ~0.3 ms of a script's start-up (a module run loads it anyway: _find_spec).
from _frozen_importlib import BuiltinImporter
from _frozen_importlib_external import ExtensionFileLoader, PathFinder, SourceFileLoader

from rethook import gcpause
from rethook.engine.core import notrace

try:
    from rethook.engine._ccore import compile_source as _compile_source
except ImportError:  # no C core built
    _compile_source = None

TYPE_CHECKING = False
if TYPE_CHECKING:
    import importlib.machinery
    from collections.abc import Callable, Container, Iterator, Sequence
    from typing import Any

#: Most local modules the import walk reads, and most modules of a package compiled ahead.
MAX_LOCAL_FILES = 500


def compile_exec(source: str | bytes, filename: str) -> types.CodeType:
    """``compile(source, filename, "exec", dont_inherit=True)``: the program's own
    ``__future__`` imports are its own. Through the C core where it is built, which skips
    compile()'s check for an AST source (the ast module's node types, ~3 ms, made at the
    first call in a process)."""
    if _compile_source is not None:
        return _compile_source(source, filename)
    return compile(source, filename, "exec", dont_inherit=True)


class ProgramError(Exception):
    """The program cannot be started: no such script, no such module (a usage error)."""


class Program:
    """A script path, a module name or a command string, with its arguments; :meth:`load`
    compiles it."""

    def __init__(self, script: str | None = None, module: str | None = None,
                 args: Sequence[str] = (), command: str | None = None) -> None:
        if sum(x is not None for x in (script, module, command)) != 1:
            raise ValueError("give exactly one of script, module and command")
        self.script = script
        self.module = module
        self.command = command
        self.args = list(args)
        self.code: types.CodeType | None = None
        self.path = ""  # the file the code came from (the program's __file__)
        self.path0 = ""  # what sys.path[0] becomes
        self.spec: importlib.machinery.ModuleSpec | None = None
        self.loader: Any = None

    @property
    def argv(self) -> list[str]:
        """The program's ``sys.argv``: as Python sets it for a script, ``-m`` or ``-c``."""
        if self.command is not None:
            return ["-c", *self.args]
        first = self.script if self.script is not None else self.path
        return [first, *self.args]

    @property
    def command_line(self) -> list[str]:
        """How the program would be started without rethook (for the trace's metadata)."""
        if self.script is not None:
            return ["python", self.script, *self.args]
        if self.command is not None:
            return ["python", "-c", self.command, *self.args]
        return ["python", "-m", str(self.module), *self.args]

    def load(self) -> types.CodeType:
        """Find and compile the program (nothing of it runs), and point ``sys.path[0]`` where
        Python would. Raises :class:`ProgramError` if it cannot be found, SyntaxError if it
        does not compile."""
        if self.script is not None:
            self._load_script(self.script)
        elif self.command is not None:
            # dont_inherit: this module's own __future__ imports must not leak into the program
            self.code = compile_exec(self.command, "<string>")
            self.path0 = ""
            _set_path0(self.path0)
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
        self.code = compile_exec(source, path)
        self.path = path
        self.path0 = os.path.dirname(os.path.realpath(path))  # as Python does: links resolved
        self.loader = SourceFileLoader("__main__", path)
        _set_path0(self.path0)

    def _load_module(self, name: str) -> None:
        if not name or name.startswith("."):
            raise ProgramError(f"relative module names are not supported: {name!r}")
        self.path0 = os.getcwd()
        _set_path0(self.path0)  # python -m looks in the current directory first
        spec = find_spec_of(name)
        if spec.submodule_search_locations is not None:  # a package: run its __main__
            if name.endswith(".__main__"):
                raise ProgramError(f"cannot use package {name!r} as the __main__ module")
            spec = find_spec_of(name + ".__main__", package=name)
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

    # --- the program's own code -----------------------------------------------------------------
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
            for name in _imported_names(path, self.code if path == self.path else None):
                if name in top:
                    continue
                found = _local_module(root, name)
                if found is None:
                    continue
                top.append(name)
                todo.extend(found)
        return top


def prepare_package(registry: Any, top: str, skip: Container[str] = ()) -> None:
    """Compile every module of the top-level package ``top`` that is not imported yet, from
    its file (source or bytecode), without running or importing anything, and hand it to
    ``registry.prepare_module`` -- so that filters and probes can name its functions before
    the program imports it. Names in ``skip`` are left out (the module run as ``__main__``)."""
    for name, loader in package_loaders(top):
        if name in skip or name in sys.modules:
            continue
        try:
            code = loader.get_code(name)
            origin = loader.get_filename(name)
        except (ImportError, SyntaxError, ValueError, OSError, AttributeError):
            continue  # the import would fail too, and say so when it happens
        if code is not None:
            registry.prepare_module(name, code, origin, root=top)


def _find_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """``importlib.util.find_spec``, that module loaded at the first use (start-up:
    test_startup)."""
    import importlib.util

    return importlib.util.find_spec(name)


def package_loaders(top: str) -> Iterator[tuple[str, Any]]:
    """``(module name, loader)`` of a top-level package and its submodules, found on disk
    through the path finders (zip files too) without importing any of them; at most
    :data:`MAX_LOCAL_FILES`. A plain module yields itself; extension modules are skipped."""
    try:
        spec = _find_spec(top)  # a top-level name: imports nothing
    except (ImportError, ValueError):
        return
    if spec is None:
        return
    todo = [(top, spec)]
    count = 0
    while todo and count < MAX_LOCAL_FILES:
        name, spec = todo.pop()
        loader = spec.loader
        if loader is not None and hasattr(loader, "get_code") and spec.origin not in (
                None, "built-in", "frozen") and not isinstance(
                loader, ExtensionFileLoader):
            count += 1
            yield name, loader
        locations = spec.submodule_search_locations
        if not locations:
            continue
        for entry in _submodule_names(list(locations)):
            full = f"{name}.{entry}"
            try:
                sub = PathFinder.find_spec(full, list(locations))
            except (ImportError, ValueError, OSError, KeyError):
                continue  # KeyError: a namespace subpackage wants its parent imported
            if sub is not None:
                todo.append((full, sub))


def _submodule_names(locations: list[str]) -> list[str]:
    """Names of the modules and packages in a package's directories (pkgutil's rule)."""
    import importlib.machinery  # (loaded by now: _find_spec)

    names: dict[str, None] = {}
    suffixes = tuple(importlib.machinery.all_suffixes())
    for where in locations:
        try:
            entries = sorted(os.listdir(where))
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(where, entry)
            if entry.endswith(suffixes):
                stem = entry.split(".", 1)[0]
            elif os.path.isdir(path) and "." not in entry:
                stem = entry
            else:
                continue
            if stem.isidentifier() and stem != "__init__":
                names[stem] = None
    return list(names)


def _set_path0(path0: str) -> None:
    if sys.path:
        sys.path[0] = path0
    else:
        sys.path.append(path0)


def find_spec_of(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec:
    """The spec of module ``name``. Its parent packages are not imported when the path
    finders can find it from the parents' specs (the common case); otherwise they are, as
    ``importlib.util.find_spec`` does."""
    try:
        spec = _find_spec_unimported(name)
        if spec is None:
            spec = _find_spec(name)
    except Exception as e:  # noqa: BLE001 - a parent package is missing or its code fails
        raise ProgramError(f"error while finding module {name!r} ({type(e).__name__}: {e})") \
            from None
    if spec is None:
        if package is not None:
            raise ProgramError(f"no module named {name!r}; {package!r} is a package and "
                               "cannot be directly executed")
        raise ProgramError(f"no module named {name!r}")
    return spec


def _find_spec_unimported(name: str) -> importlib.machinery.ModuleSpec | None:
    """Find a dotted module through its parents' search locations, importing nothing; None
    when that is not how it is found (an import hook, a parent that is not a directory)."""
    parts = name.split(".")
    spec = _find_spec(parts[0])
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        full = ".".join(parts[: i + 1])
        loaded = sys.modules.get(full)
        if loaded is not None:
            spec = getattr(loaded, "__spec__", None)
            continue
        spec = PathFinder.find_spec(full, list(spec.submodule_search_locations))
    return spec


def _imported_names(path: str, code: types.CodeType | None = None) -> list[str]:
    """Top-level names of the absolute imports anywhere in a source file (``code``: the file
    compiled already), read from the ``IMPORT_NAME`` instructions of its code and of the code
    nested in it, in that order: parsing the file with ``ast`` would make the ast module's
    node types (~3 ms of start-up), ``dis`` costs its imports. Imports the compiler leaves
    out (``if False:``) are not found: they never run."""
    if code is None:
        try:
            with io.open_code(path) as f:
                code = compile_exec(f.read(), path)
        except (OSError, SyntaxError, ValueError):
            return []
    import opcode

    ops = opcode.opmap
    import_name, extended, cache = ops["IMPORT_NAME"], ops["EXTENDED_ARG"], ops["CACHE"]
    load_const, small_int = ops["LOAD_CONST"], ops.get("LOAD_SMALL_INT")  # (3.14 has both)
    names: list[str] = []
    todo = [code]
    for c in todo:  # (grows as it goes: nested code after its parent)
        todo += [k for k in c.co_consts if type(k) is types.CodeType]
        raw = c.co_code  # (op, arg) pairs; inline caches are CACHE pairs
        if import_name not in raw[::2]:
            continue
        ext = 0
        level_at, fromlist_at = (cache, 0), (cache, 0)  # the two instructions before
        for i in range(0, len(raw), 2):
            op, arg = raw[i], raw[i + 1] | ext
            ext = arg << 8 if op == extended else 0
            if op == extended or op == cache:
                continue
            if op == import_name:  # LOAD_CONST level; LOAD_CONST fromlist; IMPORT_NAME name
                level_op, level = level_at
                if level_op == load_const:
                    level = c.co_consts[level]
                if level_op in (load_const, small_int) and level == 0:
                    names.append(c.co_names[arg].split(".")[0])
            level_at, fromlist_at = fromlist_at, (op, arg)
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


# --- running -----------------------------------------------------------------------------------
class Outcome:
    """How the program ended (filled in as it ends)."""

    __slots__ = ("exit_code", "interrupted", "in_child")

    def __init__(self) -> None:
        self.exit_code = 0
        self.interrupted = False  # an uncaught KeyboardInterrupt: Python exits by SIGINT
        self.in_child = False  # this is a forked child of the program that got back here


def install_main(program: Program) -> dict[str, Any]:
    """A fresh ``__main__`` for the program, with the attributes Python gives it; returns
    its globals."""
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
    if program.command is not None:
        del g["__file__"], g["__cached__"]  # python -c's __main__ has neither
        g["__loader__"] = BuiltinImporter
    sys.modules["__main__"] = main
    sys.argv = program.argv
    _set_path0(program.path0)
    return g


def run_main(program: Program, globals_: dict[str, Any], outcome: Outcome,
             tracing: Callable[[], None]) -> None:
    """Run the program in ``globals_`` (after ``tracing()`` turned tracing on), then what
    Python's finalization does before the interpreter shuts down; ``outcome`` says how it
    ended."""
    # outermost: the code of the frame an uncaught exception's traceback starts at
    run, outermost = _runner(program, globals_)
    gcpause.resume(program_starts=True)  # (the command line paused it for its own start-up)
    tracing()
    try:
        run()
    except SystemExit as e:
        with notrace():  # what the interpreter does, not the program: not traced
            outcome.exit_code = exit_status(e)
    except BaseException as e:  # noqa: BLE001 - the program's uncaught exception
        with notrace():
            _print_uncaught(e, outermost)
        outcome.exit_code = 1
        outcome.interrupted = isinstance(e, KeyboardInterrupt)
    finish_like_python(outcome)


def finish_like_python(outcome: Outcome) -> None:
    """What Python's finalization does after the main program, still traced: wait for
    non-daemon threads (after threading's own atexit callbacks, which e.g. stop executor
    workers), then run the atexit handlers."""
    try:
        _wait_for_threads()
        atexit._run_exitfuncs()
    except KeyboardInterrupt:
        outcome.interrupted = True
        outcome.exit_code = outcome.exit_code or 1


def _runner(program: Program, globals_: dict[str, Any]
            ) -> tuple[Callable[[], None], types.CodeType]:
    """How to start the program, and the code of its outermost frame.

    A script's code is executed in its ``__main__``. A ``-m`` module runs as Python runs it,
    through runpy, so its frames (and an uncaught exception's traceback, which starts in
    ``<frozen runpy>``) are Python's; runpy is handed the code compiled and registered
    already, once the module's parent packages are imported as runpy imports them.
    """
    code, spec = program.code, program.spec
    assert code is not None
    if spec is None:
        return (lambda: exec(code, globals_)), code
    import runpy  # (a script does without: ~1 ms of start-up)

    run_main_ = getattr(runpy, "_run_module_as_main", None)
    find = getattr(runpy, "_get_module_details", None)
    if run_main_ is None or find is None:
        return (lambda: exec(code, globals_)), code

    def found(mod_name: str, error: type = ImportError) -> tuple:
        runpy._get_module_details = find  # once: runpy is the program's again
        parent = spec.name.rpartition(".")[0]
        if parent:
            try:
                __import__(parent)
            except ImportError:
                return find(mod_name, error)  # runpy's own report of the failure
            again = _find_spec(spec.name)
            if again is None or again.origin != spec.origin:
                return find(mod_name, error)  # the parent moved it: as Python finds it now
        return spec.name, spec, code

    def run() -> None:
        runpy._get_module_details = found
        try:
            run_main_(program.module, alter_argv=True)
        finally:
            runpy._get_module_details = find

    return run, run_main_.__code__


def exit_status(e: SystemExit) -> int:
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
