"""Tracer overhead, as ratios against the untraced run in the same process.

    .venv/bin/python bench/bench_tracers.py [--repeat N] [--quick]

function_graph (recording every call into the ring buffer) on the call-heavy workload and on
generator expressions (per event: entry, suspend, resume, exit), and the function profiler
against cProfile on the mixed workload, each the median of N runs with the untraced run
interleaved.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import workloads  # noqa: E402
from bench_engine import compare  # noqa: E402
from rethook.control import Tracefs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smaller workloads")
    args = ap.parse_args()
    n = 25 if args.quick else 30
    calls = workloads.fib_calls(n)
    print(f"Python {sys.version.split()[0]}; (a) fib({n}) = {calls:,} calls; "
          f"median of {args.repeat}")
    state: dict = {}

    def graph_on(native_users: bool = True, functions: str = "workloads.fib"):
        fs = state["fs"] = Tracefs()
        fs.ctx.native_users = native_users
        fs.write("buffer_size_kb", "65536")
        fs.write("set_ftrace_filter", functions)
        fs.write("current_tracer", "function_graph")
        state["users"] = type(fs.tracer.ops).__name__

    def graph_off():
        fs = state.pop("fs")
        fs.close()
        held = fs.ctx.buffer.totals()
        state["events"] = held.written

    compare("(a) function_graph, every call recorded", workloads.run_calls, (n,), graph_on,
            graph_off, args.repeat, calls)
    print(f"    users: {state['users']}; events written per run: {state['events']:,} "
          f"(2 per call)")
    if state["users"] != "GraphOps":  # the native user ran: show the Python one beside it
        compare("(a) function_graph, Python users", workloads.run_calls, (n,),
                lambda: graph_on(False), graph_off, args.repeat, calls)

    rounds = 50_000 if args.quick else 200_000
    events = rounds * workloads.GENERATOR_EVENTS
    compare("(a) function_graph, generator events", workloads.run_generators, (rounds,),
            lambda: graph_on(functions="workloads.run_generators*"), graph_off, args.repeat,
            events)
    print(f"    {rounds:,} generator expressions, {events:,} events (ns/call: per event)")

    def prof_on(native_users: bool = True):
        fs = state["fs"] = Tracefs()
        fs.ctx.native_users = native_users
        fs.write("set_ftrace_filter", "*:mod:workloads")
        fs.write("function_profile_enabled", "1")

    def prof_off():
        state.pop("fs").close()

    rethook_row = compare("(b) function profiler", workloads.run_mixed, (), prof_on, prof_off,
                          args.repeat)

    def cprof_on():
        state["cp"] = cProfile.Profile()
        state["cp"].enable()

    def cprof_off():
        state.pop("cp").disable()

    cprof_row = compare("(b) cProfile", workloads.run_mixed, (), cprof_on, cprof_off,
                        args.repeat)
    print(f"    profiler overhead / cProfile overhead: "
          f"{(rethook_row['ratio'] - 1) / (cprof_row['ratio'] - 1):.2f}")
    python_row = compare("(b) function profiler, Python users", workloads.run_mixed, (),
                         lambda: prof_on(False), prof_off, args.repeat)
    print(f"    Python users' overhead / cProfile overhead: "
          f"{(python_row['ratio'] - 1) / (cprof_row['ratio'] - 1):.2f}")


if __name__ == "__main__":
    main()
