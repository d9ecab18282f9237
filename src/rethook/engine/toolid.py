"""Claiming one ``sys.monitoring`` tool id for every rethook user.

CPython has six tool ids. By convention 0 is the debugger, 1 coverage, 2 the profiler and 5 the
optimizer; 3 and 4 are unassigned. rethook takes one id for all of its users (that is the point
of a shared hook) and never one that another tool holds. It prefers the unassigned ids and only
falls back to a conventional id that is free, so that a debugger or profiler started later is the
one that has to look elsewhere as rarely as possible.
"""

from __future__ import annotations

import sys

TOOL_NAME = "rethook"
#: The order in which ids are tried: unassigned first, then conventional ids nobody holds.
PREFERENCE = (4, 3, 5, 0, 2, 1)
CONVENTIONAL = {0: "debugger", 1: "coverage", 2: "profiler", 5: "optimizer"}


class ToolIdError(RuntimeError):
    """No ``sys.monitoring`` tool id is free."""


def holders() -> dict[int, str | None]:
    """Which tool holds each id (``None`` when free)."""
    return {i: sys.monitoring.get_tool(i) for i in range(6)}


def acquire(preference: tuple[int, ...] = PREFERENCE) -> int:
    """Claim a free tool id for rethook and return it; explain who holds them if none is free."""
    for tool_id in preference:
        if sys.monitoring.get_tool(tool_id) is None:
            try:
                sys.monitoring.use_tool_id(tool_id, TOOL_NAME)
            except ValueError:  # taken between the check and the claim
                continue
            return tool_id
    raise _none_free()


def require_free() -> None:
    """Raise :class:`ToolIdError` now if no id is free (a command checks before it starts
    anything, rather than fail half-way through setting up)."""
    if all(name is not None for name in holders().values()):
        raise _none_free()


def _none_free() -> ToolIdError:
    held = ", ".join(f"{i}: {name!r}" for i, name in holders().items())
    return ToolIdError(
        "rethook needs one sys.monitoring tool id and all six are in use "
        f"({held}); stop one of those tools (or call sys.monitoring.free_tool_id) first"
    )


def release(tool_id: int) -> None:
    """Give the id back (only if rethook still holds it)."""
    if sys.monitoring.get_tool(tool_id) == TOOL_NAME:
        sys.monitoring.free_tool_id(tool_id)
