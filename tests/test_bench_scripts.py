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
