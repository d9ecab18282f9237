"""``rethook record`` of a call-heavy program whose work runs in child processes (a fork pool
and a spawned Python): events recorded and lost at the default settings, and the wall time
against the untraced run, interleaved, medians of repeats.

    python bench/bench_children.py [--repeat N] [--n FIB_N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROGRAM = '''
import multiprocessing, subprocess, sys

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

if __name__ == "__main__":
    n = int(sys.argv[1])
    if sys.argv[2:] == ["child"]:
        print(fib(n))
    else:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            print(sum(pool.map(fib, [n] * 4)))
        subprocess.run([sys.executable, __file__, str(n), "child"], check=True)
'''


def fib_calls(n: int) -> int:
    return 1 if n < 2 else 1 + fib_calls(n - 1) + fib_calls(n - 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--n", type=int, default=22)
    parser.add_argument("--quick", action="store_true", help="fib(18), one run")
    args = parser.parse_args()
    if args.quick:
        args.n, args.repeat = 18, 1
    from rethook.buffer.traceread import TraceReader

    with tempfile.TemporaryDirectory() as tmp:
        prog = os.path.join(tmp, "prog.py")
        with open(prog, "w") as f:
            f.write(PROGRAM)
        out = os.path.join(tmp, "t.dat")
        plain_t, traced_t = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            subprocess.run([sys.executable, prog, str(args.n)], check=True, capture_output=True)
            plain_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "rethook", "record", "-o", out, prog,
                            str(args.n)], check=True, capture_output=True)
            traced_t.append(time.perf_counter() - t)
        with TraceReader(out) as reader:
            lost = sum(s.get("lost", 0) for s in reader.stats.values())
            written = sum(1 for _ in reader.events())
            processes = len(reader.processes)
        expected = 5 * 2 * fib_calls(args.n)  # an entry and an exit per call
    ratio = statistics.median(traced_t) / statistics.median(plain_t)
    print(f"children: fib({args.n}) x4 in a fork pool + one spawned Python: {processes} "
          f"processes, {written:,} of {expected:,} events in the trace, {lost:,} counted lost; "
          f"record / untraced wall time {ratio:.2f}x (median of {args.repeat})")


if __name__ == "__main__":
    main()
