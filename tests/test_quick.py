"""rethook.cli.quick, the parser of record, stream and profile without click: whatever it
takes, click reads the same, and a command line runs the same whichever of the two parsed it.

- a property test draws command lines from the commands' flags (known and unknown ones,
  values good and bad, attached and separate, ``--``, ``-m``, program arguments that look like
  flags) and checks that :func:`quick.parse` either declines or gives exactly click's
  parameters;
- end to end, ``rethook record ...`` (the quick path where it can) and the same command given
  to click's ``main()`` directly print the same, write the same events and exit the same, for
  good runs and for each kind of usage error; stream and profile print the same.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rethook.cli import quick
from rethook.cli.main import cli


def click_params(args: list[str], command: str = "record") -> dict[str, object] | None:
    """What click's command gets for ``args`` (None if click refuses them)."""
    parent = click.Context(cli, info_name="rethook", **cli.context_settings)
    cmd = cli.commands[command]
    try:
        ctx = cmd.make_context(command, list(args), parent=parent)
    except click.ClickException:
        return None
    except click.exceptions.Exit:  # --help
        return None
    return dict(ctx.params)


VALUES = st.sampled_from(["main", "fib*", "*", "!x", "-x", "--y", "", "=", "a=b", "0", "1",
                          "5", "-1", "07", "99999999999999999999", "function", "nop",
                          "function_graph", "Function", "funcgraph-retval", "t.dat"])
FLAG_NAMES = st.sampled_from(["-p", "-l", "-n", "-g", "--graph-notrace", "-O",
                              "--max-graph-depth", "--tracing-thresh", "-b", "--no-follow",
                              "--blocking-timeout", "-o", "-e", "-f", "-R", "-P",
                              "--children", "--duration", "-h", "--help", "--bogus", "-x",
                              "--no-follo", "-graph-notrace", "--module", "--sort",
                              "--limit", "--per-process"])


@st.composite
def tokens(draw: st.DrawFn) -> list[str]:
    """One flag as a user might write it: separate value, attached value, or bare."""
    name = draw(FLAG_NAMES)
    value = draw(VALUES)
    form = draw(st.sampled_from(["bare", "separate", "attached"]))
    if form == "separate":
        return [name, value]
    if form == "attached":
        return [name + ("=" if name.startswith("--") else "") + value]
    return [name]


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    args = [tok for part in draw(st.lists(tokens(), max_size=6)) for tok in part]
    tail = draw(st.sampled_from(["script", "module", "module-attached", "dashdash", "none"]))
    rest = draw(st.lists(st.sampled_from(["-l", "x", "-h", "--", "-m", "y.py"]), max_size=3))
    if tail == "script":
        args += ["prog.py", *rest]
    elif tail == "module":
        args += ["-m", "pkg.tool", *rest]
    elif tail == "module-attached":
        args += ["-mpkg.tool", *rest]
    elif tail == "dashdash":
        args += ["--", *rest]
    return args


@given(st.sampled_from(sorted(quick.FLAGS)), command_lines())
@settings(max_examples=600, deadline=None)
def test_what_quick_takes_click_reads_the_same(command: str, args: list[str]) -> None:
    parsed = quick.parse(command, args)
    if parsed is None:
        return  # click reads it (and shows its errors and help)
    params, module, program = parsed
    theirs = click_params(args, command)
    assert theirs is not None, args
    assert theirs.pop("module") == module
    assert theirs.pop("program") == program
    for name, value in params.items():
        assert theirs.pop(name) == value, (args, name)
    assert not any(theirs.values()), (args, theirs)  # -P, -e, ...: quick declines those


def test_quick_takes_the_usual_command_lines() -> None:
    """The flags of a plain record are read without click (the point of the module)."""
    for args in (["prog.py"], ["-l", "*", "-o", "t.dat", "prog.py", "-v"],
                 ["-p", "function", "-lmain", "-O", "funcgraph-retval", "-b", "1024",
                  "--max-graph-depth=3", "--no-follow", "-m", "pkg.tool", "-x"],
                 ["--blocking-timeout", "0", "--", "prog.py"]):
        assert quick.parse("record", args) is not None, args
    assert quick.parse("stream", ["-l", "main", "-b", "64", "prog.py"]) is not None
    assert quick.parse("profile", ["-l", "main", "-O", "nosleep-time", "prog.py"]) is not None
    assert quick.parse("profile", ["--sort", "self", "prog.py"]) is None  # click's
    params, module, program = quick.parse("record",
                                          ["-lmain", "-l", "x*", "-m", "pkg.tool", "-l", "y"])
    assert params["filters"] == ("main", "x*") and module == "pkg.tool"
    assert program == ("-l", "y")


def test_a_flags_value_that_looks_like_a_probe_flag_is_a_value() -> None:
    """``-l -f``: a filter on the name '-f', not the -f of a probe event (click's path once
    took it for one; the property test above found it)."""
    assert click_params(["-l", "-f", "prog.py"])["filters"] == ("-f",)
    assert quick.parse("record", ["-l", "-f", "prog.py"])[0]["filters"] == ("-f",)


# --- end to end: the quick path against click's -------------------------------------------
PROGRAM = textwrap.dedent("""
    import sys

    def work(n):
        return n * 2

    def main():
        total = sum(work(i) for i in range(50))
        print("total", total, sys.argv[1:])
        print("to stderr", file=sys.stderr)
        return 3

    sys.exit(main())
""")

VIA_CLICK = ("import sys; sys.argv[0] = 'rethook'; from rethook.cli.main import main; main()")


def _run(tmp_path: Path, via_click: bool, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COVERAGE_PROCESS_START")}
    head = [sys.executable, "-c", VIA_CLICK] if via_click else [sys.executable, "-m", "rethook"]
    return subprocess.run([*head, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args", [
    ["record", "-o", "A.dat", "prog.py", "-l", "--flag"],
    ["record", "-l", "*", "-o", "A.dat", "prog.py"],
    ["record", "-l", "main", "-l", "work", "-O", "funcgraph-retval", "-o", "A.dat", "prog.py"],
    ["record", "-p", "function", "-l", "work", "--no-follow", "-o", "A.dat", "prog.py"],
    ["record", "-o", "A.dat", "missing.py"],
    ["record", "-l", "no_such_function", "-o", "A.dat", "prog.py"],
    ["record", "-O", "nobogus", "-o", "A.dat", "prog.py"],
    ["record", "-o", "A.dat"],
    ["record", "-o", "A.dat", "-m", "no_such_module"],
    ["record", "-o", "no/such/dir/A.dat", "prog.py"],
    ["stream", "-l", "work", "prog.py"],
    ["stream", "-l", "no_such_function", "prog.py"],
    ["profile", "prog.py", "x"],
    ["profile", "-l", "work", "-O", "nograph-time", "prog.py"],
    ["profile", "-o", "A.prof", "prog.py"],
], ids=" ".join)
def test_the_quick_path_runs_as_click_does(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    quick_run = _run(tmp_path, False, args)
    quick_file = tmp_path / "A.dat"
    quick_events = _events(tmp_path, quick_file)
    click_run = _run(tmp_path, True, args)
    assert quick_run.returncode == click_run.returncode
    assert _stable(quick_run.stdout) == _stable(click_run.stdout)
    assert _stable(quick_run.stderr) == _stable(click_run.stderr)
    assert "Traceback" not in quick_run.stderr
    assert quick_events == _events(tmp_path, quick_file)


def _stable(text: str) -> list[str]:
    """Output with what differs between two runs (times, sizes, addresses, thread ids) and
    the column widths they make taken out."""
    return [" ".join(TIMES.sub("N", VARYING.sub("", line)).split())
            for line in text.splitlines()]


def _events(tmp_path: Path, path: Path) -> list[str] | None:
    """The recorded calls, by name and depth (None if no file was written); removes it."""
    if not path.exists():
        return None
    r = subprocess.run([sys.executable, "-m", "rethook", "report", "-i", str(path), "-O",
                        "nofuncgraph-duration"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    path.unlink()
    assert r.returncode == 0, r.stderr
    return [VARYING.sub("", line) for line in r.stdout.splitlines() if not line.startswith("#")]


#: What differs between two runs of a program: objects' addresses, thread ids, timestamps.
VARYING = re.compile(r"0x[0-9a-f]+|(?<=-)\d+(?= )|\d+\.\d{6}(?=:)")
#: Durations (with function_graph's marks of long ones), sizes and their units (stream's
#: lines, profile's table, record's summary).
TIMES = re.compile(r"([+!#*@$] +)?\d+(\.\d+)?( ?[a-zA-Z]{1,2}\b)?")
