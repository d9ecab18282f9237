"""The function registry: every code object of the loaded modules, with a canonical name.

This is the kernel's ``available_filter_functions``: the list of everything that can be hooked.
Here a "function" is a code object that runs as a call: functions, methods, class and static
methods, property accessors, nested functions, lambdas, generator, coroutine and async-generator
functions, generator expressions and PEP 695 annotation scopes. Module bodies and class bodies
are not functions; :meth:`Registry.info` still names them if the engine meets one.

Discovery
---------
* Already loaded code, once a listing needs it (:meth:`Registry.functions`): a scan,
  ``gc.get_objects()`` filtered to functions (covers closures, decorated functions and
  methods), then every code object nested in theirs (``co_consts``), which finds generator
  expressions, lambdas and inner functions that do not exist as functions yet. What the scan
  finds is grouped by module and a module's group is registered when someone needs it, all at
  once (so its names are the same whatever asked first): a listing whose scope takes the
  module in (a filter of ``*:mod:__main__`` needs only ``__main__``), or the first run of one
  of its functions (:meth:`Registry.discover`); subscribers are told, as of an import. Before
  any scan, the first run of a function of a loaded module registers what that module's
  namespace holds instead, as an import does. The engine hooks only registered functions and
  leaves the rest to that: a start does not pay for finding, naming and hooking the few
  thousand functions of the standard library and rethook's CLI loaded by then, even under
  ``-l '*'``, and those that never run never cost anything.
* Modules imported later: a meta-path finder (first on ``sys.meta_path`` while someone
  subscribes) that finds nothing itself but asks the finders after it, and wraps the loader it
  gets: ``get_code`` (which every source and bytecode loader calls just before running the
  module body) registers the module's code object, whose ``co_consts`` hold every function the
  module will define; so a filter that names a function of a module not imported yet is hooked
  before its first call. ``exec_module`` is wrapped too, so that after the body has run the
  namespace is scanned once for functions generated at run time (``dataclasses``,
  ``namedtuple``...) and for modules whose loader has no ``get_code``.
  (Not an audit hook: audit hooks cannot be removed, and once one exists ``id()`` and
  ``sys._getframe()``, which the engine's hot path calls, each raise an audit event.)
* Everything else that runs (code made by ``exec``/``eval``/``compile``, modules loaded past the
  finder: another import hook ahead of it, ``spec_from_file_location(...).loader.exec_module``,
  zipimport, frozen modules): :meth:`Registry.discover`, which the engine's core calls on a code
  object's first execution, with its frame (see core.py's Discovery). A module body found that
  way registers everything nested in it; code compiled from a string registers only itself,
  and is named from the running call (see "Generated code" below).
* :meth:`Registry.add_code` for code the caller compiles itself (a script run by the CLI), and
  :meth:`Registry.refresh` as a safety net.
* :meth:`Registry.prepare_module` for modules not imported yet, compiled from their files by
  the caller (the modules of a package run with ``-m``), so that filters can name their
  functions before the import. The import watcher hands that very code object to the loader
  (its file unchanged), so the code that runs is the code that was named and hooked.

Generated code
--------------
Code compiled from a string (a file name like ``<string>``) has a ``co_qualname`` that says
how it was made, not what it is (``__create_fn__.<locals>.__init__`` for a dataclass's
``__init__``, ``<lambda>`` for a namedtuple's ``__new__``). A method is named after the
attribute it serves, in its class's module (``mymod.Point.__init__``): the class is the one
whose own dict holds the function (possibly wrapped), found in a module's namespace after an
import, or, for code met running, from the call's first argument (``self`` or ``cls``) by
walking its MRO. A function found outside a class keeps its ``__qualname__``. Code met running
that is no method is ``co_qualname`` in the module whose namespace it runs in (its globals'
``__name__``), else in the module that ran the ``exec``/``eval`` that made it, else under its
pseudo file name. (docs/functions.md, "Generated code".)

Names (see docs/functions.md) are ``module.qualname`` and never change once handed out.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from _functools import partial  # (functools itself is not imported at start-up)
from _weakref import ref  # (weakref, which re-exports it, is not either: ~0.5 ms)
from types import (
    AsyncGeneratorType,
    CodeType,
    CoroutineType,
    FrameType,
    FunctionType,
    GeneratorType,
    ModuleType,
)

from rethook.engine import forklocks
from rethook.engine.core import OWN_PACKAGE, is_own_module, notrace
from rethook.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

__all__ = ["FunctionInfo", "Registry", "Scope", "Within", "default_registry", "code_kind",
           "find_spec_after", "is_own_module", "no_modules"]

# co_flags bits (the inspect module has them too, but importing inspect is slow).
_CO_NEWLOCALS = 0x0002
_CO_GENERATOR = 0x0020
_CO_COROUTINE = 0x0080
_CO_ITERABLE_COROUTINE = 0x0100
_CO_ASYNC_GENERATOR = 0x0200

#: Kinds that are not functions: named on demand, never listed.
NON_FUNCTION_KINDS = frozenset({"module", "class"})
#: Anonymous code always carries its line, so its name does not depend on what else exists.
_ANONYMOUS = frozenset({"<lambda>", "<genexpr>", "<listcomp>", "<setcomp>", "<dictcomp>"})
#: Module name given to code whose module cannot be determined.
UNKNOWN_MODULE = "<unknown>"


class _FunctionFields:
    """The fields of a :class:`FunctionInfo`, in a class of their own: plain, mutable slots,
    which the registry fills before it makes the object a FunctionInfo (see _new_info)."""

    __slots__ = ("code", "name", "module", "qualname", "filename", "firstlineno", "kind",
                 "suffix")


class FunctionInfo(_FunctionFields, Frozen, eq=False):
    """One hookable code object and its canonical name.

    Compared by identity: the registry creates exactly one per code object.
    """

    __slots__ = ()  # (the fields: _FunctionFields's)

    code: CodeType
    #: Canonical printable name, unique across the registry: ``module + "." + qualname``.
    name: str
    #: Module name (what ``:mod:`` selects).
    module: str
    #: ``co_qualname`` (or the function's ``__qualname__`` for generated code), plus ``suffix``.
    qualname: str
    filename: str
    firstlineno: int
    #: "function", "generator", "coroutine", "async_generator", "lambda", "genexpr",
    #: "type_params" (PEP 695 annotation scope); "module" and "class" are never listed.
    kind: str
    #: Disambiguation suffix ("" or "@LINE" or "@LINE#N"), already part of name and qualname.
    suffix: str

    def __init__(self, code: CodeType, name: str, module: str, qualname: str, filename: str,
                 firstlineno: int, kind: str, suffix: str = "") -> None:
        # Through the slots' own setters (bound once, below the class): half the time of
        # object.__setattr__ by name. (The registry makes its own with _new_info.)
        _set_code(self, code)
        _set_name(self, name)
        _set_module(self, module)
        _set_qualname(self, qualname)
        _set_filename(self, filename)
        _set_firstlineno(self, firstlineno)
        _set_kind(self, kind)
        _set_suffix(self, suffix)

    @property
    def base_name(self) -> str:
        """The name without its disambiguation suffix."""
        return self.name[: len(self.name) - len(self.suffix)] if self.suffix else self.name

    @property
    def base_qualname(self) -> str:
        """The qualname without its disambiguation suffix."""
        q = self.qualname
        return q[: len(q) - len(self.suffix)] if self.suffix else q


# Frozen takes a record's fields from its class's own __slots__: FunctionInfo's are its base's.
FunctionInfo._fields = FunctionInfo.__match_args__ = _FunctionFields.__slots__
(_set_code, _set_name, _set_module, _set_qualname, _set_filename, _set_firstlineno, _set_kind,
 _set_suffix) = (_FunctionFields.__dict__[name].__set__ for name in _FunctionFields.__slots__)

#: A free-threaded build stops every thread to assign an object's ``__class__``.
_FREE_THREADED = "t" in getattr(sys, "abiflags", "") or not getattr(
    sys, "_is_gil_enabled", lambda: True)()


def _new_info(code: CodeType, name: str, module: str, qualname: str, kind: str,
              suffix: str) -> FunctionInfo:
    """A new FunctionInfo of the registry's: ``filename`` and ``firstlineno`` from the code.

    A FunctionInfo is frozen (its ``__setattr__`` raises), so its constructor stores each
    field through a call; a registry makes one per function of every module imported (~5,000
    for sqlglot). Instead, a _FunctionFields (the same layout) is filled with plain stores,
    then made a FunctionInfo by assigning its ``__class__``, which Python allows between
    classes of one layout: ~3 k instructions instead of ~8 k. It is this thread's alone
    until returned.
    """
    if _FREE_THREADED:
        return FunctionInfo(code, name, module, qualname, code.co_filename, code.co_firstlineno,
                            kind, suffix)
    info = _FunctionFields()
    info.code = code
    info.name = name
    info.module = module
    info.qualname = qualname
    info.filename = code.co_filename
    info.firstlineno = code.co_firstlineno
    info.kind = kind
    info.suffix = suffix
    info.__class__ = FunctionInfo  # type: ignore[assignment]
    return info  # type: ignore[return-value]


#: Every kind code_kind() gives, in the order engine/_cregistry.c numbers them (KIND_*).
_C_KINDS = ("module", "class", "genexpr", "lambda", "async_generator", "coroutine", "generator",
            "type_params", "comprehension", "function")


def code_kind(code: CodeType) -> str:
    """Classify a code object by its flags and name."""
    flags = code.co_flags
    name = code.co_name
    if not flags & _CO_NEWLOCALS:
        return "module" if name == "<module>" else "class"
    if name == "<genexpr>":
        return "genexpr"
    if name == "<lambda>":
        return "lambda"
    if flags & _CO_ASYNC_GENERATOR:
        return "async_generator"
    if flags & _CO_COROUTINE:
        return "coroutine"
    if flags & (_CO_GENERATOR | _CO_ITERABLE_COROUTINE):
        return "generator"
    if name.startswith("<generic parameters of "):
        return "type_params"
    if name in ("<listcomp>", "<setcomp>", "<dictcomp>"):  # only outside 3.12+'s inlining
        return "comprehension"
    return "function"


def _load_c() -> Any:
    """engine/_cregistry.c, set up with this module's facts: the C twin of :meth:`Registry.
    _collect`, of the naming loop of :meth:`Registry._commit`, of :func:`_namespace_functions`
    and of :meth:`Registry._tops`' common case (the same results at a tenth of the cost: a
    module's import names every function its body will make, and the first call into a module
    loaded before the program registers its whole namespace). None where it is not built, or
    where the pure engine is asked for (``RETHOOK_ENGINE=python``): this module is the
    reference."""
    from rethook.engine.select import ENV_VAR, PURE_NAMES

    if os.environ.get(ENV_VAR, "").strip().lower() in PURE_NAMES:
        return None
    try:
        from rethook.engine import _cregistry
    except ImportError:
        return None
    _cregistry.setup(_C_KINDS, _ANONYMOUS, FunctionInfo,
                     tuple(_FunctionFields.__dict__[n] for n in _FunctionFields.__slots__),
                     partial)
    return _cregistry


def _is_synthetic(filename: str) -> bool:
    """Code compiled from a string (``<string>``, attrs' ``<attrs generated ...>``), not frozen."""
    return filename.startswith("<") and not filename.startswith("<frozen ")


def _column(code: CodeType) -> int:
    """Leftmost source column on the code's first line (orders several codes on one line)."""
    line = code.co_firstlineno
    best = -1
    for start, end, col, end_col in code.co_positions():
        # Skip zero-width artificial positions (RESUME and friends report column 0).
        if start == line and col is not None and end_col is not None and (
            end_col > col or (end is not None and end > start)
        ):
            if best < 0 or col < best:
                best = col
    return best


if TYPE_CHECKING:
    #: A code object waiting for its name, within one registration batch: ``(code, module,
    #: qualname, kind, order, id(code))``, ``order`` numbering the batch's entries as they
    #: were found. (A tuple, not a class: a batch holds one per function of a module, and a
    #: slotted class's instances cost several times a tuple's to make.)
    _Entry = tuple[CodeType, str, str, str, int, int]
    Subscriber = Callable[[list[FunctionInfo]], None]
    #: Which modules a listing needs complete: a test of module names (Registry.functions).
    Scope = Callable[[str], bool]


def no_modules(module: str) -> bool:
    """The scope of a listing that needs no module complete."""
    return False


class Within:
    """The scope of some modules and their submodules (a :data:`Scope` that says which)."""

    def __init__(self, modules: Iterable[str]) -> None:
        self.modules = frozenset(modules)
        self._prefixes = tuple(m + "." for m in self.modules)

    def __call__(self, module: str) -> bool:
        return module in self.modules or module.startswith(self._prefixes)


class _Found:
    """What a scan found of one module and has not registered yet: the functions' code as
    ``(code, module, qualname)``, and the code of live generators and coroutines."""

    __slots__ = ("tops", "gens")

    def __init__(self) -> None:
        self.tops: list[tuple[CodeType, str, str]] = []
        self.gens: list[CodeType] = []

    def codes(self) -> Iterator[CodeType]:
        yield from (t[0] for t in self.tops)
        yield from self.gens


class Registry:
    """Every known code object and its :class:`FunctionInfo`.

    Thread safety: mutation happens under one lock; lookups (:meth:`name`, :meth:`lookup`,
    :meth:`info` for known code) read plain dicts without it. Registered code objects are kept
    alive, so ``id(code)`` is a stable key for as long as the registry lives.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        forklocks.hold(self, forklocks.REGISTRY)  # not left locked in a fork child
        self._subscribers: tuple[Subscriber, ...] = ()
        self._generation = 0
        self._start_over()

    def _start_over(self) -> None:
        """Every function forgotten: the state of a new registry (but its lock, subscribers
        and generation)."""
        self._by_id: dict[int, FunctionInfo] = {}
        self._taken: set[str] = set()
        self._modules: set[str] = set()
        self._listed: list[FunctionInfo] | None = None  # sorted cache, rebuilt on demand
        self._scanned = False
        self._walked: set[str] = set()  # loaded modules whose namespace discover() registered
        # module -> what a scan found of it and did not register yet (see _scan)
        self._unregistered: dict[str, _Found] = {}
        self._found_in: dict[int, str] = {}  # id(code) of a function found -> its group
        self._modules_at_scan: frozenset[tuple[str, int]] = frozenset()
        self._file_map: dict[str, str] = {}
        self._file_map_len = -1
        self._pending_namespaces: list[str] = []  # modules whose body may still generate code
        self._order = 0
        # code made by exec/eval that has not run yet -> the module that made it (the fallback
        # module of its name); weak, so code that never runs is not kept
        self._sites: dict[int, tuple[ref[CodeType], str]] = {}
        # module and class bodies _collect walked (their nested code registered): discover()
        # answers them at once (sqlglot runs ~1,200 class bodies as it is imported); weak
        self._bodies: dict[int, ref[CodeType]] = {}
        # A body's reference calls partial(_drop_body, key)(ref) as it dies: pop(key, ref).
        # (Not a weakref.KeyedRef: its Python __new__ and __init__ cost ~8 k instructions a
        # body, sqlglot's import ~10 M; a C partial and a plain reference, a tenth of that.)
        self._drop_body = self._bodies.pop
        self._added_modules: set[str] = set()  # modules registered by add_code
        # module name -> (code compiled ahead, its file, the file's stamp then)
        self._prepared: dict[str, tuple[CodeType, str, tuple[int, int] | None]] = {}
        self._prepared_roots: set[str] = set()  # packages whose every module is prepared
        self._retired: list[CodeType] = []  # forgotten prepared code, kept alive (_forget)

    def release(self) -> bool:
        """Forget every function, as a new registry would, once nothing subscribes to it (a
        finished run). Until the process ends, every collection of the interpreter's last
        ones would otherwise walk a few objects per function (~5,000 for sqlglot). False,
        changing nothing, while a subscriber (a running engine) keys its tables by these
        code objects."""
        with self._lock:
            if self._subscribers:
                return False
            self._start_over()
            self._generation += 1  # (a selection cached by generation is stale)
            return True

    # --- lookups ------------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        """Bumped whenever functions are added (lets callers cache selections)."""
        return self._generation

    def lookup(self, code: CodeType) -> FunctionInfo | None:
        """The info of a known code object, or None; never adds anything."""
        info = self._by_id.get(id(code))
        return info if info is not None and info.code is code else None

    def name(self, code: CodeType) -> str:
        """The canonical name of any code object (``info(code).name``), fast when known."""
        info = self._by_id.get(id(code))
        if info is not None and info.code is code:
            return info.name
        return self.info(code).name

    def info(self, code: CodeType, module: str | None = None) -> FunctionInfo:
        """The info of any code object; unknown code is registered (with its nested code).

        ``module`` is a hint for code whose module cannot be told from its file (pass the
        frame's ``f_globals["__name__"]`` if you have it). Subscribers are not told about code
        discovered this way (it is code that is already running), but they are told about
        functions the lookup finds on the way (generated code of a fresh import).
        """
        info = self._by_id.get(id(code))
        if info is not None and info.code is code:
            return info
        with self._lock:
            # Generated code of a recently imported module: name it after its function.
            found = self._scan_pending_namespaces(include_initializing=True)
            if self._unregistered and id(code) not in self._by_id:
                group = self._found_in.get(id(code), module)
                found += _listable(self._register_found(
                    None if group is None else (lambda m: m == group)))
            info = self._by_id.get(id(code))
            if info is None:
                if module is None:
                    module = self._module_for_file(code.co_filename)
                entries: dict[int, _Entry] = {}
                self._collect(code, module, None, entries, register_top=True)
                self._commit(entries)
                info = self._by_id[id(code)]
        self._notify(found)
        return info

    def known_ids(self) -> dict[int, FunctionInfo]:
        """``id(code) -> info`` of every registered code object: the live dict itself, for
        cores that test membership on a hot path. Read only."""
        return self._by_id

    def known_bodies(self) -> dict[int, ref[CodeType]]:
        """``id(code) -> weak reference`` of the module and class bodies whose nested code is
        registered: the live dict itself, for cores that answer a body's first run without
        calling :meth:`discover` (an entry goes when its code does). Read only."""
        return self._bodies

    def discover(self, code: CodeType, frame: FrameType | None) -> bool:
        """Register code met on its first execution (``frame`` is its running frame) and tell
        the subscribers about the functions found. Returns whether ``code`` is now known, or
        needs no registration (a module or class body: not a function); False when it cannot
        be registered now (the registry is busy in this very thread), so ask again later.
        """
        if id(code) in self._by_id:
            return True
        body = self._bodies.get(id(code))
        if body is not None and body() is code:
            return True  # a module or class body whose nested code is registered already
        lock = self._lock
        if lock._is_owned():  # type: ignore[attr-defined]  # a finaliser inside our own work
            return False
        with lock:
            new = []
            group = self._found_in.get(id(code)) if self._unregistered else None
            if group is None and frame is not None:
                group = frame.f_globals.get("__name__")  # (code nested in a function)
            if isinstance(group, str):
                if group in self._unregistered:
                    # code of a module the scan found: its whole group, named as one batch
                    new = _listable(self._register_found(lambda m: m == group))
                elif not self._scanned and group not in self._walked:
                    new = self._register_namespace(group)
            if id(code) not in self._by_id:
                new += self._discover(code, frame)
        self._notify(new)
        return True

    def functions(self, scope: Scope | None = None) -> list[FunctionInfo]:
        """Every known function, sorted by name. The first call scans the loaded modules.

        ``scope`` (a test of module names) limits what must be complete: the functions of the
        modules it takes in are all registered first, those of other modules found by a scan
        only once something needs them (they may be missing from the list). None: every one.
        """
        self.complete(scope)
        listed = self._listed
        if listed is None:
            with self._lock:
                listed = self._listed
                if listed is None:
                    listed = sorted(
                        (i for i in self._by_id.values() if i.kind not in NON_FUNCTION_KINDS),
                        key=lambda i: i.name,
                    )
                    self._listed = listed
        return list(listed)

    def registered(self) -> list[FunctionInfo]:
        """The functions registered so far, in no order, nothing scanned for more: what a
        finished trace can name (:meth:`functions` sorts every one, ~3 ms for sqlglot's
        5,000, at the end of a recording that names a fifth of them)."""
        with self._lock:
            return [i for i in self._by_id.values() if i.kind not in NON_FUNCTION_KINDS]

    def complete(self, scope: Scope | None = None) -> None:
        """Register every function of the modules ``scope`` takes in (None: all): what
        :meth:`functions` does before it lists them."""
        self._maintain(scope)

    def modules(self) -> set[str]:
        """Names of the modules that have known functions (or found, not registered yet)."""
        self._maintain(no_modules, scan=True)
        return self._modules | self._unregistered.keys()

    def has_functions(self) -> bool:
        """Whether any function exists: a registered one, or one in a loaded module's namespace
        (found without a scan: almost always), or else one a scan finds."""
        if self._modules:
            return True
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if isinstance(namespace, dict) and self._tops(
                    [v for v in list(namespace.values()) if type(v) is FunctionType]):
                return True
        return bool(self.modules())

    def __len__(self) -> int:
        return len(self.functions())

    # --- registration -------------------------------------------------------------------------
    def add_code(self, code: CodeType, module: str) -> list[FunctionInfo]:
        """Register a code object and everything nested in it, as code of ``module``.

        For code compiled by the caller before it runs (a script's module code). A module code
        object itself is not a function and is not listed. Returns the new functions and tells
        the subscribers about them. The module counts as one that may still generate functions
        (:meth:`may_generate`).
        """
        with self._lock:
            entries: dict[int, _Entry] = {}
            self._collect(code, module, None, entries, register_top=False)
            new = _listable(self._commit(entries))
            self._note_file(code.co_filename, module)
            self._added_modules.add(module)
        self._notify(new)
        return new

    def may_generate(self, module: str) -> bool:
        """Whether functions of ``module`` may appear that no scan can see yet: its code was
        registered before it runs (:meth:`add_code`), or it is being imported. Generated
        functions (dataclass methods, exec'd code) of such a module exist only once it runs."""
        return module in self._added_modules or module in self._pending_namespaces
    def prepare_module(self, name: str, code: CodeType, origin: str,
                       root: str | None = None) -> list[FunctionInfo]:
        """Register the code of module ``name``, not imported yet, compiled from the file
        ``origin`` (its loader's ``get_filename``).

        When the module is imported, the import watcher hands the loader this very code object
        instead of compiling again, as long as ``origin`` has not changed since; otherwise the
        prepared entries are forgotten and the code that runs takes their names. ``root`` names
        a package whose modules are all being prepared: a dotted name under it that was not
        prepared is known not to exist (:meth:`covers`).
        """
        with self._lock:
            if root is not None:
                self._prepared_roots.add(root)
            self._prepared[name] = (code, origin, _file_stamp(origin))
        return self.add_code(code, name)

    def _prepared_code(self, name: str, filename: Any) -> CodeType | None:
        """The prepared code of module ``name`` if it was compiled from ``filename`` as it is
        now (the import watcher's question)."""
        entry = self._prepared.get(name)
        if entry is None or filename != entry[1] or _file_stamp(entry[1]) != entry[2]:
            return None
        return entry[0]

    def prepared(self, name: str) -> bool:
        """Whether module ``name`` was prepared and has not been imported since."""
        return name in self._prepared

    def covers(self, name: str) -> bool:
        """Whether ``name`` lies in a package whose modules were all prepared."""
        return any(name == r or name.startswith(r + ".") for r in self._prepared_roots)

    def refresh(self) -> list[FunctionInfo]:
        """Rescan the loaded modules; return (and report to subscribers) what was new."""
        with self._lock:
            first = not self._scanned
            self._scan()
            new = _listable(self._register_found(None))
            self._pending_namespaces.clear()
        if not first:
            self._notify(new)
        return new

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(new_infos)`` whenever functions are discovered (imports, add_code,
        refresh). Returns the function that unsubscribes.

        The callback runs in the thread that discovered the functions; for an import that is
        before the module body runs. Subscribe first, then read :meth:`functions`: nothing is
        missed in between (at worst reported twice). Exceptions in callbacks are printed and
        otherwise ignored, so an import never fails because of one.
        """
        with self._lock:
            self._subscribers = (*self._subscribers, callback)
            _activate(self)
        done = False

        def unsubscribe() -> None:
            nonlocal done
            with self._lock:
                if done:
                    return
                done = True
                subs = list(self._subscribers)
                subs.remove(callback)
                self._subscribers = tuple(subs)
                if not subs:
                    _deactivate(self)

        return unsubscribe

    # --- internals ----------------------------------------------------------------------------
    def _discover(self, code: CodeType, frame: FrameType | None) -> list[FunctionInfo]:
        """Register running code (see :meth:`discover`); returns the new listable functions.
        Caller holds the lock."""
        kind = code_kind(code)
        g = frame.f_globals if frame is not None else {}
        here = g.get("__name__")
        entries: dict[int, _Entry] = {}
        if not _is_synthetic(code.co_filename):
            # A module body or function from a file: its module is its namespace's (a module
            # loaded by another import hook, exec_module, zipimport, a frozen module).
            module = here if isinstance(here, str) and here else \
                self._module_for_file(code.co_filename)
            self._collect(code, module, None, entries, register_top=False)
            if kind in NON_FUNCTION_KINDS:
                self._note_file(code.co_filename, module)
            return _listable(self._commit(entries))
        site = self._sites.pop(id(code), None)
        site_module = site[1] if site is not None and site[0]() is code else None
        qualname = module = None
        owner = _owner(code, frame) if kind not in NON_FUNCTION_KINDS else None
        if owner is not None:
            module, qualname = _method_name(owner[0], owner[1])
        if module is None:
            module = here if isinstance(here, str) and here else None
        if module is None and kind == "module" and frame is not None and frame.f_back is not None:
            caller = frame.f_back.f_globals.get("__name__")  # the exec/eval that made it
            module = caller if isinstance(caller, str) and caller else None
        if module is None:
            module = site_module or code.co_filename
        # Code nested in generated code is named when it runs (its qualname may be rewritten
        # by then, as dataclasses and namedtuple do); if it will run in a namespace without a
        # name (the same globals as this code's), remember where it was made meanwhile.
        if not (isinstance(here, str) and here):
            for const in code.co_consts:
                if type(const) is CodeType and id(const) not in self._by_id:
                    self._remember_site(const, module)
        if kind in NON_FUNCTION_KINDS:
            return []  # an exec'd body or class body: runs once, not listed, not kept
        self._order += 1
        key = id(code)
        entries[key] = (code, module, qualname or code.co_qualname, kind, self._order, key)
        return _listable(self._commit(entries))

    def _register_namespace(self, name: str) -> list[FunctionInfo]:
        """Register what loaded module ``name``'s namespace holds (as :meth:`_on_module_loaded`
        does after an import), once: discover()'s group for code of a module loaded before
        anyone scanned. Returns the new listable functions. Caller holds the lock."""
        self._walked.add(name)
        mod = sys.modules.get(name)
        if not isinstance(mod, ModuleType) or is_own_module(name):
            return []
        return self._register_module(mod)

    def _register_module(self, mod: ModuleType) -> list[FunctionInfo]:
        """Register the functions a module's namespace holds that are still unknown; returns
        the new listable ones. Caller holds the lock."""
        owners: dict[int, tuple[type, object]] = {}
        return _listable(self._register_functions(
            _namespace_functions(mod, self._by_id, owners), owners))

    def _remember_site(self, code: CodeType, module: str) -> None:
        key = id(code)
        sites = self._sites
        sites[key] = (ref(code, lambda _r, key=key: sites.pop(key, None)), module)

    def _remember_body(self, code: CodeType, key: int) -> None:
        """Note a module or class body whose nested code is registered (``key``: its id)."""
        if key in self._bodies:
            return
        self._bodies[key] = ref(code, partial(self._drop_body, key))

    def _notify(self, new: list[FunctionInfo]) -> None:
        if not new:
            return
        for callback in self._subscribers:
            try:
                callback(list(new))
            except Exception:
                import traceback  # (not at start-up: ~2 ms)

                print("rethook: registry subscriber failed:", file=sys.stderr)
                traceback.print_exc()

    def _maintain(self, scope: Scope | None = None, scan: bool = False) -> None:
        """Bring the registry up to date before a listing: the modules ``scope`` takes in
        (None: all) complete. A listing of what is registered (:func:`no_modules`) needs no
        scan, unless ``scan``."""
        with self._lock:
            if scope is no_modules and not scan:
                pass  # what is registered is all that is asked for
            elif not self._scanned:
                if scan or not self._known_whole(scope):
                    self._scan()
            elif not self._subscribers and _modules_signature() != self._modules_at_scan:
                # No import hook is active: catch up on modules loaded since the last scan.
                self._scan()
            found = self._register_found(scope)
            found += self._scan_pending_namespaces(include_initializing=False)
        self._notify(_listable(found))  # (the engine hooks what its users' filters match)

    def _known_whole(self, scope: Scope | None) -> bool:
        """Whether a scan could find nothing more of the modules ``scope`` takes in: none of
        them is loaded, but as code :meth:`add_code` registered whole (a script's
        ``__main__``, the prepared modules of a ``-m`` package). The default filter's scope,
        at start-up. Caller holds the lock."""
        if not isinstance(scope, Within) or self._pending_namespaces:
            return False
        added = self._added_modules
        return all(m in added for m in list(sys.modules) if scope(m))

    def _scan(self) -> None:
        """Find every live function (and its nested code) not known yet, grouped by module in
        ``_unregistered``, for :meth:`_register_found`.

        Live generators and coroutines count too: a module-level generator expression's code is
        reachable from nothing else once the module body has finished. Only code objects and
        names are kept, never a function or a frame (the program's data).
        """
        funcs: list[FunctionType] = []
        gens: list[tuple[CodeType, FrameType | None]] = []
        for o in gc.get_objects():
            t = type(o)
            if t is FunctionType:
                funcs.append(o)
            elif t is GeneratorType:
                gens.append((o.gi_code, o.gi_frame))
            elif t is CoroutineType:
                gens.append((o.cr_code, o.cr_frame))
            elif t is AsyncGeneratorType:
                gens.append((o.ag_code, o.ag_frame))
        self._scanned = True
        self._modules_at_scan = _modules_signature()
        groups, where = self._unregistered, self._found_in
        for top in self._tops(funcs):
            if id(top[0]) not in where:
                where[id(top[0])] = top[1]
                groups.setdefault(top[1], _Found()).tops.append(top)
        for code, frame in gens:
            if id(code) in self._by_id or id(code) in where:
                continue
            module = frame.f_globals.get("__name__") if frame is not None else None
            if not isinstance(module, str):
                module = self._module_for_file(code.co_filename)
            where[id(code)] = module
            groups.setdefault(module, _Found()).gens.append(code)

    def _register_found(self, scope: Scope | None) -> list[FunctionInfo]:
        """Register what the scan found of the modules ``scope`` takes in (None: all), a
        module at a time, as one batch each; returns the new code's infos. Caller holds the
        lock."""
        groups = self._unregistered
        if not groups:
            return []
        new: list[FunctionInfo] = []
        by_id, where = self._by_id, self._found_in
        for module in [m for m in groups if scope is None or scope(m)]:
            found = groups.pop(module)
            for code in found.codes():
                where.pop(id(code), None)
            new += self._register_tops([t for t in found.tops if id(t[0]) not in by_id])
            entries: dict[int, _Entry] = {}
            for code in found.gens:
                if id(code) not in by_id and id(code) not in entries:
                    self._collect(code, module, None, entries, register_top=False)
            new += self._commit(entries)
        return new

    def _register_functions(self, funcs: Iterable[FunctionType],
                            owners: dict[int, tuple[type, object]] | None = None
                            ) -> list[FunctionInfo]:
        """Register functions (and their nested code); ``owners``: ``id(function) -> (class,
        value)`` for those found in a class (see _namespace_functions), which names generated
        ones."""
        return self._register_tops(self._tops(funcs, owners))

    def _tops(self, funcs: Iterable[FunctionType],
              owners: dict[int, tuple[type, object]] | None = None
              ) -> list[tuple[CodeType, str, str]]:
        """``(code, module, qualname)`` of the functions not known yet, not rethook's own
        (in gc's order: :meth:`_register_tops` sorts them)."""
        if _c is not None:  # (the common case in C: the rest as below, function by function)
            tops, rest = _c.tops(funcs if type(funcs) is list else list(funcs), self._by_id,
                                 OWN_PACKAGE)
            for f in rest:
                top = self._top_of(f, f.__code__, owners)
                if top is not None:
                    tops.append(top)
            return tops
        fresh: list[tuple[FunctionType, CodeType]] = []
        seen: set[int] = set()
        by_id = self._by_id
        for f in funcs:
            code = f.__code__
            if not code.co_flags & _CO_NEWLOCALS:
                # A module or class body running now, in the function CPython makes to run it
                # (PyEval_EvalCode, __build_class__): a scan at set-up finds the launcher's,
                # ``python -m rethook``'s or the console script's ``__main__.<module>``, which
                # would take the program's name. Bodies are named where they are loaded (the
                # import hook, the program's add_code) or by discovery.
                continue
            key = id(code)
            if key not in by_id and key not in seen:
                seen.add(key)
                fresh.append((f, code))
        tops: list[tuple[CodeType, str, str]] = []
        for f, code in fresh:
            top = self._top_of(f, code, owners)
            if top is not None:
                tops.append(top)
        return tops

    def _top_of(self, f: FunctionType, code: CodeType,
                owners: dict[int, tuple[type, object]] | None) -> tuple[CodeType, str, str] | None:
        """``(code, module, qualname)`` of a function whose code is new, or None for rethook's
        own (one step of :meth:`_tops`)."""
        module = self._function_module(f)
        if is_own_module(module):
            return None
        qualname = code.co_qualname
        if _is_synthetic(code.co_filename):
            # Generated code (dataclasses, namedtuple, attrs) compiles every method as
            # "__create_fn__.<locals>.__init__" or similar; its class, or else the
            # function, knows better (see "Generated code").
            owner = owners.get(id(f)) if owners else None
            attr = _attribute_of(*owner) if owner is not None else None
            if owner is not None and attr is not None:
                owner_module, qualname = _method_name(owner[0], attr)
                module = owner_module or module
            else:
                fq = getattr(f, "__qualname__", None)
                if isinstance(fq, str) and fq:
                    qualname = fq
        return code, module, qualname

    def _register_tops(self, tops: list[tuple[CodeType, str, str]]) -> list[FunctionInfo]:
        """Register functions' code as ``(code, module, qualname)`` and their nested code."""
        # A stable order keeps names deterministic (gc order is not).
        tops = sorted(tops, key=lambda t: (t[0].co_filename, t[0].co_firstlineno,
                                           t[0].co_qualname))
        entries: dict[int, _Entry] = {}
        if _c is not None:  # (the two loops below, in C)
            self._order = _c.collect_tops(tops, entries, self._by_id, self._order,
                                          self._bodies, self._drop_body)
            return self._commit(entries)
        # Every function's own code first, so that code found both as a function and nested in
        # another takes its own function's qualname; then what is nested in them.
        for code, module, qualname in tops:
            self._order += 1
            key = id(code)
            entries[key] = (code, module, qualname, code_kind(code), self._order, key)
        for code, module, qualname in tops:
            self._collect(code, module, qualname, entries, register_top=False)
        return self._commit(entries)

    def _function_module(self, f: FunctionType) -> str:
        # The defining module's globals, not __module__: some libraries rewrite __module__ to a
        # public name, and the import hook only ever sees the globals' name.
        name = f.__globals__.get("__name__")
        if isinstance(name, str) and name:
            return name
        name = getattr(f, "__module__", None)
        if isinstance(name, str) and name:
            return name
        return self._module_for_file(f.__code__.co_filename)

    def _collect(self, code: CodeType, module: str, qualname: str | None,
                 entries: dict[int, _Entry], register_top: bool) -> None:
        """Add ``code`` and its unknown nested code to a batch.

        Module and class bodies are walked through but not added, except ``code`` itself when
        ``register_top`` (info() names whatever it is asked about). ``qualname`` overrides
        ``co_qualname`` for ``code``; nested code gets the same prefix rewritten.
        """
        if _c is not None:
            self._order = _c.collect(code, module, qualname, entries, self._by_id,
                                     register_top, self._order, self._bodies, self._drop_body)
            return
        by_id = self._by_id
        order = self._order
        # (id(code) (id() is not free: it raises an audit event and makes an int), code, its
        # qualname if given, the (old, new) qualname prefixes of its parent's renaming, dot
        # included, if any)
        stack: list[tuple[int, CodeType, str | None, tuple[str, str] | None]] = [
            (id(code), code, qualname, None)]
        pop, push = stack.pop, stack.append
        while stack:
            key, c, q, rename = pop()
            cq = c.co_qualname
            if q is None:
                q = cq
                if rename is not None and cq.startswith(rename[0]):
                    q = rename[1] + cq[len(rename[0]):]
            kind = code_kind(c)
            if c is code and key in entries:
                pass  # already in the batch as a function of its own
            elif kind not in NON_FUNCTION_KINDS or (register_top and c is code):
                order += 1
                entries[key] = (c, module, q, kind, order, key)
            else:
                self._remember_body(c, key)
            child_rename = (cq + ".", q + ".") if q != cq else rename
            # Pushed in reverse so that nested code is numbered in source order.
            for const in reversed(c.co_consts):
                if type(const) is CodeType:
                    k = id(const)
                    if k not in by_id and k not in entries:
                        push((k, const, None, child_rename))
        self._order = order

    def _commit(self, entries: dict[int, _Entry]) -> list[FunctionInfo]:
        """Name a batch of new code objects and publish them. Caller holds the lock."""
        if _c is not None:
            new = _c.commit(entries, self._by_id, self._taken, _column)
        else:
            new = self._name_batch(entries)
        if not new:
            return []
        self._modules.update({info.module for info in new if info.kind not in NON_FUNCTION_KINDS})
        self._listed = None
        self._generation += 1
        return new

    def _name_batch(self, entries: dict[int, _Entry]) -> list[FunctionInfo]:
        """Name a batch's code objects not known yet and publish each (_commit's loop)."""
        by_id = self._by_id
        # Grouped by name without suffix, in the batch's order. Re-check each: a finalizer
        # run by the garbage collector in the middle of a scan may have imported something,
        # registering code of this batch through the (reentrant) lock.
        groups: dict[str, list[_Entry]] = {}
        for key, e in entries.items():
            if key not in by_id:
                groups.setdefault(f"{e[1]}.{e[2]}", []).append(e)
        if not groups:
            return []
        taken = self._taken
        new: list[FunctionInfo] = []
        # Each info is published as soon as it is named: readers use dict.get without the
        # lock, so one insertion per code suffices.
        for base, members in groups.items():
            if len(members) == 1 and base not in taken:
                code, module, qualname, kind, _, key = members[0]
                # (every anonymous leaf ends with ">": most names need no split)
                if not (qualname.endswith(">") and qualname.rpartition(".")[2] in _ANONYMOUS):
                    # The common case: a name of its own, no suffix.
                    taken.add(base)
                    info = by_id[key] = _new_info(code, base, module, qualname, kind, "")
                    new.append(info)
                    continue
            self._name_apart(base, members, new)
        return new

    def _name_apart(self, base: str, members: list[_Entry], new: list[FunctionInfo]) -> None:
        """Name the entries that share the name ``base`` (or take one already taken, or are
        anonymous) with suffixes: ``@LINE``, and ``#N`` for several on one line, in source
        order. Appends their infos to ``new``. Caller holds the lock (see _commit)."""
        taken, by_id = self._taken, self._by_id

        def publish(e: _Entry, suffix: str) -> None:
            name = base + suffix
            taken.add(name)
            code, module, qualname, kind, _, key = e
            info = by_id[key] = _new_info(code, name, module, qualname + suffix, kind, suffix)
            new.append(info)

        by_line: dict[int, list[_Entry]] = {}
        for e in members:
            by_line.setdefault(e[0].co_firstlineno, []).append(e)
        for line, same in sorted(by_line.items()):
            at = f"@{line}"
            if len(same) == 1 and base + at not in taken:
                publish(same[0], at)
                continue
            # Several on one line (or the line's name is taken): number them in source order.
            if len(same) > 1:
                same.sort(key=lambda e: (_column(e[0]), e[4]))
            n = 1
            for e in same:
                while f"{base}{at}#{n}" in taken:
                    n += 1
                publish(e, f"{at}#{n}")
                n += 1

    def _forget(self, code: CodeType) -> None:
        """Drop a code tree's entries and free their names (prepared code that never ran).
        The code objects stay alive: users key their tables by ``id(code)``, which must not
        be reused by new code while they may hold it. Caller holds the lock."""
        self._retired.append(code)
        stack = [code]
        while stack:
            c = stack.pop()
            info = self._by_id.get(id(c))
            if info is not None and info.code is c:
                del self._by_id[id(c)]
                self._taken.discard(info.name)
            stack += [k for k in c.co_consts if type(k) is CodeType]
        self._listed = None
        self._generation += 1

    def _note_file(self, filename: str, module: str) -> None:
        if not _is_synthetic(filename):
            self._file_map.setdefault(filename, module)

    def _module_for_file(self, filename: str) -> str:
        if filename.startswith("<frozen ") and filename.endswith(">"):
            return filename[8:-1]
        module = self._file_map.get(filename)
        if module is None and len(sys.modules) != self._file_map_len:
            self._rebuild_file_map()
            module = self._file_map.get(filename)
        if module is not None:
            return module
        if filename.startswith("<") and filename.endswith(">"):
            return filename
        return UNKNOWN_MODULE

    def _rebuild_file_map(self) -> None:
        mods = list(sys.modules.items())
        self._file_map_len = len(mods)
        fmap = self._file_map
        for name, mod in mods:
            if not isinstance(mod, ModuleType):
                continue
            d = getattr(mod, "__dict__", None) or {}
            f = d.get("__file__")
            if isinstance(f, str):
                fmap.setdefault(f, name)
            spec = d.get("__spec__")
            origin = getattr(spec, "origin", None) if spec is not None else None
            if isinstance(origin, str) and origin not in ("frozen", "built-in"):
                fmap.setdefault(origin, name)

    # --- import hook side ---------------------------------------------------------------------
    def _on_module_exec(self, code: CodeType, module: str) -> None:
        """A module body is about to run: register its code tree, tell the subscribers."""
        with self._lock:
            found = self._scan_pending_namespaces(include_initializing=False)
            prepared = self._prepared.pop(module, None)
            if prepared is not None and prepared[0] is not code:
                self._forget(prepared[0])  # the file changed: the code that runs takes the names
            new: list[FunctionInfo] = []
            if not is_own_module(module):  # rethook importing more of itself as it runs
                entries: dict[int, _Entry] = {}
                self._collect(code, module, None, entries, register_top=False)
                new = _listable(self._commit(entries))
                self._note_file(code.co_filename, module)
                if module not in self._pending_namespaces:
                    self._pending_namespaces.append(module)
        self._notify(found + new)

    def _on_module_loaded(self, module: ModuleType) -> None:
        """A module body has run: register what its namespace holds that is still unknown."""
        name = getattr(module, "__name__", None)
        if not isinstance(name, str):
            return
        with self._lock:
            found = self._register_module(module)
            self._walked.add(name)  # (discover() need not walk it again)
            if name in self._pending_namespaces:
                self._pending_namespaces.remove(name)
        self._notify(found)

    def _scan_pending_namespaces(self, include_initializing: bool) -> list[FunctionInfo]:
        """Register functions generated while recently imported modules ran their bodies.

        Caller holds the lock, and reports what this returns after releasing it.
        """
        if not self._pending_namespaces:
            return []
        found: list[FunctionType] = []
        owners: dict[int, tuple[type, object]] = {}
        keep: list[str] = []
        for name in self._pending_namespaces:
            mod = sys.modules.get(name)
            if not isinstance(mod, ModuleType):
                continue  # import failed (or the module removed itself)
            spec = mod.__dict__.get("__spec__")
            initializing = bool(getattr(spec, "_initializing", False))
            if initializing:
                keep.append(name)
                if not include_initializing:
                    continue
            found.extend(_namespace_functions(mod, self._by_id, owners))
        self._pending_namespaces = keep
        return _listable(self._register_functions(found, owners)) if found else []


def _file_stamp(path: str) -> tuple[int, int] | None:
    """What says a file is unchanged: its modification time and size."""
    try:
        st = os.stat(path)
    except (OSError, ValueError, TypeError):
        return None
    return st.st_mtime_ns, st.st_size


def _modules_signature() -> frozenset[tuple[str, int]]:
    """Which modules are loaded (names and objects: a module imported again counts as new)."""
    items = list(sys.modules.items())  # one atomic copy; other threads may be importing
    return frozenset((name, id(mod)) for name, mod in items)


def _listable(infos: list[FunctionInfo]) -> list[FunctionInfo]:
    return [i for i in infos if i.kind not in NON_FUNCTION_KINDS]


def _functions_of(value: object, depth: int = 0) -> Iterator[FunctionType]:
    """The functions a namespace value is or wraps: static and class methods, property
    accessors, and what ``functools.wraps`` hides (dataclass's ``__repr__`` is wrapped like
    that). Reads only builtin types' fields, so no user code runs."""
    t = type(value)
    if t is FunctionType:
        yield value  # type: ignore[misc]
        # (the attribute, not __dict__: reading that would give the function a dict)
        wrapped = getattr(value, "__wrapped__", None)
        if wrapped is not None and depth < 6:
            yield from _functions_of(wrapped, depth + 1)
    elif t is staticmethod or t is classmethod:
        yield from _functions_of(value.__func__, depth)  # type: ignore[attr-defined]
    elif t is property:
        for acc in (value.fget, value.fset, value.fdel):  # type: ignore[attr-defined]
            yield from _functions_of(acc, depth)


_class_dict = type.__dict__["__dict__"].__get__  # a class's own mappingproxy, no descriptors run
_class_mro = type.__dict__["__mro__"].__get__
_class_qualname = type.__dict__["__qualname__"].__get__
_class_flags = type.__dict__["__flags__"].__get__
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement or type()


def _method_name(klass: type, attr: str) -> tuple[str | None, str]:
    """(module, qualname) of generated code serving as ``klass.attr``: the class's module (None
    if it has none) and ``ClassQualname.attr``."""
    module = _class_dict(klass).get("__module__")
    return (module if isinstance(module, str) and module else None,
            f"{_class_qualname(klass)}.{attr}")


def _owner(code: CodeType, frame: FrameType | None) -> tuple[type, str] | None:
    """The method whose code is running in ``frame``, found from the call's first argument:
    ``(class, attribute)`` for the first class in the MRO of the argument (if it
    is a class: ``cls``, ``__new__``) or of its type (``self``) whose own dict holds a
    function with this very code; None if there is none."""
    if frame is None or not code.co_argcount:
        return None
    try:
        first = frame.f_locals[code.co_varnames[0]]
    except Exception:  # noqa: BLE001 - an odd frame: no owner
        return None
    # (issubclass of the real type: isinstance would read a proxy's __class__)
    classes = list(_class_mro(first)) if issubclass(type(first), type) else []
    classes += _class_mro(type(first))
    # builtin (static) types hold no Python functions: int, str, object...
    classes = [k for k in classes if _class_flags(k) & _HEAPTYPE]
    name = code.co_name
    for klass in classes:  # cheap first: the attribute named like the code
        for f in _functions_of(_class_dict(klass).get(name)):
            if f.__code__ is code:
                return klass, name
    for klass in classes:  # then every attribute (namedtuple's __new__ is a "<lambda>")
        for attr, value in list(_class_dict(klass).items()):
            for f in _functions_of(value):
                if f.__code__ is code:
                    return klass, attr
    return None


def _namespace_functions(mod: ModuleType, known: dict[int, FunctionInfo],
                         owners: dict[int, tuple[type, object]]) -> list[FunctionType]:
    """Functions reachable from a module's namespace (and its classes) with unknown code;
    ``owners`` gets ``id(function) -> (class, value)`` for those found in a class, the value
    being what the class's own dict holds (the function or its wrapper: see _attribute_of).

    Only looks at plain dicts and known wrapper types, so no user code (descriptors,
    ``__getattr__``) runs.
    """
    if _c is not None and isinstance(mod, ModuleType):
        return _c.namespace_functions(mod, known, owners)
    out: list[FunctionType] = []
    seen: set[int] = set()
    modname = mod.__dict__.get("__name__")
    # Depth first, a class's namespace where the class is met: (its values, depth, class).
    # Values, not items: the attribute's name is needed only to name generated code found in
    # a class (_attribute_of, later), and most items are neither (a fifth of the walk's cost).
    stack: list[tuple[Iterator[object], int, type | None]] = [
        (iter(list(mod.__dict__.values())), 0, None)]
    while stack:
        values, depth, klass = stack[-1]
        for value in values:
            t = type(value)  # (compared by identity: a metaclass's __eq__ is user code)
            if t is FunctionType:
                # A function that wraps nothing (the attribute, not __dict__, as in
                # _functions_of), as most do, is all _functions_of would yield; and most were
                # named from the module's code before its body ran.
                if getattr(value, "__wrapped__", None) is None:
                    if id(value.__code__) not in known:
                        out.append(value)
                        if klass is not None:
                            owners[id(value)] = (klass, value)
                    continue
            elif not (t is staticmethod or t is classmethod or t is property):
                # (issubclass of the type: isinstance would read a proxy's __class__)
                if issubclass(t, type) and depth < 6:
                    # The module's own classes, each once (most classes in a namespace are
                    # imported: told apart first)
                    ns = _class_dict(value)
                    m = ns.get("__module__")  # (str only: another type's == is user code)
                    if type(m) is str and type(modname) is str and m == modname and \
                            id(value) not in seen:
                        seen.add(id(value))
                        stack.append((iter(list(ns.values())), depth + 1, value))  # type: ignore[arg-type]
                        break
                continue
            for f in _functions_of(value):
                if id(f.__code__) not in known:
                    out.append(f)
                    if klass is not None:
                        owners[id(f)] = (klass, value)
        else:
            stack.pop()
    return out


def _attribute_of(klass: type, value: object) -> str | None:
    """The name under which ``klass``'s own dict holds ``value``: the last, as a walk of its
    items leaves it (None if it holds it no more)."""
    name = None
    for attr, held in list(_class_dict(klass).items()):
        if held is value:
            name = attr
    return name


# --- the process-wide import watcher ------------------------------------------------------------
_active: tuple[Registry, ...] = ()
_hook_lock = threading.Lock()
_finding = threading.local()  # re-entrancy guard: finders may import while finding
_WATCHED = "_rethook_watched"


class _ImportWatcher:
    """A meta-path finder that asks the finders after it and watches the loader they return."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not _active or getattr(_finding, "on", False):
            return None
        _finding.on = True
        try:
            spec = find_spec_after(self, fullname, path, target)
            if spec is not None:
                _watch_loader(spec.loader)
            return spec
        finally:
            _finding.on = False

    def invalidate_caches(self) -> None:
        pass


def find_spec_after(finder: object, fullname: str, path: Any = None, target: Any = None) -> Any:
    """The spec the finders after ``finder`` on ``sys.meta_path`` give for ``fullname`` (the
    first that gives one), or None: what the import would get without ``finder``, for a
    finder that only watches imports (this module's, runner/follow.py's)."""
    meta = sys.meta_path
    try:
        later = meta[meta.index(finder) + 1:]
    except ValueError:
        return None
    for later_finder in later:
        find = getattr(later_finder, "find_spec", None)
        if find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _watch_loader(loader: Any) -> None:
    """Wrap one loader instance's ``get_code`` and ``exec_module`` (classes are left alone)."""
    if loader is None or isinstance(loader, type) or getattr(loader, _WATCHED, False):
        return
    get_code = getattr(loader, "get_code", None)
    exec_module = getattr(loader, "exec_module", None)
    if exec_module is None:
        return

    def watched_get_code(fullname: str) -> Any:
        code = None
        if _active:  # a module prepared ahead (Registry.prepare_module) runs the code named
            get_filename = getattr(loader, "get_filename", None)
            try:
                filename = get_filename(fullname) if get_filename is not None else None
            except ImportError:
                filename = None
            for reg in _active:
                code = reg._prepared_code(fullname, filename)
                if code is not None:
                    break
        if code is None:
            code = get_code(fullname)
        if type(code) is CodeType:
            with notrace():  # rethook's own work: a fatal signal's finish waits for its end
                for reg in _active:
                    reg._on_module_exec(code, fullname)
        return code

    def watched_exec_module(module: ModuleType) -> None:
        try:
            exec_module(module)
        finally:
            with notrace():  # as above: the registry's lock is held in here
                for reg in _active:
                    reg._on_module_loaded(module)

    try:
        if get_code is not None:
            loader.get_code = watched_get_code
        loader.exec_module = watched_exec_module
        setattr(loader, _WATCHED, True)
    except (AttributeError, TypeError):  # a loader with __slots__: the refresh() net remains
        pass


_watcher = _ImportWatcher()


def _activate(reg: Registry) -> None:
    global _active
    with _hook_lock:
        if reg not in _active:
            _active = (*_active, reg)
        if _watcher not in sys.meta_path:
            sys.meta_path.insert(0, _watcher)


def _deactivate(reg: Registry) -> None:
    global _active
    with _hook_lock:
        _active = tuple(r for r in _active if r is not reg)
        if not _active and _watcher in sys.meta_path:
            sys.meta_path.remove(_watcher)


_default: Registry | None = None
_default_lock = threading.Lock()



_c = _load_c()


def codes_by_id(infos: Iterable[FunctionInfo], into: tuple[dict[int, CodeType], ...]) -> None:
    """Add ``id(info.code): info.code`` of each of ``infos`` to each dict of ``into``: how the
    engine selects a module's worth of new functions (in C where built, in one pass)."""
    if _c is not None:
        _c.codes_by_id(infos, into)
        return
    chosen = {id(info.code): info.code for info in infos}
    for d in into:
        d.update(chosen)


def default_registry() -> Registry:
    """The process-wide registry."""
    global _default
    reg = _default
    if reg is None:
        with _default_lock:
            if _default is None:
                _default = Registry()
            reg = _default
    return reg
