"""The control channel: what listening costs while nobody is connected, and how long
``rethook record -P`` takes to see a running program's first event.

    .venv/bin/python bench/bench_control.py [--repeat N] [--quick]

1. In process: the call-heavy and mixed workloads with the channel listening (and idle)
   against the same workloads without it, interleaved, medians of N (``rethook.control.listen``).
2. Whole program: the workloads timed by the program itself, run by ``python`` and by
   ``rethook run`` (channel open, nothing traced) alternately, medians of N.
3. Attach latency: a program under ``rethook run`` calls a function in a loop; from launching
   ``rethook record -P PID -l FUNC`` to its "recording" line (hooks live), and to the first
   event's timestamp in the trace (the trace clock is CLOCK_MONOTONIC), medians of N.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import workloads  # noqa: E402
from bench_engine import compare  # noqa: E402
from rethook.buffer.traceread import TraceReader  # noqa: E402
from rethook.control import channel, directory  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))

WHOLE = """\
import sys, time
sys.path.insert(0, {bench!r})
import workloads
t0 = time.perf_counter(); workloads.run_calls({n}); t1 = time.perf_counter()
workloads.run_mixed(); t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""

LOOP = """\
import sys, time
def target(i):
    return i + 1
print("up", flush=True)
i = 0
while not sys.stdin.closed:
    target(i)
    i += 1
    if i % 1000 == 0:
        time.sleep(0.001)
"""


def in_process(repeat: int, n: int) -> None:
    state: dict = {}

    def on() -> None:
        state["ch"] = channel.listen()

    def off() -> None:
        state.pop("ch").close()

    compare(f"(a) fib({n}), channel idle", workloads.run_calls, (n,), on, off, repeat,
            workloads.fib_calls(n))
    compare("(b) mixed, channel idle", workloads.run_mixed, (), on, off, repeat)


def whole_program(repeat: int, n: int, tmp: str) -> None:
    prog = os.path.join(tmp, "whole.py")
    with open(prog, "w") as f:
        f.write(WHOLE.format(bench=BENCH, n=n))
    plain: list[tuple[float, float]] = []
    run: list[tuple[float, float]] = []
    for _ in range(repeat):
        for cmd, out in (([sys.executable, prog], plain),
                         ([sys.executable, "-m", "rethook", "run", prog], run)):
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            a, b = map(float, done.stdout.split())
            out.append((a, b))
    for i, label in enumerate((f"(a) fib({n})", "(b) mixed")):
        base = statistics.median(t[i] for t in plain)
        ran = statistics.median(t[i] for t in run)
        print(f"{label + ', under rethook run (idle)':46s} base {base:7.3f}s  run    "
              f"{ran:7.3f}s  ratio {ran / base:6.3f}x", flush=True)


def attach_latency(repeat: int, tmp: str) -> None:
    prog = os.path.join(tmp, "loop.py")
    with open(prog, "w") as f:
        f.write(LOOP)
    target = subprocess.Popen([sys.executable, "-m", "rethook", "run", prog],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        target.stdout.readline()
        while directory.find(target.pid) is None:
            time.sleep(0.01)
        live, first = [], []
        for i in range(repeat):
            out = os.path.join(tmp, f"t{i}.dat")
            t0 = time.monotonic_ns()
            rec = subprocess.Popen([sys.executable, "-m", "rethook", "record", "-P",
                                    str(target.pid), "-l", "target", "-o", out],
                                   stderr=subprocess.PIPE, text=True)
            rec.stderr.readline()
            live.append((time.monotonic_ns() - t0) / 1e6)
            time.sleep(0.2)
            rec.send_signal(signal.SIGINT)
            rec.communicate()
            with TraceReader(out) as reader:
                ts = next(iter(reader.events()))[1]
            first.append((ts - t0) / 1e6)
        print(f"record -P: launch to hooks live (median)     {statistics.median(live):7.1f} ms")
        print(f"record -P: launch to the first event (median) {statistics.median(first):7.1f} ms")
    finally:
        target.communicate("")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="smaller workloads (fib 27)")
    args = ap.parse_args()
    n = 27 if args.quick else 30
    print(f"Python {sys.version.split()[0]}; median of {args.repeat}, interleaved")
    tmp = tempfile.mkdtemp(prefix="rh", dir="/tmp")
    os.environ[directory.ENV_DIR] = os.path.join(tmp, "ctl")
    try:
        in_process(args.repeat, n)
        whole_program(args.repeat, n, tmp)
        attach_latency(args.repeat, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
