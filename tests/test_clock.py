"""The trace clock (rethook.engine.clock, engine/clock.h): one clock for C and Python."""

import os
import subprocess
import sys
import threading
import time

import pytest

from rethook.engine import clock


def test_source_is_named_and_explained():
    assert clock.source in ("tsc", "monotonic")
    assert clock.note().startswith(f"clock: {clock.source} (")
    if clock.source == "tsc":
        assert "clocksource is tsc" in clock.why


def test_never_goes_back_in_one_thread():
    readings = [clock.now_ns() for _ in range(100_000)]
    assert readings == sorted(readings)


def test_never_goes_back_across_threads():
    """A reading taken after another thread's (ordered by a lock) is never earlier."""
    lock = threading.Lock()
    last = [clock.now_ns()]
    bad = []

    def work():
        for _ in range(5_000):
            with lock:
                t = clock.now_ns()
                if t < last[0]:
                    bad.append((last[0], t))
                last[0] = t

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


def test_is_on_the_monotonic_clock_scale():
    """The TSC is scaled onto CLOCK_MONOTONIC: readings land near perf_counter_ns()'s, not
    on some other origin (seconds since boot are printed from them)."""
    t = clock.now_ns()
    mono = time.perf_counter_ns()
    assert abs(t - mono) < 60 * 10**9  # the same origin; drift is ppm, not minutes


def test_environment_forces_the_system_clock():
    pytest.importorskip("rethook.engine._clock")
    code = ("import time; from rethook.engine import clock; "
            "a = time.perf_counter_ns(); b = clock.now_ns(); c = time.perf_counter_ns(); "
            "print(clock.source, clock.why, a <= b <= c)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "RETHOOK_CLOCK": "monotonic"}, check=True)
    assert out.stdout.split() == ["monotonic", "RETHOOK_CLOCK=monotonic", "True"]
