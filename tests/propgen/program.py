"""Random programs for the engine's property tests: a spec (plain data, shrinkable by hypothesis)
and its rendering as real Python source.

Every generated function takes ``(cid, d)``: ``cid`` is a call id unique to the call (the
caller draws it from ``_nc()``), ``d`` the remaining depth budget (each call passes ``d - 1``; at
``d <= 0`` or once the harness' call budget ``_over()`` is spent a function returns at once). So
any function may call any other, itself included, and the program still ends.

Each function writes its own ground truth to the module-level list ``_LOG``:

* ``("call", name, cid)``            its first statement, right after its entry (PY_START);
* ``("ret", name, cid, value)``      right before ``return value`` (value is a fresh tuple);
* ``("raise", name, cid, id(e), t)`` in a wrapping ``except BaseException``, right before the
                                     re-raise (so ``e`` is alive until the exit event, and the
                                     id is an identity check);

Kinds: ``func`` (plain function), ``gen`` (generator whose whole body, yields included, is inside
the instrumenting ``try``: close and throw always run its frame), ``bare`` (generator of only
``yield`` statements, none inside a ``try``: on CPython 3.12+/3.13 closing it runs no code and may
fire no event; the consumer logs ``("bclose"|"bdrop", cid)`` or ``("bthrow", cid, tok)`` before it
acts on it), ``coro`` (``async def``, instrumented like ``func``).

Generators may be kept (``_KEEP``) and later resumed, closed, thrown into or dropped from
another place of the program (``_kept``), so a suspended call comes back at another depth,
under another caller.

Names the harness injects into the module: ``_LOG _nc _step _over _KEEP _kept _E0 _E1 _sleep0
_gather _spawn``; they are plain attributes of the harness, not functions of the generated
module, so a ``*:mod:MODULE`` filter hooks exactly the generated functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st


# --- the spec -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    target: str  # a "func"


@dataclass(frozen=True)
class Step:
    """``_step()``: the harness performs its next register/unregister/set_filter action."""


@dataclass(frozen=True)
class Raise:
    cls: int  # 0 or 1: _E0 / _E1
    at_depth: int | None  # None: always; else only when d == at_depth


@dataclass(frozen=True)
class Try:
    body: tuple
    catch: str | None  # "E0", "E1", "E01", "Exception", or None for try/finally
    handler: tuple


@dataclass(frozen=True)
class UseGen:
    target: str  # a "gen" or a "bare"
    advance: int  # next() calls before the end action
    end: str  # "exhaust" | "close" | "throw" | "drop" | "keep"


@dataclass(frozen=True)
class Kept:
    """``_kept(action)``: resume (``next``), ``close``, ``throw`` into or ``drop`` the generator
    kept last (by a ``UseGen(end="keep")``), from wherever the program is now."""

    action: str


@dataclass(frozen=True)
class Yield:
    pass


@dataclass(frozen=True)
class YieldFrom:
    target: str  # a "gen"


@dataclass(frozen=True)
class Await:
    target: str  # a "coro"


@dataclass(frozen=True)
class Sleep:
    pass


@dataclass(frozen=True)
class Gather:
    targets: tuple[str, ...]
    return_exceptions: bool


@dataclass(frozen=True)
class Spawn:
    target: str  # a "coro", run as a task nobody awaits (cancelled by asyncio.run at the end)


@dataclass(frozen=True)
class Func:
    name: str
    kind: str  # "func" | "gen" | "bare" | "coro"
    body: tuple = ()
    yields: int = 1  # bare only


@dataclass(frozen=True)
class Program:
    funcs: tuple[Func, ...]
    depth: int
    is_async: bool = False
    entry: str = field(default="")

    def by_name(self) -> dict[str, Func]:
        return {f.name: f for f in self.funcs}

    def names(self) -> list[str]:
        return [f.name for f in self.funcs]


# --- rendering ----------------------------------------------------------------------------------
_CATCH = {"E0": "_E0", "E1": "_E1", "E01": "(_E0, _E1)", "Exception": "Exception"}


class _Renderer:
    def __init__(self) -> None:
        self.n = 0
        self.lines: list[str] = []

    def emit(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)

    def fresh(self) -> int:
        self.n += 1
        return self.n

    def ret(self, indent: int, name: str) -> None:
        self.emit(indent, '_r = ("r", cid)')
        self.emit(indent, f'_LOG.append(("ret", "{name}", cid, _r))')
        self.emit(indent, "return _r")

    def body(self, indent: int, stmts: tuple, kinds: dict[str, str]) -> None:
        if not stmts:
            self.emit(indent, "pass")
        for s in stmts:
            self.stmt(indent, s, kinds)

    def stmt(self, i: int, s: object, kinds: dict[str, str]) -> None:
        if isinstance(s, Call):
            self.emit(i, f"{s.target}(_nc(), d - 1)")
        elif isinstance(s, Step):
            self.emit(i, "_step()")
        elif isinstance(s, Raise):
            raise_ = f"raise _E{s.cls}(_nc())"
            if s.at_depth is None:
                self.emit(i, raise_)
            else:
                self.emit(i, f"if d == {s.at_depth}:")
                self.emit(i + 1, raise_)
        elif isinstance(s, Try):
            self.emit(i, "try:")
            self.body(i + 1, s.body, kinds)
            self.emit(i, "finally:" if s.catch is None else f"except {_CATCH[s.catch]}:")
            self.body(i + 1, s.handler, kinds)
        elif isinstance(s, UseGen):
            self.use_gen(i, s, kinds[s.target] == "bare")
        elif isinstance(s, Kept):
            self.emit(i, f'_kept("{s.action}")')
        elif isinstance(s, Yield):
            self.emit(i, 'yield ("y", cid)')
        elif isinstance(s, YieldFrom):
            self.emit(i, f"yield from {s.target}(_nc(), d - 1)")
        elif isinstance(s, Await):
            self.emit(i, f"await {s.target}(_nc(), d - 1)")
        elif isinstance(s, Sleep):
            self.emit(i, "await _sleep0()")
        elif isinstance(s, Gather):
            args = ", ".join(f"{t}(_nc(), d - 1)" for t in s.targets)
            self.emit(i, f"await _gather({args}, return_exceptions={s.return_exceptions})")
        elif isinstance(s, Spawn):
            self.emit(i, f"_spawn({s.target}(_nc(), d - 1))")
        else:  # pragma: no cover
            raise TypeError(s)

    def use_gen(self, i: int, s: UseGen, bare: bool) -> None:
        n = self.fresh()
        c, g = f"_c{n}", f"_g{n}"
        self.emit(i, f"{c} = _nc()")
        self.emit(i, f"{g} = {s.target}({c}, d - 1)")
        self.emit(i, "try:")
        if s.advance:
            self.emit(i + 1, "try:")
            self.emit(i + 2, f"for _ in range({s.advance}):")
            self.emit(i + 3, f"next({g})")
            self.emit(i + 1, "except StopIteration:")
            self.emit(i + 2, "pass")
        if s.end == "exhaust":
            self.emit(i + 1, f"for _ in {g}:")
            self.emit(i + 2, "pass")
        elif s.end == "close":
            if bare:
                self.emit(i + 1, f'_LOG.append(("bclose", {c}))')
            self.emit(i + 1, f"{g}.close()")
        elif s.end == "throw":
            self.emit(i + 1, f"_t{n} = _nc()")
            if bare:
                self.emit(i + 1, f'_LOG.append(("bthrow", {c}, _t{n}))')
            self.emit(i + 1, "try:")
            self.emit(i + 2, f"{g}.throw(_E0(_t{n}))")
            self.emit(i + 1, "except StopIteration:")
            self.emit(i + 2, "pass")
        elif s.end == "keep":
            self.emit(i + 1, f"_KEEP.append(({c}, {g}))")
        elif s.end == "drop":
            if bare:
                self.emit(i + 1, f'_LOG.append(("bdrop", {c}))')
            else:
                self.emit(i + 1, "pass")
        else:  # pragma: no cover
            raise ValueError(s.end)
        self.emit(i, "finally:")
        self.emit(i + 1, f"del {g}")

    def function(self, f: Func, kinds: dict[str, str]) -> None:
        name = f.name
        if f.kind == "bare":
            self.emit(0, f"def {name}(cid, d):")
            self.emit(1, f'_LOG.append(("call", "{name}", cid))')
            for _ in range(max(1, f.yields)):
                self.emit(1, 'yield ("y", cid)')
            self.ret(1, name)
            self.emit(0, "")
            return
        self.emit(0, f"{'async ' if f.kind == 'coro' else ''}def {name}(cid, d):")
        self.emit(1, f'_LOG.append(("call", "{name}", cid))')
        self.emit(1, "try:")
        self.emit(2, "if d <= 0 or _over():")
        self.ret(3, name)
        for s in f.body:
            self.stmt(2, s, kinds)
        if f.kind == "gen" and not _has_yield(f.body):
            self.emit(2, 'yield ("y", cid)')
        self.ret(2, name)
        self.emit(1, "except BaseException as _e:")
        self.emit(2, f'_LOG.append(("raise", "{name}", cid, id(_e), type(_e).__name__))')
        self.emit(2, "raise")
        self.emit(0, "")


def _has_yield(stmts: tuple) -> bool:
    for s in stmts:
        if isinstance(s, (Yield, YieldFrom)):
            return True
        if isinstance(s, Try) and (_has_yield(s.body) or _has_yield(s.handler)):
            return True
    return False


def render(program: Program) -> str:
    """The program as the source of a module."""
    r = _Renderer()
    r.emit(0, '"""Generated by tests/propgen: a random program for the engine properties."""')
    r.emit(0, "")
    for name in ("_LOG", "_nc", "_step", "_over", "_KEEP", "_kept", "_E0", "_E1", "_sleep0",
                 "_gather", "_spawn"):
        r.emit(0, f"{name} = None")
    r.emit(0, "")
    kinds = {f.name: f.kind for f in program.funcs}
    for f in program.funcs:
        r.function(f, kinds)
    return "\n".join(r.lines) + "\n"


# --- strategies ---------------------------------------------------------------------------------
_ENDS = ("exhaust", "close", "throw", "drop", "keep")


@st.composite
def _stmts(draw, kind: str, names: dict[str, list[str]], nest: int, in_handler: bool,
           max_size: int, min_size: int = 0) -> tuple:
    """A statement list for a function of ``kind``."""
    # Weighted: calls and generator uses make the program deep; steps make it live.
    choices = ["call"] * 4 + ["step"] * 2 + ["raise"]
    if nest < 2:
        choices += ["try"] * 2
    if kind in ("func", "gen") and (names["gen"] or names["bare"]):
        choices += ["usegen"] * 3 + ["kept"]
    if kind == "gen" and not in_handler:
        choices += ["yield"] * 2
        if names["gen"]:
            choices.append("yieldfrom")
    if kind == "coro":
        choices += ["await"] * 5 + ["sleep"] * 2
        if not in_handler:
            choices += ["gather"] * 2 + ["spawn"]
    out = []
    for _ in range(draw(st.integers(min_size, max_size))):
        c = draw(st.sampled_from(choices))
        if c == "call":
            out.append(Call(draw(st.sampled_from(names["func"]))))
        elif c == "step":
            out.append(Step())
        elif c == "raise":
            out.append(Raise(draw(st.integers(0, 1)),
                             draw(st.sampled_from([1, 2, 3, 0, 4, None]))))
        elif c == "try":
            body = draw(_stmts(kind, names, nest + 1, in_handler, 3, 1))
            catch = draw(st.sampled_from([None, "E0", "E1", "E01", "Exception"]))
            handler = draw(_stmts(kind, names, nest + 1, True, 2))
            out.append(Try(body, catch, handler))
        elif c == "usegen":
            target = draw(st.sampled_from(names["gen"] + names["bare"]))
            out.append(UseGen(target, draw(st.integers(0, 3)), draw(st.sampled_from(_ENDS))))
        elif c == "kept":
            out.append(Kept(draw(st.sampled_from(["next", "next", "close", "throw", "drop"]))))
        elif c == "yield":
            out.append(Yield())
        elif c == "yieldfrom":
            out.append(YieldFrom(draw(st.sampled_from(names["gen"]))))
        elif c == "await":
            out.append(Await(draw(st.sampled_from(names["coro"]))))
        elif c == "sleep":
            out.append(Sleep())
        elif c == "gather":
            targets = draw(st.lists(st.sampled_from(names["coro"]), min_size=1, max_size=3))
            out.append(Gather(tuple(targets), draw(st.booleans())))
        elif c == "spawn":
            out.append(Spawn(draw(st.sampled_from(names["coro"]))))
    return tuple(out)


@st.composite
def programs(draw, is_async: bool = False) -> Program:
    """A random sync program (functions, generators, bare generators) or async one
    (coroutines and plain functions). The entry point is the first function."""
    if is_async:
        counts = {"coro": draw(st.integers(1, 4)), "func": draw(st.integers(1, 2)),
                  "gen": 0, "bare": 0}
    else:
        counts = {"func": draw(st.integers(1, 4)), "gen": draw(st.integers(0, 3)),
                  "bare": draw(st.integers(0, 2)), "coro": 0}
    prefix = {"func": "f", "gen": "g", "bare": "b", "coro": "a"}
    names = {k: [f"{prefix[k]}{i}" for i in range(n)] for k, n in counts.items()}
    funcs = []
    order = ("coro", "func") if is_async else ("func", "gen", "bare")
    for kind in order:
        for name in names[kind]:
            if kind == "bare":
                funcs.append(Func(name, kind, (), draw(st.integers(1, 3))))
            else:
                funcs.append(Func(name, kind, draw(_stmts(kind, names, 0, False, 5, 1))))
    depth = draw(st.integers(2, 5))
    return Program(tuple(funcs), depth, is_async, funcs[0].name)
