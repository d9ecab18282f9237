"""Probe-event overhead, as ratios against the untraced run in the same process.

    .venv/bin/python bench/bench_probes.py [--repeat N]

(c) the sparse workload with an ``r:`` probe on its target fetching two arguments and
``$retval`` (the event recorded into the trace buffer), and the cost of one probe hit: the
target called in a tight loop with and without the probe, divided by the number of calls.
Medians of N interleaved runs.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import workloads  # noqa: E402
from bench_engine import compare  # noqa: E402
from rethook.control import Tracefs  # noqa: E402

PROBE = "r:target workloads.target key:string values:len ret=$retval:s64"


def hammer(n: int) -> int:
    total = 0
    target = workloads.target
    for i in range(n):
        total += target("k", [i])
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 runs")
    args = ap.parse_args()
    if args.quick:
        args.repeat = 3
    print(f"Python {sys.version.split()[0]}; probe: {PROBE!r}; median of {args.repeat}")
    state: dict = {}

    def on():
        fs = state["fs"] = Tracefs()
        fs.write("buffer_size_kb", "16384")
        fs.write("dynamic_events", PROBE, append=True)
        fs.write("events/kprobes/target/enable", "1")

    def off():
        fs = state.pop("fs")
        state["hits"] = int(fs.read("kprobe_profile").split()[1])
        state["recorded"] = fs.ctx.buffer.totals().written
        fs.close()

    compare("(c) sparse workload, r: probe on its target", workloads.run_sparse, (), on, off,
            args.repeat)
    print(f"    probe hits per run: {state['hits']:,}; events recorded: {state['recorded']:,}")
    n = 100_000
    row = compare("probe hit cost (target in a loop)", hammer, (n,), on, off, args.repeat,
                  calls=n)
    print(f"    one probe hit (fetch 2 args + $retval, record): {row['ns_per_call'] / 1000:.2f} us")


if __name__ == "__main__":
    main()
