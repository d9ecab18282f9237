"""Which hook core the engine runs on: the C one when it is built, else the pure-Python one.

``choose_core()`` is the one place the choice is made. The C core (``rethook.engine._ccore``,
see docs/ccore.md) implements the same contract as :mod:`rethook.engine.core` and shares its
state; the pure-Python core stays the reference. Force the pure core with
``RETHOOK_ENGINE=python`` in the environment or ``choose_core("python")``; ``RETHOOK_ENGINE=c``
(or ``choose_core("c")``) insists on the C core and fails if it is not built. The running
core says which it is in ``core.name`` (``"c"`` or ``"python"``); ``core.note`` says why.
"""

from __future__ import annotations

import os
import sys

from rethook.engine import core as _core
from rethook.engine.capabilities import Capabilities

TYPE_CHECKING = False
if TYPE_CHECKING:
    from rethook.engine.coreapi import HookCore

ENV_VAR = "RETHOOK_ENGINE"
#: What ``RETHOOK_ENGINE`` names the pure-Python engine by (the registry reads it too).
PURE_NAMES = ("python", "py", "pure")
_C = ("c", "ccore", "native")

try:
    from rethook.engine import _ccore
except ImportError as e:  # not built (optional extension), or built for another interpreter
    _ccore = None
    C_CORE_ERROR: str | None = f"{type(e).__name__}: {e}"
else:
    C_CORE_ERROR = None


def c_core_available() -> bool:
    """True when the C core imported (it was built for this interpreter)."""
    return _ccore is not None


if _ccore is not None:

    class CCore(_core.PyCore):
        """The C core behind :class:`~rethook.engine.core.PyCore`'s interface.

        The six callbacks and the state only they read (dispatch table, max depth, sweeping
        flag, overflow hook) and the parked table are C. Everything else is core.py's own
        and shared: thread states (so ``core.notrace`` and the engine's ``busy`` writes work
        unchanged), the sweep lock, ``deliver``, ``handler_failed``, the counters.
        """

        name = "c"
        note = "C core (rethook.engine._ccore)"
        capabilities = Capabilities("c", direct_calls=True, native_users=True)

        _CALLBACKS = (
            ("PY_START", _ccore.on_start), ("PY_RETURN", _ccore.on_return),
            ("PY_UNWIND", _ccore.on_unwind), ("PY_YIELD", _ccore.on_yield),
            ("PY_RESUME", _ccore.on_resume), ("PY_THROW", _ccore.on_resume),
        )

        publish = staticmethod(_ccore.publish)
        _discovery_state = staticmethod(_ccore.set_discovery)
        set_max_depth = staticmethod(_ccore.set_max_depth)
        set_arm_known = staticmethod(_ccore.set_arm_known)
        set_fast_arm = staticmethod(_ccore.set_fast_arm)
        set_sweeping = staticmethod(_ccore.set_sweeping)
        set_overflow = staticmethod(_ccore.set_overflow)
        drain_wait = staticmethod(_ccore.drain_wait)
        drain_end = staticmethod(_ccore.drain_end)
        drain_wake = staticmethod(_ccore.drain_wake)
        drain_blocking = staticmethod(_ccore.drain_blocking)
        finished_frames = staticmethod(_ccore.finished_frames)
        close_parked = staticmethod(_ccore.close_parked)
        parked = staticmethod(_ccore.parked)  # (its own table: parktable.h)
else:
    CCore = None  # type: ignore[assignment,misc]


def available_cores() -> list[Capabilities]:
    """The cores this interpreter can run, the one ``choose_core()`` picks by default first:
    the tests' core matrix (the suite runs on each of them)."""
    cores = [_core.PyCore.capabilities]
    if CCore is not None:
        cores.insert(0, CCore.capabilities)
    return cores


def choose_core(prefer: str | None = None) -> HookCore:
    """A new core instance: ``prefer`` (``"c"``/``"python"``), else ``$RETHOOK_ENGINE``, else
    the C core when it is built, else the pure-Python core (whose ``note`` says why)."""
    want = (prefer or os.environ.get(ENV_VAR) or "").strip().lower()
    if want in PURE_NAMES:
        core = _core.PyCore()
        core.note = f"pure-Python core (asked for by {'prefer' if prefer else ENV_VAR})"
        return core
    if want and want not in _C and want != "auto":
        raise ValueError(f"unknown rethook engine {want!r} (from "
                         f"{'prefer' if prefer else ENV_VAR}): use 'c' or 'python'")
    if CCore is not None:
        return CCore()
    if want in _C:
        raise RuntimeError(f"the C core was asked for ({'prefer' if prefer else ENV_VAR}="
                           f"{want}) but it is not available: {C_CORE_ERROR}")
    core = _core.PyCore()
    core.note = f"pure-Python core (the C core is not built: {C_CORE_ERROR})"
    return core


def describe() -> str:
    """One line for ``--version``-style output: the core ``choose_core()`` would pick."""
    try:
        return choose_core().note
    except (RuntimeError, ValueError) as e:
        return str(e)


__all__ = ["CCore", "C_CORE_ERROR", "ENV_VAR", "PURE_NAMES", "available_cores", "c_core_available",
           "choose_core", "describe"]

if __name__ == "__main__":  # python -m rethook.engine.select
    print(describe())
    sys.exit(0)
