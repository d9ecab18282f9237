"""What a hook core can do beyond the contract every core keeps: :class:`Capabilities`, read in
one place each (``rethook --version``, the built-in tracers' choice of native users, the tests'
core matrix). Apart from the cores' interface (:mod:`rethook.engine.coreapi`), whose
``typing.Protocol`` the cores need only for type checking: importing ``typing`` costs ~5 ms of
every start-up.
"""

from __future__ import annotations

from rethook.frozen import Frozen


class Capabilities(Frozen):
    """What a hook core can do, beyond the contract every core keeps (core.py's docstring)."""

    __slots__ = ("name", "direct_calls", "native_users")

    #: ``"c"`` or ``"python"``: what ``RETHOOK_ENGINE`` names it by
    name: str
    #: It calls C users' hooks directly, with no Python object per call
    #: (engine/fgraph_direct.h); the engine builds direct entries only for such a core.
    direct_calls: bool
    #: The built-in tracers' users written in C (tracers/_native.c) run on it: they share
    #: the core's C thread cache, clock and direct calls.
    native_users: bool

    def __init__(self, name: str, direct_calls: bool, native_users: bool) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "direct_calls", direct_calls)
        object.__setattr__(self, "native_users", native_users)

    def describe(self) -> str:
        """One line for ``rethook --version``."""
        what = [n for n, on in (("direct calls", self.direct_calls),
                                ("native users", self.native_users)) if on]
        return f"core capabilities: {', '.join(what) or 'reference only (no C)'}"


__all__ = ["Capabilities"]
