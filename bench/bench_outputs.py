"""Benchmark reading traces back: ``report``, every ``export`` format, and ``info``, per event.

Records a function_graph trace of a call storm with ``rethook record`` (fib(N): 2 events a
call, one thread, the default options), then times, in this process, what the commands do
with it: ``report`` rendered to /dev/null, each export written to a temporary file, ``info``.
Each is measured against reading the events alone (``TraceReader.events()``, which every one
of them does once or twice), interleaved, medians of the repeats: the table gives ns per
event and the ratio to one reading pass.

    python bench/bench_outputs.py [--fib N] [--repeat R]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

from rethook.buffer.traceread import TraceReader
from rethook.cli.reporting import export_file, report_file
from rethook.cli.summaries import info_file

PROGRAM = """
import sys
sys.setrecursionlimit(10000)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
fib({n})
"""


def record(n: int, workdir: str) -> str:
    prog = os.path.join(workdir, "storm.py")
    with open(prog, "w") as f:
        f.write(PROGRAM.format(n=n))
    trace = os.path.join(workdir, "storm.dat")
    r = subprocess.run([sys.executable, "-m", "rethook", "record", "-o", trace, prog],
                       capture_output=True, text=True, check=True)
    print(r.stderr.strip())
    return trace


def read_only(path: str) -> None:
    with TraceReader(path) as reader:
        for _ in reader.events(lost=True):
            pass


def quietly(fn, *args) -> int:
    """Run a command's function with its stdout and stderr thrown away."""
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = io.StringIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args)
    finally:
        sys.stdout, sys.stderr = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fib", type=int, default=23, help="fib(N) is recorded (default 23)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fib(20), 3 runs")
    args = ap.parse_args()
    if args.quick:
        args.fib, args.repeat = 20, 3
    with tempfile.TemporaryDirectory() as tmp:
        trace = record(args.fib, tmp)
        with TraceReader(trace) as reader:
            events = reader.event_count
        out = os.path.join(tmp, "out")
        devnull = open(os.devnull, "w")  # noqa: SIM115 - closed below
        commands = {
            "report": lambda: quietly(report_file, trace, (), devnull),
            "info": lambda: quietly(info_file, trace, False),
            **{f"export {fmt}": (lambda fmt=fmt: quietly(export_file, trace, fmt, out))
               for fmt in ("perfetto", "chrome", "speedscope", "folded", "pstats")},
        }
        times: dict[str, list[float]] = {name: [] for name in ("read", *commands)}
        for _ in range(args.repeat):
            for name, fn in (("read", lambda: read_only(trace)), *commands.items()):
                t0 = time.perf_counter()
                status = fn()
                times[name].append(time.perf_counter() - t0)
                assert not status, (name, status)
        devnull.close()
    read = statistics.median(times["read"])
    print(f"\n{events:,} events (fib({args.fib}), function_graph), median of {args.repeat}, "
          f"interleaved; CPython {sys.version.split()[0]}")
    print(f"{'what':<20} {'s':>8} {'ns/event':>9} {'x read':>7}")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"{name:<20} {t:8.3f} {t / events * 1e9:9.0f} {t / read:7.2f}")


if __name__ == "__main__":
    main()
