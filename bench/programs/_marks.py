"""When the benchmarked program's own code starts and ends, for bench/peers.py.

The harness sets ``BENCH_MARKS`` to a file; :func:`mark` appends ``NAME WALLTIME`` to it. With
the harness's own spawn and exit times these split a run into start-up (the tool's and the
interpreter's), the program's run, and finish (writing the trace, exit). Without the
variable nothing is written.
"""

import os
import time

_PATH = os.environ.get("BENCH_MARKS")


def mark(name: str) -> None:
    if _PATH:
        with open(_PATH, "a") as f:
            f.write(f"{name} {time.time():.6f}\n")
