"""Stands in for ``pyperf`` when bench/bench_peers.py runs a pyperformance benchmark as a plain
script: ``Runner.bench_*`` call the benchmark's function ``--loops`` times (default 1), once,
with no worker processes, calibration or statistics, so every tool sees one ordinary program.

bench_peers.py copies a benchmark's ``bm_NAME`` directory and puts this file beside its
``run_benchmark.py`` as ``pyperf.py`` (with ``_marks.py``), where the script's own directory
on ``sys.path`` makes ``import pyperf`` find it.
"""

from _marks import mark

mark("start")

import argparse  # noqa: E402
import time  # noqa: E402

perf_counter = time.perf_counter


class Runner:
    def __init__(self, *args, add_cmdline_args=None, **kwargs):
        self.metadata = {}
        self.argparser = argparse.ArgumentParser()
        self.argparser.add_argument("--loops", type=int, default=1)
        self.args = None

    def parse_args(self, args=None):
        if self.args is None:
            self.args = self.argparser.parse_args(args)
        return self.args

    def bench_func(self, name, func, *args, inner_loops=None, metadata=None):
        for _ in range(self.parse_args().loops):
            func(*args)
        mark("end")

    def bench_time_func(self, name, func, *args, inner_loops=None, metadata=None):
        func(self.parse_args().loops, *args)
        mark("end")

    def bench_async_func(self, name, func, *args, inner_loops=None, metadata=None):
        import asyncio

        for _ in range(self.parse_args().loops):
            asyncio.run(func(*args))
        mark("end")
