"""Random users of the engine (graph and entry users), their filters, and the live steps.

A user's filter is a list of patterns over the generated module's functions, written in ftrace's
syntax; :class:`FilterModel` predicts what a sequence of writes selects, independently of the
engine (the same rules as ``set_ftrace_filter``: ``>`` replaces, ``>>`` appends, a pattern
written again moves to the end, ``!PATTERN`` removes, and with removals the last pattern that
matches a function decides). Writes that would leave the hash empty (an empty filter means
*every function in the process*) are never made.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from propgen.program import Program

# A pattern: ("all",) | ("name", fn) | ("qual", fn) | ("prefix", letter)
Pattern = tuple


def pattern_text(p: Pattern, module: str) -> str:
    kind = p[0]
    if kind == "all":
        return f"*:mod:{module}"
    if kind == "name":
        return f"{module}.{p[1]}"
    if kind == "qual":
        return f"{p[1]}:mod:{module}"
    if kind == "prefix":
        return f"{module}.{p[1]}*"
    raise ValueError(p)


def pattern_matches(p: Pattern, name: str) -> bool:
    kind = p[0]
    if kind == "all":
        return True
    if kind in ("name", "qual"):
        return name == p[1]
    return name.startswith(p[1])


class FilterModel:
    """What a user's filter hash selects, predicted from the writes (see the module doc)."""

    def __init__(self, module: str, names: list[str]) -> None:
        self.module = module
        self.names = names
        self.entries: list[tuple[str, bool, Pattern]] = []

    def copy(self) -> FilterModel:
        m = FilterModel(self.module, self.names)
        m.entries = list(self.entries)
        return m

    def write(self, patterns: tuple, append: bool, allow_empty: bool = False) -> bool:
        """Apply a write of ``patterns`` (each ``(pattern, remove)``). False (and nothing
        changed) if the hash would end up empty, unless ``allow_empty`` (a notrace hash)."""
        entries = list(self.entries) if append else []
        for p, remove in patterns:
            text = pattern_text(p, self.module)
            entries = [e for e in entries if e[0] != text]
            if not remove:
                entries.append((text, True, p))
            elif any(e[1] for e in entries):
                entries.append((text, False, p))
            else:
                entries = []
        if not any(e[1] for e in entries):
            if not allow_empty:
                return False
            entries = []
        self.entries = entries
        return True

    def selects(self, name: str) -> bool:
        for _, include, p in reversed(self.entries):
            if pattern_matches(p, name):
                return include
        return False

    def selection(self) -> frozenset[str]:
        return frozenset(n for n in self.names if self.selects(n))


@dataclass(frozen=True)
class UserSpec:
    kind: str  # "graph" (FgraphOps) | "entry" (FtraceOps)
    filter: tuple  # initial patterns (never removals)
    notrace: tuple[str, ...]  # function names
    decline_mod: int  # 0: accept every call; else decline when cid % mod == decline_res
    decline_res: int
    decline_value: bool | None  # what a decline returns: None or False
    falsy_data: bool  # entry data objects that are false (accepting must not mean truthy)
    registered: bool  # registered before the program starts
    #: None, or "entry"/"ret": that handler performs the next step itself (register,
    #: unregister or set_filter from inside a handler) on calls with ``cid % step_mod == 0``
    handler_step: str | None = None
    step_mod: int = 2
    #: None, or "entry"/"ret": that handler raises RuntimeError on calls with
    #: ``cid % raise_mod == 1`` (an entry handler that raises declines the call)
    raises: str | None = None
    raise_mod: int = 3

    def raises_in(self, where: str, cid: object) -> bool:
        return self.raises == where and isinstance(cid, int) and cid % self.raise_mod == 1

    def claims(self, cid: int) -> bool:
        """Whether this user's entry handler accepts the call ``cid``."""
        return self.accepts(cid) and not self.raises_in("entry", cid)

    def steps_in(self, where: str, cid: object) -> bool:
        return self.handler_step == where and isinstance(cid, int) and cid % self.step_mod == 0

    def accepts(self, cid: int) -> bool:
        return not (self.decline_mod and cid % self.decline_mod == self.decline_res)


@dataclass(frozen=True)
class Action:
    """One live step, performed when the program calls ``_step()``.

    kind: "toggle" (register if not registered, else unregister), "filter" (``set_filter``
    with ``patterns`` and ``append``), "notrace" (``set_notrace``), "swap" (unregister ``uid``
    if registered, then register ``other`` if not: with ``other == uid`` that is a
    re-registration while calls are open), "restart" (``sys.monitoring.restart_events()``, as
    another tool may call it: must change nothing).
    """

    kind: str
    uid: int
    other: int = 0
    patterns: tuple = ()
    append: bool = False


def _patterns_for(program: Program):
    names = program.names()
    letters = sorted({n[0] for n in names})
    return st.one_of(
        st.just(("all",)),
        st.sampled_from(names).map(lambda n: ("name", n)),
        st.sampled_from(names).map(lambda n: ("qual", n)),
        st.sampled_from(letters).map(lambda c: ("prefix", c)),
    )


@st.composite
def user_specs(draw, program: Program, entry_users: bool = True,
               first: bool = False, handler_steps: tuple[str, ...] = ()) -> UserSpec:
    """A random user; the ``first`` one is a graph user registered from the start."""
    pats = _patterns_for(program)
    kind = draw(st.sampled_from(["graph", "graph", "graph", "entry"])) \
        if entry_users and not first else "graph"
    mod = draw(st.sampled_from([0, 0, 2, 3]))
    return UserSpec(
        kind=kind,
        filter=tuple(draw(st.lists(pats, min_size=1, max_size=3))),
        notrace=tuple(draw(st.lists(st.sampled_from(program.names()), max_size=1))),
        decline_mod=mod,
        decline_res=draw(st.integers(0, mod - 1)) if mod else 0,
        decline_value=draw(st.sampled_from([None, False])),
        falsy_data=draw(st.booleans()),
        registered=first or draw(st.sampled_from([True, True, False])),
        handler_step=draw(st.sampled_from((None, *handler_steps))) if kind == "graph" else None,
        step_mod=draw(st.integers(2, 4)),
        raises=draw(st.sampled_from([None, None, None, None, "entry", "ret"]))
        if kind == "graph" else None,
        raise_mod=draw(st.integers(2, 5)),
    )


@st.composite
def actions(draw, program: Program, n_users: int, max_size: int = 10) -> tuple[Action, ...]:
    pats = _patterns_for(program)
    uid = st.integers(0, n_users - 1)
    out = []
    for _ in range(draw(st.integers(0, max_size))):
        kind = draw(st.sampled_from(["toggle", "toggle", "filter", "filter", "remove", "swap",
                                     "notrace", "restart"]))
        u = draw(uid)
        if kind == "toggle":
            out.append(Action("toggle", u))
        elif kind == "swap":
            out.append(Action("swap", u, other=draw(uid)))
        elif kind == "filter":
            ps = draw(st.lists(pats, min_size=1, max_size=2))
            out.append(Action("filter", u, patterns=tuple((p, False) for p in ps),
                              append=draw(st.booleans())))
        elif kind == "notrace":
            ps = draw(st.lists(pats, min_size=1, max_size=2))
            remove = draw(st.booleans())
            out.append(Action("notrace", u, patterns=tuple((p, remove) for p in ps),
                              append=remove or draw(st.booleans())))
        elif kind == "restart":
            out.append(Action("restart", u))
        else:
            out.append(Action("filter", u, patterns=((draw(pats), True),), append=True))
    return tuple(out)
