"""What ``rethook record -l '*'`` adds to a program, counted in instructions rather than timed.

    .venv/bin/python bench/bench_instructions.py [--quick] [--repeat N] [--workloads W,...]

Runs each workload under ``valgrind --tool=callgrind`` as ``python PROG`` and as ``rethook
record -l '*' -o FILE PROG`` (the whole command: start-up, the run, writing the trace, the
interpreter's end) and prints the instructions each executed and rethook's share. Unlike wall
time on a shared machine, the count is the same from one run to the next within a few tenths
of a percent (the drain thread's rounds vary a little), so it shows changes of a few percent
that timings cannot (docs/ccore.md, "Where a recording's time goes"). It counts work, not
waiting: cache misses and the callbacks' RDTSC cost time the count does not show.

Workloads: ``hello`` (a one-line script: rethook's fixed cost), ``nbody`` (pyperformance's, a
short run; needs the bench extra), ``sqlglot-import`` (``import sqlglot``: the registry and
the engine as ~90 modules load; needs the bench extra), ``storm`` (the call storm: fib(20)
made 10 and 20 times; the difference over the calls it adds is the cost of a call in a steady
state, start-up, arming and finish left out). ``--quick``: hello only.

Each row also splits what the traced command executed between the program's thread (the
callbacks, the engine's Python code, start-up and finish) and rethook's others (the drain),
where the program's core is the one the ratio against the untraced run pays for; trace0
(``pip install trace0``, a benchmark-only peer) gets the same rows when it is installed: its
writer thread is its "others". For ``storm`` the figures are per call. trace0's start-up
calibrates its clock in a loop timed by the wall clock, which under callgrind runs longer
(~12-15 M instructions here, more than it runs natively): its fixed cost is overstated, its
per-call cost is not.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_peers
import workloads

ALL = ("hello", "nbody", "sqlglot-import", "storm")
_COLLECTED = re.compile(r"Collected : (\d+)")
_THREAD_FILE = re.compile(r"-(\d+)$")
_TOTALS = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)
#: The storm's two sizes: fib(STORM_N) made this many times (the second minus the first is
#: what a call costs once everything is armed and the rings are paged in).
STORM_N, STORM_TIMES = 20, (10, 20)
STORM = """import sys
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
for _ in range(int(sys.argv[1])):
    fib({n})
"""


def _env(cwd: Path) -> dict[str, str]:
    """The program's directory on the path; byte code cached, as users run (the program's
    modules compiled from source would cost the same in both runs, and hide what rethook adds
    to a compile-free start: compile() makes the ast module's types at its first call)."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def instructions(cmd: list[str], cwd: Path) -> tuple[int, int]:
    """Instructions ``cmd`` executed by callgrind: (the main thread's, every other thread's),
    the whole process."""
    with tempfile.TemporaryDirectory(prefix="rethook-callgrind-") as out:
        r = subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes",
                            f"--callgrind-out-file={out}/cg.%p", *cmd],
                           cwd=cwd, capture_output=True, text=True, timeout=1800,
                           env=_env(cwd))
        found = _COLLECTED.search(r.stderr)
        if r.returncode != 0 or found is None:
            sys.exit(f"bench_instructions: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
        per_thread = {}
        for f in Path(out).iterdir():  # cg.PID-NN: thread NN (01: the main thread)
            thread = _THREAD_FILE.search(f.name)
            total = _TOTALS.search(f.read_text(errors="replace"))
            if thread is not None and total is not None:
                per_thread[int(thread.group(1))] = int(total.group(1))
    main = per_thread.pop(1, int(found.group(1)))
    return main, sum(per_thread.values())


def programs(names: list[str], work: Path) -> dict[str, Path]:
    """Each workload's script, in a directory of its own under ``work``."""
    out = {}
    for name in names:
        if name == "hello":
            (work / "hello").mkdir()
            (work / "hello" / "hello.py").write_text("print('hello')\n")
            out[name] = work / "hello" / "hello.py"
        elif name == "nbody":
            (w,) = bench_peers.make_workloads(["bm:nbody"], False, work)
            out[name] = w.script
        elif name == "storm":
            (work / "storm").mkdir()
            (work / "storm" / "storm.py").write_text(STORM.format(n=STORM_N))
            out[name] = work / "storm" / "storm.py"
        elif name == "sqlglot-import":
            (work / "sqlglot").mkdir()
            (work / "sqlglot" / "import_sqlglot.py").write_text("import sqlglot  # noqa\n")
            out[name] = work / "sqlglot" / "import_sqlglot.py"
        else:
            sys.exit(f"bench_instructions: unknown workload {name!r} ({', '.join(ALL)})")
    return out


def tools() -> dict[str, list[str] | None]:
    """Each command's prefix (None: the untraced run), trace0's where it is installed."""
    py = sys.executable
    out: dict[str, list[str] | None] = {
        "python": None,
        "rethook": [py, "-c", "import sys; from rethook.cli import entry; "
                    "sys.argv[0] = 'rethook'; sys.exit(entry())", "record", "-l", "*"]}
    trace0 = shutil.which("trace0", path=str(Path(py).parent)) or shutil.which("trace0")
    if trace0 is not None:
        out["trace0"] = [trace0, "run"]
    return out


def measure(prefix: list[str] | None, script: Path, args: list[str], out: str,
            repeat: int) -> tuple[float, float]:
    """Median (main thread, other threads) instructions of the command over ``repeat`` runs."""
    cmd = [sys.executable, script.name, *args] if prefix is None else \
        [*prefix, "-o", out, script.name, *args]
    runs = [instructions(cmd, script.parent) for _ in range(repeat)]
    return (statistics.median(m for m, _ in runs), statistics.median(o for _, o in runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the one-line script only")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each (medians)")
    ap.add_argument("--workloads", default=",".join(ALL))
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("bench_instructions: needs valgrind (Debian's package valgrind)")
    names = ["hello"] if args.quick else args.workloads.split(",")
    commands = tools()
    print(f"Python {sys.version.split()[0]}; instructions executed (callgrind), median of "
          f"{args.repeat}: the whole command in M, and what the tool adds on the program's "
          f"thread (main) and on its others; storm: per call, in a steady state")
    print(f"{'workload':16} {'tool':8} {'total':>11} {'main':>11} {'others':>11} "
          f"{'adds (main)':>12} {'adds (all)':>11}")
    with tempfile.TemporaryDirectory(prefix="rethook-bench-instr-") as tmp:
        work = Path(tmp)
        for name, script in programs(names, work).items():
            sizes = [[str(t)] for t in STORM_TIMES] if name == "storm" else [[]]
            per_call = name == "storm"
            unit = (workloads.fib_calls(STORM_N) * (STORM_TIMES[1] - STORM_TIMES[0])
                    if per_call else 1e6)
            base = None
            for tool, prefix in commands.items():
                out = str(work / f"{name}.{tool}.out")
                got = [measure(prefix, script, a, out, args.repeat) for a in sizes]
                main_n, others = (got[-1][0] - got[0][0], got[-1][1] - got[0][1]) \
                    if len(got) == 2 else got[0]
                total = main_n + others
                if base is None:
                    base = (main_n, total)
                cells = [total, main_n, others, main_n - base[0], total - base[1]]
                print(f"{name:16} {tool:8} " + " ".join(
                    f"{c / unit:{w}.1f}" if per_call else f"{c / unit:{w - 2}.1f} M"
                    for c, w in zip(cells, (11, 11, 11, 12, 11), strict=True)))


if __name__ == "__main__":
    main()
