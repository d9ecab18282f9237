"""Benchmark the trace file writer (and the ring buffer's append) in pure Python.

Writes one million function_graph-like events (entry/exit pairs from 4 threads,
300 distinct function names, nested depths) to a temporary trace file, several
times, and prints the median time, events/s and bytes/event; then reads the file
back once to time the reader. The ring buffer part measures the per-event cost of
a cached ``ThreadBuffer.append`` in overwrite mode and in a full non-overwrite
buffer, against an empty loop.

Requirement checked here (not in the tests): writing 1M events takes <= 0.5 s.

Then the writer's per-event cost on a recorded function_graph trace (fib(25): entry and exit
events alternating, what ``rethook record`` drains), with the C column encoder
(rethook.buffer._tfenc) and with the pure-Python encoder, alternating, median of the runs.

Last, the drain cost per native record: a ring of function_graph records (the native user,
fib(22): ~115k records, under the default 8 MB of ``rethook record``) drained in one round
into a trace file in memory, by the fused path (records encoded in C straight from the ring,
TraceWriter.write_native) and by the tuple path (Ring.consume's event tuples, then
write_events).

    python bench/bench_tracefile.py [--events N] [--repeat R]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import sys
import tempfile
import time

from rethook.buffer import tracefile
from rethook.buffer.events import FormatRegistry
from rethook.buffer.ring import TraceBuffer
from rethook.buffer.tracefile import TraceWriter
from rethook.buffer.traceread import TraceReader

WRITE_BUDGET_SECONDS = 0.5
THREADS = 4
FUNCTIONS = 300


def make_events(n: int) -> tuple[FormatRegistry, list[tuple]]:
    """Entry/exit pairs of nested calls on 4 threads, merged in timestamp order."""
    rng = random.Random(42)
    reg = FormatRegistry()
    entry = reg.register("funcgraph_entry", ["depth:u64", "func:str"])
    exit_ = reg.register(
        "funcgraph_exit",
        ["depth:u64", "func:str", "calltime:u64", "overrun:u64", "flags:u64", "retval:str"],
    )
    names = [f"pkg.module_{i % 17}.function_{i}" for i in range(FUNCTIONS)]
    retvals = ["None", "0", "1", "True", "False", "''", "[]"]
    ts = time.perf_counter_ns()
    stacks: list[list[tuple[str, int]]] = [[] for _ in range(THREADS)]
    tids = [100_000 + 17 * t for t in range(THREADS)]
    events: list[tuple] = []
    while len(events) < n:
        t = rng.randrange(THREADS)
        stack = stacks[t]
        ts += rng.randrange(40, 400)
        if stack and (len(stack) > 12 or rng.random() < 0.5):
            func, start = stack.pop()
            events.append(
                (exit_.id, ts, tids[t], len(stack), func, start, 0, 0, rng.choice(retvals))
            )
        else:
            func = rng.choice(names)
            events.append((entry.id, ts, tids[t], len(stack), func))
            stack.append((func, ts))
    return reg, events


def bench_write(reg: FormatRegistry, events: list[tuple], repeat: int, path: str) -> list[float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with TraceWriter(path, {"tracer": "function_graph"}, formats=reg) as w:
            for i in range(THREADS):
                w.set_thread_name(100_000 + 17 * i, f"worker-{i}")
            w.write_events(events)
        times.append(time.perf_counter() - t0)
    return times


def bench_read(path: str) -> float:
    t0 = time.perf_counter()
    count = sum(1 for _ in TraceReader(path).events())
    elapsed = time.perf_counter() - t0
    assert count > 0
    return elapsed


def per_append_ns(overwrite: bool, n: int, repeat: int) -> float:
    tb = TraceBuffer(overwrite=overwrite)
    buf = tb.local()
    append = buf.append
    event = (0, 1, buf.tid, 3, "f")
    results = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            append(event)
        t1 = time.perf_counter_ns()
        for _ in range(n):
            pass
        t2 = time.perf_counter_ns()
        results.append(((t1 - t0) - (t2 - t1)) / n)
    return statistics.median(results)


def local_ns(n: int, repeat: int) -> float:
    tb = TraceBuffer()
    tb.local()
    results = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            tb.local()
        t1 = time.perf_counter_ns()
        for _ in range(n):
            pass
        t2 = time.perf_counter_ns()
        results.append(((t1 - t0) - (t2 - t1)) / n)
    return statistics.median(results)


def record_function_graph(n: int) -> tuple[FormatRegistry, list]:
    """The events of a function_graph trace of workloads.fib(n), as the recorder drains them."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import workloads
    from rethook.control import Tracefs

    fs = Tracefs()
    try:
        fs.write("buffer_size_kb", "262144")
        fs.write("set_ftrace_filter", "workloads.fib")
        fs.write("current_tracer", "function_graph")
        workloads.run_calls(n)
        fs.write("tracing_on", "0")
        return fs.ctx.formats, fs.ctx.buffer._consume_all()
    finally:
        fs.close()


def encoder_ns(formats: FormatRegistry, items: list, repeat: int) -> tuple[float, float | None]:
    """Median ns/event of TraceWriter.write_events into memory: with the C column encoder
    (None when it is not built) and with the pure-Python one, runs alternating."""
    c_module = tracefile._tfenc
    results: dict[bool, list[float]] = {True: [], False: []}
    try:
        for _ in range(repeat):
            for use_c in (True, False) if c_module is not None else (False,):
                tracefile._tfenc = c_module if use_c else None
                writer = TraceWriter(io.BytesIO(), formats=formats)
                t0 = time.perf_counter()
                writer.write_events(items)
                results[use_c].append((time.perf_counter() - t0) / len(items) * 1e9)
    finally:
        tracefile._tfenc = c_module
    with_c = statistics.median(results[True]) if results[True] else None
    return statistics.median(results[False]), with_c


def drain_ns(n: int, repeat: int) -> tuple[float, float, int] | None:
    """Median ns per native record of one drain round of a function_graph trace of
    workloads.fib(n) held in the thread's C ring (a ring's worth: the default 8 MB of
    ``rethook record``), as the recorder drains it: the fused path (TracePipe.read_or_feed
    into TraceWriter.write_native, the records encoded in C) and the tuple path
    (TracePipe.read, then write_events), runs alternating. None without native users."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import workloads
    from rethook.control import Tracefs

    results: dict[bool, list[float]] = {True: [], False: []}
    records = 0
    for _ in range(repeat):
        for fused in (True, False):
            fs = Tracefs()
            try:
                fs.write("buffer_size_kb", "8192")
                fs.write("set_ftrace_filter", "workloads.fib")
                fs.write("current_tracer", "function_graph")
                if getattr(fs.tracer.ops, "native", None) is None:
                    return None  # the Python user: no ring
                workloads.run_calls(n)
                fs.write("tracing_on", "0")
                ring = fs.ctx.buffer.local().native
                records = ring.head - ring.floor
                writer = TraceWriter(io.BytesIO(), formats=fs.ctx.formats)
                pipe = fs.ctx.buffer.pipe()
                if fused:
                    writer.prepare_native(ring.capacity)  # as the recorder does
                t0 = time.perf_counter()
                if fused:
                    assert pipe.read_or_feed(0, writer.write_native) is None
                else:
                    writer.write_events(pipe.read(0))
                results[fused].append((time.perf_counter() - t0) / records * 1e9)
            finally:
                fs.close()
    return statistics.median(results[True]), statistics.median(results[False]), records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="200,000 events, 3 runs")
    args = parser.parse_args()
    if args.quick:
        args.events, args.repeat = 200_000, 3

    print(f"python {sys.version.split()[0]}")
    print("ring buffer, cached ThreadBuffer.append (median of 5 x 2M):")
    print(f"  overwrite=True            {per_append_ns(True, 2_000_000, 5):6.1f} ns/event")
    print(f"  overwrite=False, full     {per_append_ns(False, 2_000_000, 5):6.1f} ns/event")
    print(f"  TraceBuffer.local()       {local_ns(2_000_000, 5):6.1f} ns/call")

    reg, events = make_events(args.events)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.rhtrace")
        times = bench_write(reg, events, args.repeat, path)
        size = os.path.getsize(path)
        read_s = bench_read(path)
    median = statistics.median(times)
    n = len(events)
    print(f"trace file, {n} events, {args.repeat} runs:")
    print(f"  write median {median:.3f} s  (min {min(times):.3f}, max {max(times):.3f})")
    print(f"  {n / median / 1e6:.2f} M events/s, {size / n:.2f} bytes/event, {size} bytes")
    print(f"  read back    {read_s:.3f} s  ({n / read_s / 1e6:.2f} M events/s)")
    ok = median <= WRITE_BUDGET_SECONDS * n / 1_000_000
    print(f"  budget {WRITE_BUDGET_SECONDS} s per 1M events: {'OK' if ok else 'OVER'}")

    formats, items = record_function_graph(25)
    python_ns, c_ns = encoder_ns(formats, items, args.repeat)
    print(f"function_graph trace of fib(25), {len(items)} events, write to memory"
          f" (median of {args.repeat}):")
    if c_ns is None:
        print(f"  C encoder    not built; pure Python {python_ns:6.0f} ns/event")
    else:
        print(f"  C encoder    {c_ns:6.0f} ns/event  ({python_ns / c_ns:.1f}x)")
        print(f"  pure Python  {python_ns:6.0f} ns/event")

    drained = drain_ns(22, args.repeat)
    if drained is None:
        print("drain of native records: the native users are not running (C core and"
              " extensions needed)")
    else:
        fused, tupled, records = drained
        print(f"drain of a ring of {records} native records (function_graph of fib(22)),"
              f" per record (median of {args.repeat}):")
        print(f"  fused (write_native) {fused:6.1f} ns/record  ({tupled / fused:.1f}x)")
        print(f"  tuple path           {tupled:6.1f} ns/record")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
