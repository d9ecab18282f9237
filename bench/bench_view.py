"""Benchmark ``rethook view``: the time to build the HTML page of a 1 M-event trace, its size,
and (when Chromium and Playwright are here) how long the page takes to open in a browser.

The trace: a function_graph trace of 1 M events (500 k calls: entry/exit pairs on 4 threads,
300 distinct function names in 17 modules, nested up to 13 deep, a return value on every exit),
written once to a temporary file. Its page is built ``--repeat`` times with the default limits
(500 k calls is past the default 400 k, so the page is aggregated: the longest calls on the
timeline, every call in the flame graph), and the median is printed, with the time of
``rethook export --format perfetto`` of the same file in the same run, alternating, for scale.
Then a trace of ``--small`` events (300 k by default: a page with every call on it) is timed
the same way. Last, each page is opened in headless Chromium and the time until the viewer is
ready is printed (median of 3).

    python bench/bench_view.py [--events N] [--small N] [--repeat R] [--no-browser]
"""

from __future__ import annotations

import argparse
import heapq
import io
import os
import random
import shutil
import statistics
import tempfile
import time

from rethook.buffer.tracefile import TraceWriter
from rethook.buffer.traceread import TraceReader
from rethook.output.html import write_html
from rethook.output.perfetto import write_perfetto
from rethook.tracers.formats import BUILTIN, FUNCGRAPH_ENTRY, FUNCGRAPH_EXIT

THREADS = 4
FUNCTIONS = 300
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def make_trace(path: str, n: int) -> None:
    """``n`` function_graph events: nested calls on THREADS threads, in timestamp order."""
    rng = random.Random(42)
    names = [f"pkg.module_{i % 17}.function_{i}" for i in range(FUNCTIONS)]
    retvals = ["None", "0", "1", "True", "False", "''", "[]"]
    streams = []
    for t in range(THREADS):
        tid = 100_000 + 17 * t
        ts = 1_000_000 + t
        stack: list[tuple[str, int]] = []
        events: list[tuple] = []
        while len(events) < n // THREADS:
            ts += rng.randrange(40, 400)
            if stack and (len(stack) > 12 or rng.random() < 0.5):
                func, start = stack.pop()
                events.append((FUNCGRAPH_EXIT.id, ts, tid, len(stack), func, start, 0, 0, 0,
                               rng.choice(retvals)))
            else:
                func = rng.choice(names)
                events.append((FUNCGRAPH_ENTRY.id, ts, tid, len(stack), func, ""))
                stack.append((func, ts))
        while stack:
            func, start = stack.pop()
            ts += 50
            events.append((FUNCGRAPH_EXIT.id, ts, tid, len(stack), func, start, 0, 0, 0, "None"))
        streams.append(events)
    with TraceWriter(path, {"tracer": "function_graph", "argv": ["bench.py"], "pid": 4242},
                     formats=BUILTIN) as w:
        for t in range(THREADS):
            w.set_thread_name(100_000 + 17 * t, f"worker-{t}")
        w.write_events(heapq.merge(*streams, key=lambda ev: ev[1]))


def build(trace: str, out: str) -> float:
    t0 = time.perf_counter()
    with TraceReader(trace) as reader, open(out, "w", encoding="utf-8") as f:
        write_html(reader, f)
    return time.perf_counter() - t0


def perfetto(trace: str) -> float:
    t0 = time.perf_counter()
    with TraceReader(trace) as reader:
        write_perfetto(reader, io.BytesIO())
    return time.perf_counter() - t0


def open_times(pages: list[str], repeat: int) -> dict[str, float] | None:
    """Median seconds from navigation until the viewer is ready, per page; None when no
    browser can be had."""
    exe = shutil.which("chromium")
    if exe is None:
        print("  (no chromium: apt-get install chromium to time the page in a browser)")
        return None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("  (no playwright: pip install -e '.[dev]' to time the page in a browser)")
        return None
    out: dict[str, list[float]] = {p: [] for p in pages}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        for _ in range(repeat):
            for p in pages:
                page = browser.new_page(viewport={"width": 1400, "height": 800})
                t0 = time.perf_counter()
                page.goto("file://" + os.path.abspath(p))
                page.wait_for_function("document.documentElement.dataset.ready === '1'",
                                       timeout=300_000)
                page.evaluate("new Promise(r => requestAnimationFrame(() => r()))")  # drawn
                out[p].append(time.perf_counter() - t0)
                page.close()
        browser.close()
    return {p: statistics.median(v) for p, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--quick", action="store_true", help="300,000 and 100,000 events, 1 run")
    args = ap.parse_args()
    if args.quick:
        args.events, args.small, args.repeat = 300_000, 100_000, 1
    with tempfile.TemporaryDirectory(prefix="rethook-bench-view-") as tmp:
        pages = []
        for n in (args.events, args.small):
            trace = os.path.join(tmp, f"t{n}.dat")
            out = os.path.join(tmp, f"t{n}.html")
            make_trace(trace, n)
            view_s, perfetto_s = [], []
            for _ in range(args.repeat):
                view_s.append(build(trace, out))
                perfetto_s.append(perfetto(trace))
            with TraceReader(trace) as reader:
                events = sum(1 for _ in reader.events())
            size = os.path.getsize(out)
            v, p = statistics.median(view_s), statistics.median(perfetto_s)
            print(f"view of {events:,} events ({os.path.getsize(trace) / 1e6:.1f} MB trace): "
                  f"built in {v:.2f} s ({v / events * 1e9:.0f} ns/event), "
                  f"page {size / 1e6:.1f} MB ({size / events:.1f} bytes/event); "
                  f"perfetto export of the same file {p:.2f} s (view / perfetto {v / p:.2f}x)")
            pages.append(out)
        if not args.no_browser:
            times = open_times(pages, 3)
            if times:
                for p, s in times.items():
                    print(f"  {os.path.basename(p)}: opened in Chromium (headless) in {s:.2f} s")


if __name__ == "__main__":
    main()
