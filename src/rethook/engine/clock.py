"""The trace clock: one clock for every timestamp of a trace, from C and from Python.

``now_ns()`` is CLOCK_MONOTONIC in nanoseconds (``time.perf_counter_ns()``'s clock on Linux).
When the ``_clock`` extension is built and the kernel keeps time with an invariant TSC, it
reads the TSC scaled onto CLOCK_MONOTONIC, which costs half as much per reading; the C core
and the native users read the same calibration (engine/clock.h explains it). Every Python
writer of events stamps them with ``now_ns`` too, so events merge in the order they happened.
``RETHOOK_CLOCK=monotonic`` forces the system clock.

:func:`local_iso` writes a wall-clock time (``time.time()``) as the trace's metadata shows it;
:func:`start_times` is a trace's two META keys for when it started.

The calibration ends at the first reading (or when ``source`` or ``why`` is asked for), not
at import: importing this module costs no wait.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

try:
    from rethook.engine import _clock
except ImportError as e:  # not built: the system clock, which is the same clock
    _clock = None
    now_ns: Callable[[], int] = time.perf_counter_ns
    _not_built = f"the clock extension is not built ({e})"
else:
    now_ns = _clock.now


def __getattr__(name: str) -> Any:
    """``source`` ("tsc" or "monotonic") and ``why`` (the reason for it)."""
    if name == "source":
        return _clock.source() if _clock is not None else "monotonic"
    if name == "why":
        return _clock.why() if _clock is not None else _not_built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def note() -> str:
    """One line for ``rethook --version``."""
    return f"clock: {__getattr__('source')} ({__getattr__('why')})"


def start_times(t: float | None = None) -> dict[str, Any]:
    """A trace's META ``start_time`` (``t``, or now: seconds since the epoch) and
    ``start_time_iso`` (:func:`local_iso` of it)."""
    if t is None:
        t = time.time()
    return {"start_time": t, "start_time_iso": local_iso(t)}


def local_iso(t: float) -> str:
    """The wall-clock time ``t`` (seconds since the epoch) in local time, ISO 8601 to the
    second with its UTC offset: ``datetime.fromtimestamp(t).astimezone()
    .isoformat(timespec="seconds")``, without importing datetime (a C extension, ~1 ms of
    every start)."""
    whole = int(t)  # datetime's rounding: to the microsecond (half even), then truncated
    us = round((t - whole) * 1e6)
    if us >= 1_000_000:
        whole += 1
    elif us < 0:
        whole -= 1
    lt = time.localtime(whole)
    off = lt.tm_gmtoff
    sign = "-" if off < 0 else "+"
    off = abs(off)
    zone = f"{sign}{off // 3600:02d}:{off % 3600 // 60:02d}" + (f":{off % 60:02d}" if off % 60
                                                                 else "")
    return time.strftime("%Y-%m-%dT%H:%M:%S", lt) + zone
