"""Where a whole-program run's extra time goes, by phase: the sqlglot workload untraced, under
``rethook record -l '*'`` and under trace0, interleaved, medians of N runs.

    .venv/bin/python bench/bench_phases.py [--repeat N] [--quick] [--rounds R]

The program (bench/programs/sqlglot_transpile.py) marks its first line, the end of
``import sqlglot``, the end of each round and its last line (bench/programs/_marks.py), so a
run splits into: start (spawn to the first line: the interpreter and the tool), the import
(every module the tool registers or names as it loads), the first round (which imports the
dialects and makes ~3.5x a later round's calls: the first call of most functions), a later
round (the steady state: calls only), and finish (the last line to exit: the trace file's
end). Each phase is shown with what the tool adds to the untraced run's. A second table
shows the program's main thread in the phases it runs: its CPU time, and how long it waited
(the wall time minus that: for the GIL, which a tool's drain thread may hold, or blocked).
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

# the peers' commands, environment and marks, as bench_peers.py runs them
from bench_peers import BIN, PROGRAMS, SUFFIX, Workload, _env, _read_marks, command  # noqa: E402

PROGRAM = PROGRAMS / "sqlglot_transpile.py"
PHASES = ("start", "import", "first round", "later round", "finish", "whole")
#: The phases the program's main thread runs, whose CPU time the marks give
RUN_PHASES = ("import", "first round", "later round")


def commands(work: Path, rounds: int) -> dict[str, list[str]]:
    w = Workload("sqlglot", PROGRAM, [str(rounds)])
    tools = ["python", "rethook"] + (["trace0"] if (BIN / "trace0").exists() else [])
    return {tool: command(tool, w, work / f"out{SUFFIX[tool]}") for tool in tools}


def _split(marks: list[tuple[str, float]]) -> dict[str, float]:
    """The program's phases between its marks (import, first round, a later round)."""
    times: dict[str, list[float]] = {}
    for name, t in marks:
        times.setdefault(name, []).append(t)
    start, imported, rounds = times["start"][0], times["imported"][0], times["round"]
    later = [b - a for a, b in zip(rounds, rounds[1:], strict=False)]
    return {"import": imported - start, "first round": rounds[0] - imported,
            "later round": statistics.median(later) if later else float("nan")}


def run(cmd: list[str], marks: Path) -> dict[str, float]:
    """One run's phases, in seconds; ``cpu PHASE``: the main thread's CPU time in it."""
    if marks.exists():
        marks.unlink()
    env = _env(PROGRAM, marks)
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = proc.communicate()
    t1 = time.time()
    if proc.returncode != 0:
        sys.exit(f"bench_phases: {' '.join(cmd)} failed:\n{err.decode(errors='replace')[-2000:]}")
    wall = _read_marks(marks)
    start = next(t for name, t in wall if name == "start")
    end = [t for name, t in wall if name == "end"][-1]
    cpu = _split(_read_marks(marks, field=2))
    return {"start": start - t0, **_split(wall), "finish": t1 - end, "whole": t1 - t0,
            **{f"cpu {p}": cpu[p] for p in RUN_PHASES}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="3 runs each, 3 rounds")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    try:
        import sqlglot  # noqa: F401
    except ImportError:
        sys.exit("bench_phases: sqlglot is not installed "
                 "(./dev.sh bench installs the bench extra)")
    repeat, rounds = (3, 3) if args.quick else (args.repeat, max(2, args.rounds))
    with tempfile.TemporaryDirectory(prefix="rethook-phases-") as tmp:
        cmds = commands(Path(tmp), rounds)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in cmds}
        for _ in range(repeat):
            for name, cmd in cmds.items():
                results[name].append(run(cmd, Path(tmp) / "marks.txt"))
    load = os.getloadavg()
    print(f"sqlglot_transpile.py {rounds} rounds, Python {sys.version.split()[0]}, load "
          f"{load[0]:.1f}; medians of {repeat} interleaved runs, ms (+ over python)")
    med = {name: {p: statistics.median(r[p] for r in runs) for p in PHASES}
           for name, runs in results.items()}
    print("  " + f"{'':9}" + "".join(f"{p:>22}" for p in PHASES))
    for name, phases in med.items():
        cells = []
        for p in PHASES:
            ms = phases[p] * 1000
            extra = "" if name == "python" else f" ({(phases[p] - med['python'][p]) * 1000:+.1f})"
            cells.append(f"{ms:.1f}{extra}")
        print("  " + f"{name:9}" + "".join(f"{c:>22}" for c in cells))
    print("the program's main thread: CPU time / waited (wall - CPU), ms")
    print("  " + f"{'':9}" + "".join(f"{p:>22}" for p in RUN_PHASES))
    for name, runs in results.items():
        cells = []
        for p in RUN_PHASES:
            cpu = statistics.median(r[f"cpu {p}"] for r in runs) * 1000
            waited = statistics.median(r[p] - r[f"cpu {p}"] for r in runs) * 1000
            cells.append(f"{cpu:.1f} / {waited:.1f}")
        print("  " + f"{name:9}" + "".join(f"{c:>22}" for c in cells))
    if "trace0" not in cmds:
        print("trace0 is not installed (pip install trace0): its row is skipped")


if __name__ == "__main__":
    main()
