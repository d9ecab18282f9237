"""This tree's rethook against another commit's, on the same programs, interleaved: what a
change does to a whole run's start, run and finish.

    .venv/bin/python bench/bench_ab.py [--base REV] [--workloads W,...] [--repeat N] [--quick]

The other commit (``--base``, default ``HEAD``: the working tree's uncommitted change against
the last commit) is checked out into a temporary git worktree and installed, C extensions
built, into a temporary directory; each build then runs as ``rethook record -l '*'`` from its
own source (on ``PYTHONPATH``), and ``python`` runs the program untraced, in turn, N times.
The programs are bench_peers.py's (``sqlglot``, ``threads``, ``bm:NAME``); their marks
(bench/programs/_marks.py) split each run into start (spawn to the program's first line), run
(its first line to its last) and finish (its last line to the exit); "run cpu" is the
program's thread's CPU time in the run (the run minus it: waiting, for the GIL or the disk).
Medians in ms, and what this tree changes against the base. On a noisy machine only
differences that hold across repeated invocations mean anything; the run column of a program
with few calls is mostly noise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from bench_peers import _env, _read_marks, make_workloads, split_run  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PHASES = ("start", "run", "run cpu", "finish", "whole")
#: rethook's command line, run from whichever source PYTHONPATH puts first
RECORD = ["-c", "import sys; from rethook.cli import entry; sys.argv[0] = 'rethook'; entry()",
          "record", "-l", "*"]


def build(rev: str, into: Path) -> Path:
    """``rev`` installed (C extensions built) under ``into``; returns the directory to put on
    PYTHONPATH."""
    tree = into / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree),
                    rev], check=True)
    try:
        site = into / "site"
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--target", str(site), str(tree)], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"bench_ab: cannot build {rev}:\n{r.stderr[-2000:]}")
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(site / "rethook")],
                       check=True, stdout=subprocess.DEVNULL)
        return site
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       check=False)


def run_once(cmd: list[str], script: Path, marks: Path, source: Path | None) -> dict[str, float]:
    if marks.exists():
        marks.unlink()
    env = _env(script, marks)
    if source is not None:
        env["PYTHONPATH"] = f"{source}{os.pathsep}{env['PYTHONPATH']}"
    t0 = time.time()
    r = subprocess.run(cmd, cwd=script.parent, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    t1 = time.time()
    if r.returncode != 0:
        sys.exit(f"bench_ab: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    start, inrun, finish = split_run(marks, t0, t1)
    if start is None or inrun is None or finish is None:
        sys.exit(f"bench_ab: {' '.join(cmd)} wrote no start and end marks")
    cpu = dict(_read_marks(marks, field=2))  # the program's thread's CPU time at each mark
    return {"start": start, "run": inrun, "run cpu": cpu["end"] - cpu["start"],
            "finish": finish, "whole": t1 - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD", help="the commit to compare with (default HEAD)")
    ap.add_argument("--workloads", default="bm:deltablue,bm:richards")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="3 runs each, small workloads")
    args = ap.parse_args()
    repeat = 3 if args.quick else args.repeat
    with tempfile.TemporaryDirectory(prefix="rethook-ab-") as tmp:
        work = Path(tmp)
        base = build(args.base, work / "base")
        (work / "w").mkdir()
        workloads = make_workloads(args.workloads.split(","), args.quick, work / "w")
        builds = {"python": None, "base": base, "this": ROOT / "src"}
        for w in workloads:
            prog = [str(w.script), *w.args]
            cmds = {"python": [sys.executable, *prog],
                    "base": [sys.executable, *RECORD, "-o", str(work / "base.dat"), *prog],
                    "this": [sys.executable, *RECORD, "-o", str(work / "this.dat"), *prog]}
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in cmds}
            for _ in range(repeat):
                for name, cmd in cmds.items():
                    runs[name].append(run_once(cmd, w.script, work / "marks.txt",
                                               builds[name]))
            med = {name: {p: statistics.median(r[p] for r in rs) * 1000 for p in PHASES}
                   for name, rs in runs.items()}
            print(f"{w.name}: medians of {repeat} interleaved runs, ms (base: {args.base}; "
                  f"load {os.getloadavg()[0]:.1f})")
            print("  " + f"{'':8}" + "".join(f"{p:>10}" for p in PHASES))
            for name in cmds:
                print("  " + f"{name:8}" + "".join(f"{med[name][p]:>10.1f}" for p in PHASES))
            print("  " + f"{'change':8}"
                  + "".join(f"{med['this'][p] - med['base'][p]:>+10.1f}" for p in PHASES))


if __name__ == "__main__":
    main()
