"""Counts the Python function calls a program makes, as bench/bench_peers.py's reference.

    python count_calls.py SCRIPT [ARGS]...

Runs SCRIPT as ``python SCRIPT ARGS`` would and prints ``calls N`` to stderr at exit: every
PY_START event of every thread (every call of a Python function, generator and coroutine
bodies once per call, code made by exec/eval included), from sys.monitoring with a C
callback-free counter kept as small as it can be.
"""

import runpy
import sys

count = 0


def on_start(code, offset):
    global count
    count += 1


def main():
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    import os
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    mon = sys.monitoring
    tool = mon.PROFILER_ID
    mon.use_tool_id(tool, "count_calls")
    mon.register_callback(tool, mon.events.PY_START, on_start)
    mon.set_events(tool, mon.events.PY_START)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        mon.set_events(tool, 0)
        print(f"calls {count}", file=sys.stderr)


main()
