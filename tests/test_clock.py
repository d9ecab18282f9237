"""The trace clock (rethook.engine.clock, engine/clock.h): one clock for C and Python."""

import os
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_calibration_ends_at_the_first_reading():
    """Importing the clock takes the calibration's first pair and does not wait; the first
    reading (here the C core's) ends it, over the whole interval since the import (30 ms of
    sleep here) and never less than 5 ms; C and Python then read one clock."""
    pytest.importorskip("rethook.engine._clock")
    code = ("import time; from rethook.engine import _clock, _ccore; time.sleep(0.03); "
            "a = _ccore.now(); b = _clock.now(); c = _ccore.now(); "
            "print(_clock.source(), _clock.why(), a <= b <= c)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    if not out.startswith("tsc "):
        pytest.skip(f"the TSC is not used here: {out.strip()}")
    ms = float(out.split("calibrated over ")[1].split(" ms")[0])
    assert ms >= 30.0
    assert out.split()[-1] == "True"


@given(st.floats(min_value=-2e9, max_value=4e9, allow_nan=False))
@settings(max_examples=300, deadline=None)
def test_local_iso_is_what_datetime_writes(t):
    """The trace's start_time_iso, written without importing datetime, is datetime's own."""
    import datetime

    from rethook.engine.clock import local_iso

    want = datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")
    assert local_iso(t) == want
