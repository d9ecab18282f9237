"""Tests for the function registry: discovery, canonical names, the import hook, add_code."""

from __future__ import annotations

import gc
import importlib
import io
import re
import sys
import threading
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import CodeType

import pytest

from forking import fork_while_held
from rethook.engine.registry import FunctionInfo, Registry, code_kind, default_registry

FIXTURES = Path(__file__).parent / "fixtures"
SUFFIX = re.compile(r"@\d+(#\d+)?")


@pytest.fixture(autouse=True)
def fixtures_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def fresh_import(name: str):
    """Import ``name`` for real, dropping an earlier import so the module body runs again."""
    sys.modules.pop(name, None)
    gc.collect()  # let an earlier copy's functions die, so they do not claim the names first
    return importlib.import_module(name)


def by_name(infos: list[FunctionInfo]) -> dict[str, FunctionInfo]:
    return {i.name: i for i in infos}


def names_of(reg: Registry, module: str) -> dict[str, FunctionInfo]:
    return {i.name: i for i in reg.functions() if i.module == module}


# --- every kind of code object --------------------------------------------------------------
def test_import_hook_finds_every_kind() -> None:
    reg = Registry()
    reported: list[FunctionInfo] = []
    unsubscribe = reg.subscribe(reported.extend)
    try:
        mod = fresh_import("rh_kinds")
    finally:
        unsubscribe()
    got = by_name(reported)
    listed = names_of(reg, "rh_kinds")
    assert got.keys() == listed.keys()

    def name(code: CodeType) -> str:
        info = reg.lookup(code)
        assert info is not None, code
        return info.name

    line = lambda obj: obj.__code__.co_firstlineno  # noqa: E731
    size = mod.Shape.__dict__["size"]
    expected = {
        "rh_kinds.plain": "function",
        "rh_kinds.outer": "function",
        "rh_kinds.outer.<locals>.inner": "function",
        f"rh_kinds.outer.<locals>.<genexpr>@{line(mod.outer) + 4}": "genexpr",
        "rh_kinds.Shape.area": "function",
        "rh_kinds.Shape.make": "function",
        "rh_kinds.Shape.unit": "function",
        f"rh_kinds.Shape.size@{size.fget.__code__.co_firstlineno}": "function",
        f"rh_kinds.Shape.size@{size.fset.__code__.co_firstlineno}": "function",
        "rh_kinds.Shape.Inner.deep": "function",
        "rh_kinds.counter": "generator",
        "rh_kinds.fetch": "coroutine",
        "rh_kinds.stream": "async_generator",
        "rh_kinds.logged": "function",
        "rh_kinds.logged.<locals>.wrapper": "function",
        "rh_kinds.decorated": "function",
        f"rh_kinds.<lambda>@{line(mod.double)}": "lambda",
        f"rh_kinds.<lambda>@{line(mod.left)}#1": "lambda",
        f"rh_kinds.<lambda>@{line(mod.left)}#2": "lambda",
        f"rh_kinds.<genexpr>@{mod.gen_a.gi_code.co_firstlineno}#1": "genexpr",
        f"rh_kinds.<genexpr>@{mod.gen_a.gi_code.co_firstlineno}#2": "genexpr",
        "rh_kinds.<generic parameters of generic>": "type_params",
        "rh_kinds.generic": "function",
    }
    for n, kind in expected.items():
        assert n in listed, n
        assert listed[n].kind == kind, n
    # The two conditional definitions of picked() are both known, each with its line.
    picked = sorted(n for n in listed if n.startswith("rh_kinds.picked"))
    assert len(picked) == 2 and all(SUFFIX.search(n) for n in picked)
    assert name(mod.picked.__code__) in picked
    # Live objects map to the names above.
    assert name(mod.Shape.make.__func__.__code__) == "rh_kinds.Shape.make"
    assert name(mod.Shape.__dict__["unit"].__func__.__code__) == "rh_kinds.Shape.unit"
    assert name(mod.decorated.__code__) == "rh_kinds.logged.<locals>.wrapper"
    assert name(mod.decorated.__wrapped__.__code__) == "rh_kinds.decorated"
    # Two lambdas (and two genexprs) on one line are numbered in source order.
    assert name(mod.left.__code__).endswith("#1")
    assert name(mod.right.__code__).endswith("#2")
    assert name(mod.gen_a.gi_code).endswith("#1")
    assert name(mod.gen_b.gi_code).endswith("#2")
    # Module and class bodies are not functions.
    assert not any(i.kind in ("module", "class") for i in reg.functions())
    assert "rh_kinds.Shape" not in listed and "rh_kinds.<module>" not in listed


def test_scan_finds_already_loaded_module() -> None:
    mod = importlib.import_module("rh_kinds")
    reg = Registry()  # scans lazily: the module is already there
    listed = names_of(reg, "rh_kinds")
    for n in ("rh_kinds.plain", "rh_kinds.outer.<locals>.inner", "rh_kinds.Shape.Inner.deep",
              "rh_kinds.counter", "rh_kinds.fetch", "rh_kinds.stream", "rh_kinds.generic"):
        assert n in listed
    assert any(n.startswith("rh_kinds.outer.<locals>.<genexpr>@") for n in listed)
    # Module-level generator expressions are found through their live generators.
    assert reg.lookup(mod.gen_a.gi_code) is not None
    assert reg.name(mod.left.__code__).endswith("#1")
    # Only the definition of picked() that was taken still exists: no suffix needed.
    assert reg.name(mod.picked.__code__) == "rh_kinds.picked"


def test_a_scoped_listing_registers_only_the_modules_it_needs() -> None:
    """A listing that needs some modules complete (a ``*:mod:M`` filter) registers their
    functions, not every loaded module's: the scan's other finds wait, and are registered a
    module at a time, with the names a full listing gives, when one of their functions first
    runs (discover) or a listing needs them."""
    import json

    mod = importlib.import_module("rh_kinds")
    everything = Registry()
    full = names_of(everything, "rh_kinds")
    reg = Registry()
    listed = reg.functions(lambda m: m == "json" or m.startswith("json."))
    assert reg.lookup(json.dumps.__code__) is not None
    assert not any(i.module == "rh_kinds" for i in listed)
    assert reg.lookup(mod.plain.__code__) is None
    assert "rh_kinds" in reg.modules()  # found, not registered yet
    # the property's setter runs first: its module is registered as one batch, so the getter
    # and setter (one co_qualname) get the suffixes a full listing gives them
    setter = mod.Shape.size.fset.__code__
    assert reg.discover(setter, None)
    assert reg.lookup(mod.plain.__code__) is not None
    assert names_of(reg, "rh_kinds").keys() == full.keys()
    assert reg.name(setter) == everything.name(setter) == "rh_kinds.Shape.size@34"


def test_code_nested_in_a_found_function_registers_its_module() -> None:
    """Code nested in a function the scan found (not itself a function yet) is found by
    the running frame's module when it first runs."""
    mod = importlib.import_module("rh_kinds")
    full = names_of(Registry(), "rh_kinds")
    reg = Registry()
    reg.functions(lambda m: False)  # scanned, nothing registered
    inner = next(c for c in mod.outer.__code__.co_consts if isinstance(c, CodeType))

    class Frame:  # what discover reads of the running frame here
        f_globals = {"__name__": "rh_kinds"}

    assert reg.lookup(inner) is None
    assert reg.discover(inner, Frame())  # type: ignore[arg-type]
    assert names_of(reg, "rh_kinds").keys() == full.keys()


def test_a_body_whose_code_is_registered_is_answered_at_once(tmp_path: Path) -> None:
    """The module and class bodies of code registered as a tree (an import, add_code) run
    once each under discovery: discover() answers them without walking them again, and
    a body it has not seen is still walked."""
    source = "class A:\n    def f(self):\n        return 1\n\nclass B(A):\n    pass\n"
    path = tmp_path / "bodies.py"
    path.write_text(source)
    code = compile(source, str(path), "exec")
    reg = Registry()
    reg.add_code(code, "bodies")
    class_a = next(c for c in code.co_consts if isinstance(c, CodeType) and c.co_name == "A")
    method = next(c for c in class_a.co_consts if isinstance(c, CodeType))
    walked: list[CodeType] = []
    reg._discover = lambda c, f: walked.append(c) or []  # type: ignore[method-assign]

    class Frame:
        f_globals = {"__name__": "bodies"}

    assert reg.discover(code, Frame())  # type: ignore[arg-type]
    assert reg.discover(class_a, Frame())  # type: ignore[arg-type]
    assert walked == []
    assert reg.name(method) == "bodies.A.f"
    other = compile("class C:\n    pass\n", str(path), "exec")
    assert reg.discover(other, Frame())  # type: ignore[arg-type]
    assert walked == [other]


def test_stdlib_names() -> None:
    import json
    import json.decoder

    reg = Registry()
    listed = by_name(reg.functions())
    assert "json.decoder.JSONDecoder.decode" in listed
    assert "json.dumps" in listed
    info = listed["json.decoder.JSONDecoder.decode"]
    assert info.code is json.decoder.JSONDecoder.decode.__code__
    assert info.module == "json.decoder" and info.qualname == "JSONDecoder.decode"
    assert info.filename == json.decoder.__file__
    assert info.firstlineno == json.decoder.JSONDecoder.decode.__code__.co_firstlineno
    assert reg.info(json.dumps.__code__) is listed["json.dumps"]
    assert reg.name(json.dumps.__code__) == "json.dumps"


STDLIB = [
    "argparse", "ast", "asyncio", "base64", "calendar", "csv", "dataclasses", "decimal",
    "difflib", "email.parser", "enum", "fractions", "ftplib", "gettext", "glob", "gzip",
    "heapq", "html.parser", "http.client", "http.server", "imaplib", "inspect", "ipaddress",
    "logging.handlers", "mailbox", "multiprocessing", "optparse", "pathlib", "pickle",
    "pkgutil", "plistlib", "pprint", "pydoc", "queue", "shlex", "smtplib", "socketserver",
    "sqlite3", "statistics", "string", "tarfile", "tempfile", "textwrap", "timeit", "tomllib",
    "traceback", "typing", "unittest", "unittest.mock", "urllib.request", "uuid", "wave",
    "xml.dom.minidom", "xml.etree.ElementTree", "xmlrpc.client", "zipfile", "zoneinfo",
]


def check_names(infos: list[FunctionInfo]) -> None:
    names = [i.name for i in infos]
    assert len(names) == len(set(names)), "duplicate names"
    ids = [id(i.code) for i in infos]
    assert len(ids) == len(set(ids)), "code registered twice"
    for i in infos:
        assert i.name == f"{i.module}.{i.qualname}"
        assert i.kind not in ("module", "class")
        if i.suffix:
            assert SUFFIX.fullmatch(i.suffix) and i.qualname.endswith(i.suffix)
        if i.base_qualname.rpartition(".")[2] in ("<lambda>", "<genexpr>"):
            assert i.suffix, i.name


def test_names_unique_across_stdlib() -> None:
    reg = Registry()
    half = len(STDLIB) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in STDLIB[:half]:
            importlib.import_module(m)  # before the registry has looked: found by the scan
        unsubscribe = reg.subscribe(lambda infos: None)
        try:
            for m in STDLIB[half:]:
                importlib.import_module(m)  # may be new: found by the import hook
        finally:
            unsubscribe()
    infos = reg.functions()
    check_names(infos)
    assert len(infos) > 3000
    listed = by_name(infos)
    assert "xml.dom.minidom.parseString" in listed
    assert "zipfile.ZipFile.open" in listed


# --- the import hook --------------------------------------------------------------------------
def test_module_known_before_its_body_runs() -> None:
    reg = default_registry()
    calls: list[tuple[list[str], bool]] = []

    def on_new(infos: list[FunctionInfo]) -> None:
        mod = sys.modules.get("rh_early")
        body_ran = mod is not None and hasattr(mod, "helper")
        calls.append(([i.name for i in infos if i.module == "rh_early"], body_ran))

    unsubscribe = reg.subscribe(on_new)
    try:
        mod = fresh_import("rh_early")
    finally:
        unsubscribe()
    helper = reg.lookup(mod.helper.__code__)
    assert helper is not None
    # The module's own body saw its function already registered...
    assert mod.KNOWN_AT_IMPORT == helper.name
    assert mod.RESULT == "helper"
    # ...and the subscriber heard about every function before the body ran.
    early = [(names, ran) for names, ran in calls if names]
    assert early, calls
    names, body_ran = early[0]
    assert not body_ran
    assert helper.name in names
    assert reg.name(mod.later.__code__) in names


def test_unsubscribed_callback_is_not_called() -> None:
    reg = Registry()
    calls: list[list[FunctionInfo]] = []
    unsubscribe = reg.subscribe(calls.append)
    unsubscribe()
    unsubscribe()  # twice is harmless
    reg.add_code(compile("def quiet(): pass", "<quiet>", "exec"), "quiet_mod")
    fresh_import("rh_generated")
    assert calls == []


def test_release_forgets_every_function_once_nothing_subscribes() -> None:
    """A finished run lets the registry's functions go; while a subscriber (a running
    engine) keys its tables by them, release() changes nothing. Released, the registry
    names code again on demand, as a new one would."""
    reg = Registry()
    calls: list[list[FunctionInfo]] = []
    unsubscribe = reg.subscribe(calls.append)
    mod = fresh_import("rh_pkg")
    info = reg.info(mod.top.__code__)
    generation = reg.generation
    assert reg.release() is False  # subscribed: kept
    assert reg.lookup(mod.top.__code__) is info and reg.generation == generation
    unsubscribe()
    assert reg.release() is True
    assert reg.lookup(mod.top.__code__) is None
    assert reg.generation > generation  # selections cached by generation are stale
    again = reg.info(mod.top.__code__)
    assert again is not info and again.name == info.name == "rh_pkg.top"


def test_failing_subscriber_does_not_break_imports() -> None:
    reg = Registry()

    def boom(infos: list[FunctionInfo]) -> None:
        raise RuntimeError("subscriber bug")

    unsubscribe = reg.subscribe(boom)
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            mod = fresh_import("rh_pkg")
    finally:
        unsubscribe()
    assert mod.top() == "top"
    assert "subscriber bug" in err.getvalue()
    assert reg.info(mod.top.__code__).base_name == "rh_pkg.top"


def test_generated_code_named_after_its_function() -> None:
    reg = Registry()
    reported: list[FunctionInfo] = []
    unsubscribe = reg.subscribe(reported.extend)
    try:
        mod = fresh_import("rh_generated")
        listed = names_of(reg, "rh_generated")
    finally:
        unsubscribe()
    # dataclasses compiles these from strings; they are named after the class, not after the
    # helper that compiled them, and subscribers heard about them too.
    for n in ("rh_generated.Point.__init__", "rh_generated.Point.__eq__",
              "rh_generated.Point.__lt__", "rh_generated.Point.norm"):
        assert n in {i.base_name for i in listed.values()}
        assert n in {i.base_name for i in reported}
    assert reg.info(mod.Point.__init__.__code__).base_name == "rh_generated.Point.__init__"
    # namedtuple's __new__ runs in a pseudo-module named after the tuple; it is named in the
    # module of its class (another "Pair" may exist elsewhere, hence the base name). The
    # dataclass's __repr__ is wrapped by reprlib: the generated code is named after the
    # attribute it serves.
    new = reg.info(mod.Pair.__new__.__code__)
    assert (new.module, new.base_qualname) == ("rh_generated", "Pair.__new__")
    inner = mod.Point.__repr__.__wrapped__.__code__
    assert reg.info(inner).base_name == "rh_generated.Point.__repr__"


# --- add_code, info, stability ------------------------------------------------------------------
SCRIPT = '''\
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

class Runner:
    def run(self):
        return [fib(i) for i in range(5)]

square = lambda x: x * x
total = sum(square(i) for i in range(3))
'''


def test_add_code_registers_a_script_before_it_runs() -> None:
    reg = Registry()
    reported: list[FunctionInfo] = []
    unsubscribe = reg.subscribe(reported.extend)
    try:
        code = compile(SCRIPT, "/tmp/script.py", "exec")
        new = reg.add_code(code, "__main__")
    finally:
        unsubscribe()
    names = sorted(i.name for i in new)
    assert names == [
        "__main__.<genexpr>@9",
        "__main__.<lambda>@8",
        "__main__.Runner.run",
        "__main__.fib",
    ]
    assert sorted(i.name for i in reported) == names
    assert reg.add_code(code, "__main__") == []  # nothing new the second time
    assert reg.lookup(code) is None  # the module body itself is not a function
    ns: dict = {"__name__": "__main__"}
    exec(code, ns)
    assert reg.name(ns["fib"].__code__) == "__main__.fib"
    assert reg.name(ns["Runner"].run.__code__) == "__main__.Runner.run"
    info = reg.info(ns["fib"].__code__)
    assert (info.filename, info.firstlineno, info.kind) == ("/tmp/script.py", 1, "function")


def test_names_are_never_reassigned() -> None:
    reg = Registry()
    first = by_name(reg.add_code(compile(SCRIPT, "/tmp/a.py", "exec"), "again"))
    assert "again.fib" in first
    # The same module loaded again: the newcomers get suffixes, the old names stay.
    second = by_name(reg.add_code(compile(SCRIPT, "/tmp/a.py", "exec"), "again"))
    assert "again.fib@1" in second and "again.Runner.run@5" in second
    assert "again.<lambda>@8#1" in second  # "again.<lambda>@8" was taken
    third = by_name(reg.add_code(compile(SCRIPT, "/tmp/a.py", "exec"), "again"))
    assert "again.fib@1#1" in third
    for info in first.values():
        assert reg.name(info.code) == info.name
    check_names([i for i in reg.functions() if i.module == "again"])


def test_same_line_duplicates_get_numbers() -> None:
    reg = Registry()
    src = "if x:\n    def f(): pass\nelse:\n    def f(): pass\ng = [lambda: 1, lambda: 2]\n"
    got = sorted(i.name for i in reg.add_code(compile(src, "<dups>", "exec"), "dups"))
    assert got == ["dups.<lambda>@5#1", "dups.<lambda>@5#2", "dups.f@2", "dups.f@4"]


def test_info_for_unknown_code() -> None:
    reg = Registry()
    module_code = compile("def lone():\n    return (lambda: 1)\n", "<string>", "exec")
    lone = next(c for c in module_code.co_consts if isinstance(c, CodeType))
    info = reg.info(lone)
    assert info.name == "<string>.lone" and info.kind == "function"
    assert reg.info(lone) is info and reg.name(lone) == info.name
    inner = next(c for c in lone.co_consts if isinstance(c, CodeType))
    assert reg.lookup(inner) is not None  # nested code came along
    # A module hint wins over the file name.
    other = compile("def hinted(): pass", "<string>", "exec").co_consts[0]
    assert reg.info(other, module="somewhere").name == "somewhere.hinted"
    # Module bodies can be named (the engine may meet one) but are not listed.
    body = reg.info(module_code)
    assert body.kind == "module" and body.name == "<string>.<module>"
    assert body not in reg.functions()


def test_code_objects_stay_alive() -> None:
    reg = Registry()
    code = compile("def ephemeral(): pass", "<eph>", "exec").co_consts[0]
    key = id(code)
    reg.info(code, module="eph")
    del code
    gc.collect()
    info = next(i for i in reg.functions() if i.module == "eph")
    assert id(info.code) == key


def test_code_kind() -> None:
    ns: dict = {}
    exec("def g(): yield\nasync def c(): pass\nasync def a(): yield\nclass K: pass", ns)
    assert code_kind(ns["g"].__code__) == "generator"
    assert code_kind(ns["c"].__code__) == "coroutine"
    assert code_kind(ns["a"].__code__) == "async_generator"
    assert code_kind(compile("1", "<m>", "exec")) == "module"


def test_registration_from_many_threads() -> None:
    reg = Registry()
    src = "def worker():\n    return 1\n"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def run() -> None:
        try:
            start.wait()
            for _ in range(20):
                code = compile(src, "<thr>", "exec")
                reg.add_code(code, "thr")
                reg.info(code.co_consts[0])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    infos = [i for i in reg.functions() if i.module == "thr"]
    assert len(infos) == 160
    check_names(infos)


def test_imports_in_threads_are_reported() -> None:
    reg = Registry()
    reported: list[FunctionInfo] = []
    lock = threading.Lock()

    def on_new(infos: list[FunctionInfo]) -> None:
        with lock:
            reported.extend(infos)

    unsubscribe = reg.subscribe(on_new)
    try:
        sys.modules.pop("rh_pkg.sub", None)
        importlib.import_module("rh_pkg")
        t = threading.Thread(target=importlib.import_module, args=("rh_pkg.sub",))
        with redirect_stdout(io.StringIO()):
            t.start()
            t.join()
    finally:
        unsubscribe()
    assert any(i.name.startswith("rh_pkg.sub.func") for i in reported)


def test_catches_up_on_imports_without_subscribers() -> None:
    import types

    name = "rh_catchup"
    sys.modules[name] = types.ModuleType(name)
    try:
        reg = Registry()
        reg.functions()
        # The module is replaced by another one under the same name: as many modules as before.
        mod = types.ModuleType(name)
        exec(compile("def caught():\n    return 1\n", "<catchup>", "exec"), mod.__dict__)
        sys.modules[name] = mod
        assert f"{name}.caught" in {i.name for i in reg.functions()}
    finally:
        sys.modules.pop(name, None)


def test_fork_while_another_thread_holds_the_registry() -> None:
    """A thread busy in the registry when the program forks: the child's registry is usable
    (it would otherwise be locked by a thread the child does not have)."""
    assert fork_while_held(Registry()) == 0
