"""When the benchmarked program's own code starts and ends, for bench/peers.py.

The harness sets ``BENCH_MARKS`` to a file; :func:`mark` appends ``NAME WALLTIME THREADCPU``
to it (the CPU time of the thread that marks). With the harness's own spawn and exit times
these split a run into start-up (the tool's and the interpreter's), the program's run, and
finish (writing the trace, exit); the thread's CPU time against the wall time between two
marks says how long it waited (for the GIL, or blocked). Without the variable nothing is
written.
"""

import os
import time

_PATH = os.environ.get("BENCH_MARKS")


def mark(name: str) -> None:
    if _PATH:
        with open(_PATH, "a") as f:
            f.write(f"{name} {time.time():.6f} {time.thread_time():.6f}\n")
