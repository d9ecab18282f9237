"""The command line's own cost: start-up and finish of ``rethook`` around a program that does
nothing, against ``python`` running the same program, interleaved, medians of N runs.

    .venv/bin/python bench/bench_startup.py [--repeat N]

Shows the CPU time (user + system, from ``wait4``) and the wall time of each command, and
what it adds to the untraced run. Twice: for a program that imports nothing (``prog.py``),
and for one that first imports what pyperformance's programs import through their harness
(``argparse``, ``re``, ``enum``...: ``imports.py``), whose own cost is then not counted as the
tool's; trace0's rows where it is installed. CPU time is the steadier figure on a shared
machine; the wall time is what a user waits. ``python -X importtime -c 'import
rethook.cli.main'`` and tests/test_startup.py show what is imported.
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

BIN = Path(sys.executable).parent
#: What pyperformance's programs import through their harness (and most programs anyway).
IMPORTS = "import argparse, collections, enum, functools, re, zlib  # noqa: F401"


def run(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench_startup: {' '.join(cmd)} failed")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="5 runs each")
    args = ap.parse_args()
    repeat = 5 if args.quick else args.repeat
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: byte code cached
    with tempfile.TemporaryDirectory(prefix="rethook-startup-") as tmp:
        prog = os.path.join(tmp, "prog.py")
        Path(prog).write_text("def main():\n    return 0\n\n\nmain()\n")
        imports = os.path.join(tmp, "imports.py")
        Path(imports).write_text(f"{IMPORTS}\n\n\ndef main():\n    return 0\n\n\nmain()\n")
        out = os.path.join(tmp, "t.dat")
        rethook = str(BIN / "rethook")
        trace0 = str(BIN / "trace0") if (BIN / "trace0").exists() else None
        commands = {
            "python prog.py": [sys.executable, prog],
            "rethook --help": [rethook, "--help"],
            "rethook record prog.py": [rethook, "record", "-o", out, prog],
            "rethook record -l '*' prog.py": [rethook, "record", "-l", "*", "-o", out, prog],
            "python imports.py": [sys.executable, imports],
            "rethook record -l '*' imports.py": [rethook, "record", "-l", "*", "-o", out,
                                                 imports],
        }
        if trace0 is not None:
            commands["trace0 run prog.py"] = [trace0, "run", "-o", out + ".pftrace", prog]
            commands["trace0 run imports.py"] = [trace0, "run", "-o", out + ".pftrace",
                                                 imports]
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(repeat):
            for name, cmd in commands.items():
                times[name].append(run(cmd, tmp, env))
    load = os.getloadavg()
    print(f"Start-up and finish of the command line, Python {sys.version.split()[0]}, "
          f"load {load[0]:.1f}; medians of {repeat} interleaved runs")
    print(f"  {'command':36} {'CPU':>9} {'+ over python':>14} {'wall':>9} {'+ over python':>14}")
    for name, runs in sorted(times.items(), key=lambda kv: "imports.py" in kv[0]):
        base = "python imports.py" if "imports.py" in name else "python prog.py"
        base_cpu = statistics.median(c for c, _ in times[base])
        base_wall = statistics.median(w for _, w in times[base])
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(f"  {name:36} {cpu * 1000:7.1f}ms {(cpu - base_cpu) * 1000:+12.1f}ms "
              f"{wall * 1000:7.1f}ms {(wall - base_wall) * 1000:+12.1f}ms")


if __name__ == "__main__":
    main()
