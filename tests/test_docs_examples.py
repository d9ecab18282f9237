"""Every example in README.md and docs/*.md runs, as written.

The convention (README.md, "Examples in these pages run"):

* every fenced block says what it is with an info string; a bare ```` ``` ```` fence is an
  error here, so nothing escapes by omission;
* ```` ```sh ```` blocks are shell commands, ```` ```console ```` blocks a session whose
  ``$ `` lines are the commands (the other lines show output, not compared: timings and ids
  vary), ```` ```python ```` blocks programs: all are run; anything else (``text`` for
  output, grammars and layouts, ``sql``, ...) is not;
* the blocks of one page run in order, in one fresh directory holding a copy of
  docs/examples/ (the programs the examples trace: ``app.py``, ``prog.py``, the ``myapp``
  package), with this interpreter's ``rethook`` and ``python`` first on PATH; so a page can
  record a trace in one block and read it in the next;
* a command must exit with status 0 (``set -e -o pipefail``), a Python block too;
* ``<!-- docs-test: skip: REASON -->`` on the line before a fence leaves that block out;
  rare, and the reason says why (a tool that is not installed, a command that would run
  this test suite).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = ROOT / "docs" / "examples"
RUN = ("sh", "console", "python")
SKIP = re.compile(r"<!--\s*docs-test:\s*skip:\s*(\S.*?)\s*-->")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("RETHOOK_NO_OTHER_CORE")),
    reason="the docs' examples run once, on the default core (test_ccore reruns the suite "
           "on the other core: the examples are about the text, not the core)")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    info: str
    text: str
    skip: str | None  # the reason, for a block marked skip

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.info})"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = re.match(r"^(`{3,})([^`]*)$", lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group(1), m.group(2).strip()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        assert end < len(lines), f"{page.name}:{i + 1}: the fence is never closed"
        skip = SKIP.search(lines[i - 1]) if i else None
        out.append(Block(page, i + 1, info, "\n".join(lines[i + 1:end]) + "\n",
                         skip.group(1) if skip else None))
        i = end + 1
    return out


def commands(block: Block) -> str:
    """The shell script of a sh or console block."""
    if block.info == "sh":
        return block.text
    script, more = [], False
    for line in block.text.splitlines():
        if line.startswith("$ ") or more:
            script.append(line[2:] if line.startswith("$ ") and not more else line)
            more = line.endswith("\\")
    return "\n".join(script) + "\n"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "FORCE_COLOR", "TTY_COMPATIBLE", "PYTHONWARNINGS")}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def run(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if block.info == "python":
        script = cwd / f"example_{block.page.stem}_{block.line}.py"
        script.write_text(block.text, encoding="utf-8")
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", commands(block)]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def test_every_block_says_what_it_is():
    bare = [str(b) for page in PAGES for b in blocks(page) if not b.info]
    assert not bare, f"fenced blocks without an info string (sh, python, text...): {bare}"
    skipped = [f"{b}: {b.skip}" for page in PAGES for b in blocks(page) if b.skip]
    assert len(skipped) <= 3, f"skipped examples must stay rare: {skipped}"
    assert all(b.info in RUN for page in PAGES for b in blocks(page) if b.skip)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_examples_run(page: Path, tmp_path: Path):
    todo = [b for b in blocks(page) if b.info in RUN and b.skip is None]
    if not todo:
        pytest.skip(f"{page.name} has no runnable examples")
    work = tmp_path / "examples"
    shutil.copytree(EXAMPLES, work, ignore=shutil.ignore_patterns("__pycache__"))
    env = _env()
    for block in todo:
        r = run(block, work, env)
        assert r.returncode == 0, (
            f"{block} failed with status {r.returncode}\n--- example\n{block.text}"
            f"--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}")
        assert "Traceback" not in r.stderr, f"{block}\n{r.stderr[-3000:]}"
