"""The trace clock: one clock for every timestamp of a trace, from C and from Python.

``now_ns()`` is CLOCK_MONOTONIC in nanoseconds (``time.perf_counter_ns()``'s clock on Linux).
When the ``_clock`` extension is built and the kernel keeps time with an invariant TSC, it
reads the TSC scaled onto CLOCK_MONOTONIC, which costs half as much per reading; the C core
and the native users read the same calibration (engine/clock.h explains it). Every Python
writer of events stamps them with ``now_ns`` too, so events merge in the order they happened.
``RETHOOK_CLOCK=monotonic`` forces the system clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

try:
    from rethook.engine import _clock
except ImportError as e:  # not built: the system clock, which is the same clock
    now_ns: Callable[[], int] = time.perf_counter_ns
    source = "monotonic"
    why = f"the clock extension is not built ({e})"
else:
    now_ns = _clock.now
    source = _clock.source()
    why = _clock.why()


def note() -> str:
    """One line for ``rethook --version``."""
    return f"clock: {source} ({why})"
