"""In-run cost per call of the native recorders against the floor and trace0, same process.

    .venv/bin/python bench/bench_percall.py [--repeat N] [--n FIB]

Every configuration runs the call storm (fib) with the untraced run interleaved; the figure is
(traced - untraced) / calls, medians of N. The floor is a no-op C ``sys.monitoring`` callback
pair (PY_START + PY_RETURN, the C core's ``ignore``) on the same function: what any recorder
built on ``sys.monitoring`` pays before it does anything. trace0 (``pip install trace0``, a
benchmark-only peer) is timed inside its ``with`` block, so its start and finish are not in
the figure, as ours are not. Each configuration runs the storm once untimed before the timed
run: the per-call cost in a steady state, not the first pass through a fresh buffer (memory
the machine has not touched costs ~2 us a 4 KB page here: a 64 MB ring's first lap alone
would add ~50 ns a call; ``rethook record`` pages its rings in on the drain's thread). Times
are the calling thread's CPU time (``time.thread_time``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import workloads  # noqa: E402
from rethook.control import Tracefs  # noqa: E402


def timed(fn, *args) -> float:
    """CPU seconds of the calling thread: on a shared machine, time spent descheduled is not
    the tracer's (a peer's writer thread on the other core is not counted either)."""
    gc.collect()
    t = time.thread_time()
    fn(*args)
    return time.thread_time() - t


def floor_on() -> None:
    from rethook.engine import _ccore

    mon = sys.monitoring
    tool = 4
    mon.use_tool_id(tool, "bench-floor")
    mon.register_callback(tool, mon.events.PY_START, _ccore.ignore)
    mon.register_callback(tool, mon.events.PY_RETURN, _ccore.ignore)
    mon.set_local_events(tool, workloads.fib.__code__,
                         mon.events.PY_START | mon.events.PY_RETURN)


def floor_off() -> None:
    mon = sys.monitoring
    mon.set_local_events(4, workloads.fib.__code__, 0)
    mon.register_callback(4, mon.events.PY_START, None)
    mon.register_callback(4, mon.events.PY_RETURN, None)
    mon.free_tool_id(4)


def rethook_run(tracer: str):
    state: dict = {}

    def on() -> None:
        fs = state["fs"] = Tracefs()
        fs.write("buffer_size_kb", "65536")
        fs.write("set_ftrace_filter", "workloads.fib")
        fs.write("current_tracer", tracer)
        state["ops"] = type(fs.tracer.ops).__name__

    def off() -> None:
        state.pop("fs").close()

    return on, off, state


def trace0_time(n: int) -> float:
    import trace0

    with tempfile.TemporaryDirectory() as d:
        with trace0.Tracer(os.path.join(d, "t.pftrace")):
            workloads.run_calls(n)  # (untimed: its buffers' first use)
            return timed(workloads.run_calls, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--n", type=int, default=27)
    ap.add_argument("--only", default="", help="comma-separated subset of the rows")
    ap.add_argument("--quick", action="store_true", help="fib(24), 3 rounds")
    args = ap.parse_args()
    if args.quick:
        args.n, args.repeat = 24, 3
    n = args.n
    calls = workloads.fib_calls(n)
    rows: dict[str, tuple] = {"floor": (floor_on, floor_off)}
    for tracer in ("function_graph", "function"):
        on, off, _ = rethook_run(tracer)
        rows[tracer] = (on, off)
    try:
        import trace0  # noqa: F401
    except ImportError:
        print("trace0 is not installed (pip install trace0): its row is skipped")
    else:
        rows["trace0"] = None
    if args.only:
        rows = {k: v for k, v in rows.items() if k in args.only.split(",")}
    base: list[float] = []
    traced: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.repeat):  # interleaved: every configuration once per round
        for name, hooks in rows.items():
            base.append(timed(workloads.run_calls, n))
            if hooks is None:
                traced[name].append(trace0_time(n))
                continue
            hooks[0]()
            try:
                workloads.run_calls(n)  # (untimed: the ring's first lap)
                traced[name].append(timed(workloads.run_calls, n))
            finally:
                hooks[1]()
    b = statistics.median(base)
    print(f"Python {sys.version.split()[0]}; fib({n}) = {calls:,} calls; untraced "
          f"{b * 1e9 / calls:.1f} ns/call; median of {args.repeat}, interleaved")
    per = {k: (statistics.median(v) - b) / calls * 1e9 for k, v in traced.items()}
    for name, ns in per.items():
        rel = f"  {ns / per['floor']:5.2f}x floor" if "floor" in per else ""
        print(f"  {name:16s} {ns:7.1f} ns/call{rel}")


if __name__ == "__main__":
    main()
