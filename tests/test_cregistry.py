"""The registry's C twin (engine/_cregistry.c) against registry.py, the reference: the same
names, kinds, suffixes and order for the same code, the same functions found in a namespace."""

from __future__ import annotations

import gc
import glob
import os
import sys
import sysconfig
from types import CodeType, ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rethook.engine import registry

pytestmark = pytest.mark.skipif(registry._c is None, reason="engine/_cregistry.c not built")


def _fields(info: registry.FunctionInfo) -> tuple:
    return (id(info.code), type(info), info.name, info.module, info.qualname, info.filename,
            info.firstlineno, info.kind, info.suffix)


def _register(codes: list[tuple[CodeType, str]], use_c: bool,
              monkeypatch: pytest.MonkeyPatch) -> tuple:
    """Register each ``(module code, module name)`` twice (the second time every name is
    taken): what each batch named, in order, and what the registry holds after."""
    with monkeypatch.context() as m:
        if not use_c:
            m.setattr(registry, "_c", None)
        reg = registry.Registry()
        batches = []
        for top in (False, True):
            for code, module in codes:
                entries: dict = {}
                reg._collect(code, module, None, entries, register_top=top)
                batches.append([_fields(i) for i in reg._commit(entries)])
        return batches, sorted(reg._bodies), reg._order, sorted(reg._taken), sorted(reg._modules)


# Sources with what makes naming hard: names defined twice (in branches, as property
# accessors), several lambdas and generator expressions on one line, nested and
# renamed scopes, every kind of function.
_NAME = st.sampled_from(["f", "g", "p", "K"])


@st.composite
def _block(draw, depth: int = 0) -> list[str]:
    lines: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["def", "async", "gen", "class", "lambdas", "genexpr",
                                     "branch", "property", "pass"]
                                    if depth < 3 else ["lambdas", "genexpr", "pass"]))
        name = draw(_NAME)
        if what in ("def", "async", "gen"):
            head = {"def": "def", "async": "async def", "gen": "def"}[what]
            body = draw(_block(depth + 1))
            if what == "gen":
                body = ["yield 1", *body]
            lines += [f"{head} {name}(a=1):", *("    " + b for b in body)]
        elif what == "class":
            lines += [f"class {name}:", *("    " + b for b in draw(_block(depth + 1)))]
        elif what == "lambdas":
            n = draw(st.integers(1, 3))
            lines.append(f"{name} = [" + ", ".join(["lambda: 0"] * n) + "]")
        elif what == "genexpr":
            lines.append(f"{name} = (i for i in ()), (j for j in ())")
        elif what == "branch":
            lines += ["if a:", f"    def {name}(): pass", "else:", f"    def {name}(): pass"]
        elif what == "property":
            lines += ["@property", f"def {name}(self): pass", f"@{name}.setter",
                      f"def {name}(self, v): pass"]
        else:
            lines.append("pass")
    return lines


@settings(max_examples=150, deadline=None)
@given(st.lists(_block(), min_size=1, max_size=3), st.sampled_from(["mod", "pkg.mod"]))
def test_c_names_what_python_names(blocks: list[list[str]], module: str) -> None:
    codes = [(compile("a = 1\n" + "\n".join(b) + "\n", f"/src/{module}{i}.py", "exec"), module)
             for i, b in enumerate(blocks)]
    with pytest.MonkeyPatch.context() as mp:
        assert _register(codes, False, mp) == _register(codes, True, mp)


def test_c_names_the_standard_library_and_rethook_as_python_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stdlib = sysconfig.get_paths()["stdlib"]
    paths = sorted(glob.glob(os.path.join(stdlib, "*.py")))[:120]
    paths += sorted(glob.glob(os.path.join(os.path.dirname(registry.__file__), "..", "**",
                                           "*.py"), recursive=True))
    codes = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            try:
                codes.append((compile(f.read(), path, "exec"), os.path.basename(path)[:-3]))
            except SyntaxError:  # (test data of the standard library's own)
                continue
    assert _register(codes, False, monkeypatch) == _register(codes, True, monkeypatch)


def test_c_infos_are_frozen_and_out_of_the_collectors_sight() -> None:
    reg = registry.Registry()
    infos = reg.add_code(compile("def f(): pass\nclass K:\n    def m(self): pass\n", "<x>",
                                 "exec"), "cmod")
    info = next(i for i in infos if i.name == "cmod.f")
    assert type(info) is registry.FunctionInfo and repr(info).startswith("FunctionInfo(")
    with pytest.raises(AttributeError):
        info.name = "other"  # type: ignore[misc]
    assert not gc.is_tracked(info)  # (a code object, strings and an int: never in a cycle)
    assert info == info and info != registry.FunctionInfo(*[getattr(info, f) for f in
                                                            registry.FunctionInfo._fields])


def _namespace(use_c: bool, mod: ModuleType, monkeypatch: pytest.MonkeyPatch) -> tuple:
    with monkeypatch.context() as m:
        if not use_c:
            m.setattr(registry, "_c", None)
        owners: dict = {}
        found = registry._namespace_functions(mod, {}, owners)
        return found, owners


def test_c_finds_in_a_namespace_what_python_finds(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = ModuleType("nsmod")
    monkeypatch.setitem(sys.modules, "nsmod", mod)  # (dataclasses looks its module up)
    exec(
        "import dataclasses, collections, functools\n"
        "@dataclasses.dataclass\nclass D:\n    x: int = 0\n"
        "    @property\n    def p(self): return 1\n    @p.setter\n    def p(self, v): pass\n"
        "    @staticmethod\n    def s(): pass\n    @classmethod\n    def c(cls): pass\n"
        "    class Inner:\n        def deep(self): pass\n"
        "N = collections.namedtuple('N', 'a b')\n"
        "def base(): pass\n"
        "@functools.wraps(base)\ndef wrapper(): return base()\n"
        "class Foreign: pass\nForeign.__module__ = 'elsewhere'\n"
        "class Odd: pass\nOdd.__module__ = 3\n",
        mod.__dict__)
    py, c = _namespace(False, mod, monkeypatch), _namespace(True, mod, monkeypatch)
    assert py == c and len(py[0]) > 8
    for name, m in list(sys.modules.items()):
        if isinstance(m, ModuleType):
            assert _namespace(False, m, monkeypatch) == _namespace(True, m, monkeypatch), name


def _registered_modules(mods: list[ModuleType], use_c: bool,
                        monkeypatch: pytest.MonkeyPatch) -> tuple:
    """Register each module's namespace (as discovery registers a module loaded before the
    run, through _register_tops), twice: what each batch named, in order, and the state."""
    with monkeypatch.context() as m:
        if not use_c:
            m.setattr(registry, "_c", None)
        reg = registry.Registry()
        batches = []
        for _ in range(2):
            for mod in mods:
                with reg._lock:
                    batches.append([_fields(i) for i in reg._register_module(mod)])
        return batches, sorted(reg._bodies), reg._order, sorted(reg._taken), sorted(reg._modules)


@settings(max_examples=60, deadline=None)
@given(st.lists(_block(), min_size=1, max_size=3))
def test_c_registers_a_namespace_as_python_does(blocks: list[list[str]]) -> None:
    """A namespace's functions (and what is nested in them) named alike by both: the tops'
    two loops of _register_tops are C's collect_tops."""
    mods = []
    for i, b in enumerate(blocks):
        mod = ModuleType(f"nsreg{i}")
        try:
            exec(compile("a = 1\n" + "\n".join(b) + "\n", f"/src/nsreg{i}.py", "exec"),
                 mod.__dict__)
        except Exception:  # noqa: BLE001 - (a block that fails as it runs: what ran stays)
            pass
        mods.append(mod)
    with pytest.MonkeyPatch.context() as mp:
        assert _registered_modules(mods, False, mp) == _registered_modules(mods, True, mp)


def test_c_registers_the_standard_librarys_namespaces_as_python_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import collections
    import json.decoder
    import threading
    import weakref

    mods = [collections, threading, weakref, os, json.decoder, registry]
    py = _registered_modules(mods, False, monkeypatch)
    assert py == _registered_modules(mods, True, monkeypatch)
    assert len(py[0][0]) > 50  # (collections' functions, named)


def test_c_picks_the_tops_python_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """_tops' common case in C, the rest through _top_of: the same (code, module, qualname)
    for plain functions, a module body run as a function, the same code under two globals
    (the first wins), code made from a string (named after its function or class), globals
    without a usable ``__name__``, rethook's own, and code already known."""
    import dataclasses
    import types

    from rethook.engine import core

    def plain():
        pass

    @dataclasses.dataclass
    class Made:
        x: int = 0

    class Name(str):
        pass

    body = types.FunctionType(compile("y = 1", "/src/m.py", "exec"), {"__name__": "m"})
    twin = types.FunctionType(plain.__code__, {"__name__": "other"})
    nameless = types.FunctionType(compile("def h(): pass", "/src/n.py", "exec").co_consts[0], {})
    odd = types.FunctionType(compile("def k(): pass", "/src/o.py", "exec").co_consts[0],
                             {"__name__": Name("oddmod")})
    empty = types.FunctionType(compile("def e(): pass", "/src/e.py", "exec").co_consts[0],
                               {"__name__": ""})
    gen = types.FunctionType(compile("def g(): pass", "<string>", "exec").co_consts[0],
                             {"__name__": "genmod"})
    own = types.FunctionType(compile("def o(): pass", "/src/r.py", "exec").co_consts[0],
                             {"__name__": core.OWN_PACKAGE + ".x"})
    frozen = types.FunctionType(compile("def z(): pass", "<frozen zz>", "exec").co_consts[0],
                                {"__name__": "zz"})
    funcs = [plain, twin, body, Made.__init__, Made.__repr__, nameless, odd, empty, gen, own,
             frozen, registry.default_registry, plain]
    owners = {id(Made.__init__): (Made, Made.__init__), id(Made.__repr__): (Made, Made.__repr__)}

    def tops(use_c: bool) -> list:
        with monkeypatch.context() as m:
            if not use_c:
                m.setattr(registry, "_c", None)
            reg = registry.Registry()
            reg._by_id[id(frozen.__code__)] = None  # (known: left out)
            return sorted(((id(c), mod, q) for c, mod, q in reg._tops(iter(funcs), owners)),
                          key=repr)

    py = tops(False)
    assert py == tops(True)
    assert (id(plain.__code__), __name__, plain.__qualname__) in py  # (not the twin's module)
    assert len(py) == 7  # (not the body, rethook's own, the known code nor a twin again)


def test_c_selects_codes_by_id_as_python_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """codes_by_id (the engine's selection of a module's new functions): each info's
    ``id(code): code`` into every dict given, in C as in Python, whatever the dicts held;
    a FunctionInfo made by the C registry or in Python, or any object with a ``code``."""
    reg = registry.Registry()
    entries: dict = {}
    code = compile("def f(): pass\nclass K:\n    def g(self): pass\nh = lambda: 0\n", "m", "exec")
    reg._collect(code, "m", None, entries, register_top=False)
    infos = reg._commit(entries)
    made = registry.FunctionInfo(code.co_consts[0], "m.x", "m", "x", "m", 1, "function")

    class Other:
        code = compile("pass", "o", "exec")

    given = [*infos, made, Other()]
    results = []
    for use_c in (True, False):
        with monkeypatch.context() as m:
            if not use_c:
                m.setattr(registry, "_c", None)
            a, b = {1: None}, {}
            registry.codes_by_id(given, (a, b))
            registry.codes_by_id([], (a,))
            results.append((a, b))
    assert results[0] == results[1]
    a, b = results[0]
    assert b == {id(i.code): i.code for i in given} and a == {1: None, **b}
    with pytest.raises(TypeError):
        registry._c.codes_by_id(given, ([],))
    with pytest.raises(AttributeError):
        registry._c.codes_by_id([object()], ({},))
