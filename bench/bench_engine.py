"""Engine overhead, as ratios against the untraced run in the same process.

    .venv/bin/python bench/bench_engine.py [--repeat N] [--quick]

Workloads (bench/workloads.py): (a) a call storm, (b) mixed object-oriented code, (c) a
sparse one where one function is called ~1000 times among millions of untraced calls.
Configurations: one no-op graph user on every function of (a); five no-op users; a
kretprobe on (c)'s target fetching two arguments and the return value. Every figure is the
median of N runs, untraced and traced runs interleaved so machine noise hits both.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import workloads  # noqa: E402
from rethook.engine.engine import FgraphOps, get_engine  # noqa: E402
from rethook.probes import Kretprobe  # noqa: E402

MOD = "*:mod:workloads"


class NoOp(FgraphOps):
    """A graph user that accepts every call and does nothing (no frame, no time)."""

    wants_frame = False
    wants_time = False

    def entryfunc(self, code, frame, depth, t):
        return True

    def retfunc(self, code, frame, depth, data, retval, exc, t0, t1, sleep, flags):
        pass


def timed(fn, *args) -> float:
    gc.collect()
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def compare(label, fn, args, setup, teardown, repeat, calls=None) -> dict:
    base, traced = [], []
    for _ in range(repeat):
        base.append(timed(fn, *args))
        setup()
        try:
            traced.append(timed(fn, *args))
        finally:
            teardown()
    b, t = statistics.median(base), statistics.median(traced)
    row = {"label": label, "base_s": b, "traced_s": t, "ratio": t / b}
    if calls:
        row["ns_per_call"] = (t - b) / calls * 1e9
    extra = f"  {row['ns_per_call']:7.0f} ns/call" if calls else ""
    print(f"{label:46s} base {b:7.3f}s  traced {t:7.3f}s  ratio {t / b:6.3f}x{extra}",
          flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smaller workloads (fib 27)")
    args = ap.parse_args()
    engine = get_engine()
    n = 27 if args.quick else 33
    calls = workloads.fib_calls(n)
    print(f"engine: {engine.core.name}; Python {sys.version.split()[0]}; "
          f"(a) fib({n}) = {calls:,} calls; median of {args.repeat}")

    users: list[FgraphOps] = []

    def add(k: int):
        def setup():
            for _ in range(k):
                u = NoOp(filter="fib")
                engine.register_ftrace_graph(u)
                users.append(u)
        return setup

    def drop():
        while users:
            engine.unregister_ftrace_graph(users.pop())

    one = compare("(a) 1 no-op graph user", workloads.run_calls, (n,), add(1), drop,
                  args.repeat, calls)
    five = compare("(a) 5 no-op graph users", workloads.run_calls, (n,), add(5), drop,
                   args.repeat, calls)
    print(f"    five users cost {five['ns_per_call'] / one['ns_per_call']:.2f}x one user's "
          "overhead")
    compare("(b) 1 no-op graph user on every function", workloads.run_mixed, (), (
        lambda: (users.append(NoOp(filter=MOD)), engine.register_ftrace_graph(users[-1]))),
        drop, args.repeat)

    captured = []
    probe: list[Kretprobe] = []

    def probe_on():
        def entry(ri, frame):
            ri.data["key"] = frame.f_locals["key"]
            ri.data["values"] = frame.f_locals["values"]

        rp = Kretprobe("workloads.target", entry_handler=entry,
                       handler=lambda ri, v: captured.append((ri.data["key"], v)))
        rp.register()
        probe.append(rp)

    def probe_off():
        probe.pop().unregister()

    compare("(c) kretprobe on target (2 args + retval)", workloads.run_sparse, (), probe_on,
            probe_off, args.repeat)
    assert len(captured) == 1000 * args.repeat


if __name__ == "__main__":
    main()
