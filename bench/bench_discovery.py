"""What discovery and enabling new functions cost, as ratios against the untraced run.

    .venv/bin/python bench/bench_discovery.py [--repeat N] [--functions N] [--quick]

Discovery (every code object's first call reaches the engine, which registers code it did
not know and disables the location unless a filter wants it) on a generated program of N
(10,000) functions, each called three times, where the code comes from:

* ``script``: the program's own file (known before it runs; discovery only disables);
* ``plugin``: a module loaded with ``spec_from_file_location(...).loader.exec_module``, past
  the import hook (found when its body starts: all of it registered at once);
* ``exec``: one ``exec`` of a string per function (each function met on its first call).

Each is measured whole, start-up included (``python prog.py`` against ``rethook record -l
ONE_FUNCTION prog.py``, in subprocesses), and in process (the engine with one user on one
function against no engine; fresh code objects every run, compilation in both).

Enabling functions as modules load (``-l '*'``): M modules of K functions are imported one
after another with a no-op user on every function; the import time per module must not grow
with the number of functions already hooked (the last modules against the first ones; the
cyclic GC is off while they import, in both runs, so its passes over a growing heap do not
blur the figures).

Every figure is the median of N runs, untraced and traced interleaved.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from bench_engine import NoOp  # noqa: E402
from rethook.engine.engine import get_engine  # noqa: E402

CALLS_EACH = 3


def _target() -> None:
    """What the in-process runs' user hooks: a function the program never calls."""


# --- the generated programs -----------------------------------------------------------------
def functions_source(n: int) -> str:
    return "".join(f"def f_{i}(x):\n    return x + {i}\n\n\n" for i in range(n))


def main_source(n: int) -> str:
    return (f"def main():\n    total = 0\n    for f in FUNCS:\n"
            f"        for k in range({CALLS_EACH}):\n            total += f(k)\n"
            f"    return total\n")


def program(kind: str, n: int, workdir: str) -> str:
    """The source of a program of ``n`` functions whose code comes from ``kind``."""
    if kind == "script":
        body = functions_source(n) + f"FUNCS = [globals()[f'f_{{i}}'] for i in range({n})]\n"
    elif kind == "plugin":
        with open(os.path.join(workdir, "plugin_funcs.py"), "w") as f:
            f.write(functions_source(n))
        body = ("import importlib.util, os, sys\n"
                "spec = importlib.util.spec_from_file_location('plugin_funcs', os.path.join("
                "os.path.dirname(os.path.abspath(__file__)), 'plugin_funcs.py'))\n"
                "mod = importlib.util.module_from_spec(spec)\n"
                "sys.modules['plugin_funcs'] = mod\n"
                "spec.loader.exec_module(mod)\n"
                f"FUNCS = [getattr(mod, f'f_{{i}}') for i in range({n})]\n")
    else:  # exec: one string per function, as code generators do
        body = ("FUNCS = []\n"
                f"for i in range({n}):\n"
                "    ns = {'__name__': __name__}\n"
                "    exec(f'def f_{i}(x):\\n    return x + {i}\\n', ns)\n"
                "    FUNCS.append(ns[f'f_{i}'])\n")
    return body + main_source(n) + "print(main())\n"


def median_pair(run_base, run_traced, repeat: int) -> tuple[float, float]:
    base, traced = [], []
    for _ in range(repeat):
        base.append(run_base())
        traced.append(run_traced())
    return statistics.median(base), statistics.median(traced)


def whole_process(kind: str, n: int, repeat: int, workdir: str) -> tuple[float, float]:
    path = os.path.join(workdir, f"prog_{kind}.py")
    with open(path, "w") as f:
        f.write(program(kind, n, workdir))
    out = os.path.join(workdir, "t.dat")
    one = "plugin_funcs.f_0" if kind == "plugin" else "__main__.f_0"

    def timed(*argv: str) -> float:
        t = time.perf_counter()
        r = subprocess.run([sys.executable, *argv], cwd=workdir, capture_output=True,
                           text=True)
        elapsed = time.perf_counter() - t
        if r.returncode != 0:
            raise SystemExit(f"{argv}: {r.stderr}")
        return elapsed

    return median_pair(lambda: timed(path),
                       lambda: timed("-m", "rethook", "record", "-o", out, "-l", one, path),
                       repeat)


def in_process(kind: str, n: int, repeat: int, workdir: str) -> tuple[float, float]:
    """Run the program's code in this process: compiled fresh every run (new code objects,
    so every run discovers them), with no engine, or with one user on one function."""
    engine = get_engine()
    source = program(kind, n, workdir).replace("print(main())\n", "main()\n")
    path = os.path.join(workdir, f"inproc_{kind}.py")
    runs = iter(range(10**9))

    def run() -> float:
        gc.collect()
        name = f"rh_bench_disc_{next(runs)}"
        if kind == "plugin":  # a fresh plugin module each time
            sys.modules.pop("plugin_funcs", None)
        t = time.perf_counter()
        code = compile(source, path, "exec")
        exec(code, {"__name__": name, "__file__": path})
        return time.perf_counter() - t

    user = NoOp(filter="_target")  # one function, never called: discovery is all it costs

    def traced() -> float:
        engine.register_ftrace_graph(user)
        try:
            return run()
        finally:
            engine.unregister_ftrace_graph(user)

    return median_pair(run, traced, repeat)


def module_loads(modules: int, per_module: int, repeat: int, workdir: str) -> None:
    """Import ``modules`` modules of ``per_module`` functions each, untraced and with a no-op
    user on every function (``-l '*'``); print the per-module import time of the first and
    the last tenth."""
    engine = get_engine()
    sys.path.insert(0, workdir)
    source = functions_source(per_module)
    tenth = max(1, modules // 10)
    runs = iter(range(10**9))

    def load_all(traced: bool) -> list[float]:
        tag = next(runs)
        names = [f"rh_bench_mod_{tag}_{i}" for i in range(modules)]
        for name in names:
            with open(os.path.join(workdir, name + ".py"), "w") as f:
                f.write(source)
        importlib.invalidate_caches()
        user = NoOp(filter="*")
        if traced:
            engine.register_ftrace_graph(user)
        times = []
        gc.collect()
        gc.disable()  # collections of the growing heap would blur the per-module figures
        try:
            for name in names:
                t = time.perf_counter()
                importlib.import_module(name)
                times.append(time.perf_counter() - t)
        finally:
            gc.enable()
            if traced:
                engine.unregister_ftrace_graph(user)
            for name in names:
                sys.modules.pop(name, None)
        return times

    base_first, base_last, tr_first, tr_last = [], [], [], []
    for _ in range(repeat):
        b = load_all(False)
        t = load_all(True)
        base_first.append(statistics.mean(b[:tenth]))
        base_last.append(statistics.mean(b[-tenth:]))
        tr_first.append(statistics.mean(t[:tenth]))
        tr_last.append(statistics.mean(t[-tenth:]))
    bf, bl = statistics.median(base_first), statistics.median(base_last)
    tf, tl = statistics.median(tr_first), statistics.median(tr_last)
    print(f"  import of one module of {per_module} functions, first tenth: base "
          f"{bf * 1e3:6.2f} ms  traced {tf * 1e3:6.2f} ms  ratio {tf / bf:5.2f}x")
    print(f"  last tenth ({modules * per_module:,} functions hooked by then):       base "
          f"{bl * 1e3:6.2f} ms  traced {tl * 1e3:6.2f} ms  ratio {tl / bl:5.2f}x")
    first, last = (tf - bf) / per_module * 1e6, (tl - bl) / per_module * 1e6
    print(f"  enabling cost per function: first tenth {first:5.1f} us, last tenth {last:5.1f} us "
          f"({last / first:4.2f}x; 1.00: in proportion to the new module only)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--functions", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="1,000 functions, 3 repeats")
    args = ap.parse_args()
    n, repeat = (1000, 3) if args.quick else (args.functions, args.repeat)
    print(f"engine: {get_engine().core.name}; Python {sys.version.split()[0]}; "
          f"{n:,} functions called {CALLS_EACH} times each; median of {repeat}")
    workdir = tempfile.mkdtemp(prefix="rethook_bench_disc_")
    try:
        b, t = whole_process("script", 1, repeat, workdir)
        print(f"start-up alone (a program of 1 function):           base {b:6.3f}s  "
              f"traced {t:6.3f}s  ratio {t / b:5.2f}x  (+{t - b:.3f}s)", flush=True)
        for kind in ("script", "plugin", "exec"):
            b, t = whole_process(kind, n, repeat, workdir)
            print(f"discovery, {kind:6s} whole run (start-up included): base {b:6.3f}s  "
                  f"traced {t:6.3f}s  ratio {t / b:5.2f}x  (+{t - b:.3f}s)", flush=True)
            b, t = in_process(kind, n, repeat, workdir)
            print(f"discovery, {kind:6s} in process:                    base {b:6.3f}s  "
                  f"traced {t:6.3f}s  ratio {t / b:5.2f}x  "
                  f"{(t - b) / n * 1e6:5.2f} us/function", flush=True)
        modules = 20 if args.quick else 60
        print(f"enabling functions as modules load (-l '*'): {modules} modules")
        module_loads(modules, 300, repeat, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
