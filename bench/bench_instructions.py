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
the engine as ~90 modules load; needs the bench extra). ``--quick``: hello only.
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

ALL = ("hello", "nbody", "sqlglot-import")
_COLLECTED = re.compile(r"Collected : (\d+)")


def _env(cwd: Path) -> dict[str, str]:
    """The program's directory on the path; byte code cached, as users run (the program's
    modules compiled from source would cost the same in both runs, and hide what rethook adds
    to a compile-free start: compile() makes the ast module's types at its first call)."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def instructions(cmd: list[str], cwd: Path) -> int:
    """Instructions ``cmd`` executed, every thread and the whole process, by callgrind."""
    r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd],
                       cwd=cwd, capture_output=True, text=True, timeout=1800,
                       env=_env(cwd))
    found = _COLLECTED.search(r.stderr)
    if r.returncode != 0 or found is None:
        sys.exit(f"bench_instructions: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return int(found.group(1))


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
        elif name == "sqlglot-import":
            (work / "sqlglot").mkdir()
            (work / "sqlglot" / "import_sqlglot.py").write_text("import sqlglot  # noqa\n")
            out[name] = work / "sqlglot" / "import_sqlglot.py"
        else:
            sys.exit(f"bench_instructions: unknown workload {name!r} ({', '.join(ALL)})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the one-line script only")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each (medians)")
    ap.add_argument("--workloads", default=",".join(ALL))
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("bench_instructions: needs valgrind (Debian's package valgrind)")
    names = ["hello"] if args.quick else args.workloads.split(",")
    py = sys.executable
    rethook = [py, "-c", "import sys; from rethook.cli import entry; sys.argv[0] = 'rethook'; "
               "sys.exit(entry())", "record", "-l", "*"]
    print(f"Python {sys.version.split()[0]}; instructions of the whole command (callgrind), "
          f"median of {args.repeat}")
    print(f"{'workload':16} {'python':>14} {'rethook':>14} {'rethook adds':>14}")
    with tempfile.TemporaryDirectory(prefix="rethook-bench-instr-") as tmp:
        work = Path(tmp)
        for name, script in programs(names, work).items():
            out = str(work / f"{name}.dat")
            base = statistics.median(instructions([py, script.name], script.parent)
                                     for _ in range(args.repeat))
            traced = statistics.median(
                instructions([*rethook, "-o", out, script.name], script.parent)
                for _ in range(args.repeat))
            print(f"{name:16} {base / 1e6:12.1f} M {traced / 1e6:12.1f} M "
                  f"{(traced - base) / 1e6:12.1f} M")


if __name__ == "__main__":
    main()
