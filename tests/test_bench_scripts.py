"""``./dev.sh bench [ARGS]`` passes the same arguments to every script in bench/: each takes
``--quick`` and ``--repeat N``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("bench_*.py")))
def test_bench_script_takes_the_common_arguments(script: str) -> None:
    r = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--quick" in r.stdout and "--repeat" in r.stdout, r.stdout


def test_marks_give_wall_and_thread_cpu_times(tmp_path: Path, monkeypatch) -> None:
    """A program's marks (bench/programs/_marks.py) as bench_peers and bench_phases read them:
    the wall time (field 1) and the marking thread's CPU time (field 2), by phase."""
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.syspath_prepend(str(BENCH / "programs"))
    marks = tmp_path / "marks.txt"
    monkeypatch.setenv("BENCH_MARKS", str(marks))
    sys.modules.pop("_marks", None)
    import _marks  # (reads BENCH_MARKS as it is imported)

    for name in ("start", "imported", "round", "round", "round", "end"):
        _marks.mark(name)
    import bench_peers
    import bench_phases

    wall = bench_peers._read_marks(marks)
    cpu = bench_peers._read_marks(marks, field=2)
    assert [n for n, _ in wall] == [n for n, _ in cpu] == [
        "start", "imported", "round", "round", "round", "end"]
    assert all(b >= a for (_, a), (_, b) in zip(wall, wall[1:], strict=False))
    phases = bench_phases._split(cpu)
    assert set(phases) == set(bench_phases.RUN_PHASES) and min(phases.values()) >= 0
    sys.modules.pop("_marks", None)
