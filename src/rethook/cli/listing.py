"""``rethook list``: tracers, trace options, and the functions a program could trace.

Functions are listed without running the program: the script is compiled (its functions are
registered as ``__main__.*``) and the modules its top-level statements import are imported, so
their functions are known too. ``-m MODULE`` does the same for a module (or a package's
``__init__``), whose functions keep the module's name; a module that is already imported is
listed as it is.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable

from rethook.engine.filters import FilterError, FunctionFilter
from rethook.engine.registry import FunctionInfo, default_registry
from rethook.runner.program import Program, ProgramError, find_spec_of, prepare_package
from rethook.tracers import TRACERS
from rethook.tracers.base import OPTION_DEFAULTS

#: Who reads the options that no tracer lists in ``uses_options``.
_OTHER_USERS = {
    "graph-time": ("profile",),
    "sleep-time": ("profile",),
    "overwrite": ("ring buffer",),
}


class ListError(ValueError):
    """A listing that cannot be made as asked (a glob that matches nothing)."""


def tracer_lines() -> list[str]:
    """One line per tracer: its name and the first line of its docstring."""
    width = max(map(len, TRACERS))
    lines = []
    for name, cls in TRACERS.items():
        doc = (cls.__doc__ or "").strip().splitlines()
        summary = doc[0] if doc else ""
        if summary.startswith(f"``{name}``:"):
            summary = summary[len(name) + 5:].strip()
        lines.append(f"{name:<{width}}  {summary}".rstrip())
    return lines


def option_lines() -> list[str]:
    """A table of the trace options: name, default, what reads it."""
    rows = []
    for name in sorted(OPTION_DEFAULTS):
        users = [t for t, cls in TRACERS.items() if name in cls.uses_options]
        users += _OTHER_USERS.get(name, ())
        rows.append((name, "on" if OPTION_DEFAULTS[name] else "off", ", ".join(users) or "-"))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'OPTION':<{width}}  DEFAULT  USED BY"]
    lines += [f"{n:<{width}}  {d:<7}  {u}" for n, d, u in rows]
    return lines


def function_names(module: str | None, program: tuple[str, ...], glob: str) -> list[str]:
    """Names of the traceable functions of a program (or module) matching ``glob``."""
    registry = default_registry()
    if module is not None:
        roots = _module_roots(module)
    else:
        prog = Program(script=program[0], args=program[1:])
        code = prog.load()
        registry.add_code(code, "__main__")
        roots = ["__main__", *_import_top_level(prog.path, None)]
    try:
        chosen = FunctionFilter([glob], registry=registry).select_infos()
    except FilterError as e:
        raise ListError(f"-f {glob!r}: {e}") from None
    names = [info.name for info in chosen if _within(info, roots)]
    if not names:
        raise ListError(f"-f {glob!r}: no function of "
                        f"{', '.join(r.lstrip('=') for r in roots)} matches")
    return names


def _within(info: FunctionInfo, roots: list[str]) -> bool:
    """Whether a function is of one of the modules listed: a root ``=NAME`` is that module
    alone, any other root its submodules too."""
    m = info.module
    return any(m == r[1:] if r[0] == "=" else (m == r or m.startswith(r + "."))
               for r in roots)


def _module_roots(name: str) -> list[str]:
    """Register a module's functions without running it -- for a package, those of all its
    modules, imported or not (as ``record -m`` knows them) -- and returns the modules to list.
    Modules are found as ``python -m`` finds them: the current directory first."""
    sys.path.insert(0, os.getcwd())
    if name in sys.modules:
        return [name]
    try:
        spec = find_spec_of(name)
    except ProgramError as e:
        raise ListError(f"-m {name!r}: {e}") from None
    loader = spec.loader
    code = loader.get_code(name) if loader is not None and hasattr(loader, "get_code") else None
    if code is None or spec.origin is None:  # a namespace package, a builtin
        importlib.import_module(name)
        return [name]
    registry = default_registry()
    prepare_package(registry, name.split(".")[0])
    if not registry.prepared(name):  # not found on disk as part of its package
        registry.add_code(code, name)
    package = name if spec.submodule_search_locations is not None else spec.parent
    return [name, *_import_top_level(spec.origin, package, skip=registry.covers)]


def _import_top_level(path: str, package: str | None,
                      skip: Callable[[str], bool] = lambda name: False) -> list[str]:
    """Import what a source file's top-level statements import; returns the module names.

    Only statements at the top level (including inside ``if``/``try`` blocks there), since
    those are what the program certainly imports; one that fails to import is skipped with a
    note on stderr. Relative imports are resolved against ``package``; names ``skip`` accepts
    are left alone.
    """
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    names: list[str] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if not package:
                    continue
                try:
                    base = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                                       package)
                except ImportError:
                    continue
            elif node.module:
                base = node.module
            else:
                continue
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for body in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, body, ()):
                    todo.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])
    found = []
    for name in dict.fromkeys(names):
        if skip(name):
            found.append("=" + name)  # known without importing it: a module of the package
            continue
        if name in sys.modules:
            found.append(name)
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            if "." not in name or name.rsplit(".", 1)[0] not in sys.modules:
                print(f"rethook: cannot import {name!r}: its functions are not listed",
                      file=sys.stderr)
            continue  # "from pkg import attr": attr is not a module, fine
        except Exception as e:  # noqa: BLE001 - the module's own code failed on import
            print(f"rethook: importing {name!r} failed ({type(e).__name__}: {e}): its "
                  "functions are not listed", file=sys.stderr)
            continue
        found.append(name)
    return found
