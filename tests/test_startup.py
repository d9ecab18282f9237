"""Start-up cost, guarded without timing: what the command line imports before it needs it.

Every run of ``rethook`` pays for the modules it imports (and a registry scan meets every
function they define), so each command loads only what it uses: ``rethook --help`` loads
click and the command line's own modules; ``record`` loads the engine, the ring buffer and the
trace file writer, but not the probe machinery (``-e`` loads it), the text views (``stream``
and ``report`` do), perfetto, rich, platform, tempfile, traceback, dataclasses or typing. The traced
program itself reports ``sys.modules`` here, as it sees them while it runs under ``rethook record``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: Loaded by the command line before it knows what to do (``--help``): nothing else of rethook.
HELP_ALLOWED = ("rethook.cli", "rethook.tracers",  # the tracers' package: their names only
                "rethook.limits", "rethook.printable", "rethook.gcpause",  # small, import
                "rethook.frozen")  # nothing of rethook's
#: Never needed to record a trace without probes.
NOT_FOR_RECORD = ("rethook.probes.events", "rethook.probes.fetch", "rethook.probes.evfilter",
                  "rethook.probes.hist", "rethook.probes.triggers", "rethook.probes.dynevent",
                  "rethook.output", "rethook.cli.reporting", "rethook.cli.listing", "perfetto",
                  "rich")
#: Standard modules rethook imports only in the commands that use them (click itself imports
#: some of them on some Pythons: 3.12's uuid imports platform). subprocess is the program's to
#: import: children are followed without it (follow.install). traceback (with textwrap and
#: _colorize, ~2 ms) only when a failure is reported. dataclasses: none on these paths (each
#: costs ~1 ms to create; rethook.frozen makes the records).
STDLIB_LATER = ("platform", "tempfile", "subprocess", "traceback", "dataclasses")
#: Standard modules a plain ``record`` does not load unless the program does (each ~0.3-1 ms
#: that most programs, and trace0, never pay: contextlib alone is ~3.6 M instructions).
#: _posixsubprocess is wrapped as the program imports it (follow.install); signal's enums are
#: left to programs that use them (rethook's handlers use _signal). json imports re, which
#: imports enum and functools: ~10 ms together, for a program that imports none of them
#: (rethook.jsontext writes JSON without them; globs compile regexes when they need one).
#: 3.12's threading imports functools itself (and with it collections, reprlib and operator:
#: ~2.5 ms that 3.13 does not pay). resource is a C extension (~0.2 ms to load): the memory
#: limits are read from /proc/self/limits. weakref (~0.5 ms), array (which imports
#: collections), importlib (~0.4 ms; the console script has no runpy to load it): rethook uses
#: what they re-export from their C modules (_weakref, _collections, _frozen_importlib...).
STDLIB_UNUSED = ("contextlib", "heapq", "bisect", "importlib", "_posixsubprocess",
                 "signal", "json", "re", "enum", "resource", "weakref", "array",
                 *(("functools", "collections", "reprlib", "operator")
                   if sys.version_info >= (3, 13) else ()))
#: The probe machinery, which a ``-e`` definition loads.
PROBES = ("rethook.probes.events", "rethook.probes.fetch", "rethook.probes.evfilter")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def _ours(modules: set[str]) -> set[str]:
    """The modules not loaded by importing click alone."""
    return modules - _modules_after("import sys, click; print(' '.join(sys.modules))")


def test_help_loads_only_the_command_line():
    mods = _modules_after(textwrap.dedent("""
        import io, sys
        from rethook.cli.main import main
        sys.argv, sys.stdout = ["rethook", "--help"], io.StringIO()
        try:
            main()
        except SystemExit:
            pass
        assert "Usage: rethook" in sys.stdout.getvalue()
        print(" ".join(sys.modules), file=sys.__stdout__)
    """))
    ours = sorted(m for m in mods if m.startswith("rethook."))
    assert [m for m in ours if not m.startswith(HELP_ALLOWED)] == []
    assert "rethook.tracers.base" not in mods  # the tracers are named, not imported
    assert _loaded(_ours(mods), (*STDLIB_LATER, "rich", "signal")) == []


#: The console script, as users run it (``python -m rethook`` also loads what runpy imports).
SCRIPT = [sys.executable, "-c", "import sys; from rethook.cli import entry; sys.exit(entry())"]


def _record(tmp_path: Path, *flags: str, command: str = "record",
            launch: list[str] | None = None) -> set[str]:
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""
        import sys

        def main():
            with open(sys.argv[1], "w") as f:
                f.write(" ".join(sys.modules))

        main()
    """))
    seen = tmp_path / "modules.txt"
    out = ["-o", str(tmp_path / "t.dat")] if command == "record" else []
    launch = launch or [sys.executable, "-m", "rethook"]
    r = subprocess.run([*launch, command, *flags, *out, str(prog), str(seen)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert command == "profile" or "0 lost" in r.stderr
    return set(seen.read_text().split())


def test_record_loads_no_probes_or_text_views(tmp_path):
    mods = _record(tmp_path)
    assert _loaded(mods, NOT_FOR_RECORD) == []
    assert _loaded(_ours(mods), STDLIB_LATER) == []
    # typing (~3 ms, more with NamedTuple's annotations) is for type checkers only: names
    # under TYPE_CHECKING, records made by rethook.frozen, the cores' Protocol in coreapi
    assert _loaded(mods, ("typing", "rethook.engine.coreapi")) == []
    assert "rethook.buffer.tracefile" in mods  # the sanity of the check: it sees rethook


@pytest.mark.parametrize("flags", [[], ["-l", "*"]])
def test_record_loads_only_the_standard_modules_it_uses(tmp_path, flags):
    """Not through click's imports (_ours): these are compared with a program that imports
    nothing, and the kretprobe API (rethook.probes.kprobes) waits for its first use."""
    mods = _record(tmp_path, *flags, launch=SCRIPT)
    assert _loaded(mods, STDLIB_UNUSED) == []
    assert "rethook.probes.kprobes" not in mods
    assert "rethook.probes.dynamic" in mods  # (the dynamic_events file: tiny, imports none)


def test_a_probe_loads_the_probe_machinery(tmp_path):
    mods = _record(tmp_path, "-p", "nop", "-e", "r:done __main__.main ret=$retval")
    assert _loaded(mods, PROBES) == sorted(PROBES)
    assert "click" in mods  # -e is click's to parse (rethook.cli.quick declines it)


@pytest.mark.parametrize("command, flags", [
    ("record", ["-l", "*", "-O", "funcgraph-retval", "--max-graph-depth", "5"]),
    ("stream", ["-l", "main"]),
    ("profile", ["-l", "main", "-O", "nosleep-time"]),
])
def test_the_program_commands_run_without_click(tmp_path, command, flags):
    """A plain record, stream or profile is parsed by rethook.cli.quick: click (~1/3 of the
    start) is not loaded, nor what it loads and rethook does not need."""
    mods = _record(tmp_path, *flags, command=command)
    assert _loaded(mods, ("click", "inspect", "difflib", "gettext")) == []


def test_record_of_a_program_without_functions_scans_nothing(tmp_path):
    """Checking the default filter (``*:mod:__main__``) and the ``*`` that then turns tracing
    off needs no walk of the heap (``gc.get_objects()``, ~10 ms at start-up): the module is
    loaded, and loaded modules hold functions."""
    prog = tmp_path / "empty.py"
    prog.write_text("x = 1\n")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import gc, sys
        from rethook.cli.main import main
        walks = []
        real = gc.get_objects
        gc.get_objects = lambda *a: walks.append(1) or real(*a)
        sys.argv = ["rethook", "record", "-o", {str(tmp_path / "t.dat")!r}, {str(prog)!r}]
        try:
            main()
        except SystemExit:
            pass
        print(len(walks), file=sys.__stdout__)
    """)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "defines no functions of its own" in out.stderr
    assert out.stdout.split() == ["0"]


def test_the_program_finds_the_collector_as_python_left_it(tmp_path):
    """record, stream and profile pause the cyclic GC for their own set-up (gcpause) and
    resume it before the program's first line: the program finds it enabled, with Python's
    thresholds, collecting the program's garbage; what existed before its first line is
    frozen (a larger freeze count: rethook's objects stay out of every collection)."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent("""
        import gc
        import weakref

        class Node:
            pass

        def cycle():
            a, b = Node(), Node()
            a.b, b.a = b, a
            return weakref.ref(a)

        def show():
            ref = cycle()
            gc.collect()
            print(gc.isenabled(), gc.get_threshold(), ref() is None)
            print("frozen", gc.get_freeze_count())

        show()
    """))
    plain = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True,
                           timeout=120)
    state, frozen = plain.stdout.splitlines()
    assert state.startswith("True (") and state.endswith(" True")
    for command in (["record", "-o", str(tmp_path / "t.dat")], ["stream"], ["profile"]):
        r = subprocess.run([sys.executable, "-m", "rethook", *command, str(prog)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert state in lines, command  # (stream: events too)
        counts = [int(line.split()[1]) for line in lines if line.startswith("frozen ")]
        assert counts and counts[0] > int(frozen.split()[1]), command


def test_a_command_that_fails_before_the_program_resumes_the_collector(tmp_path):
    """A bad filter ends record before the program runs: in-process (as tests and embedders
    call the command line) the collector is running again afterwards."""
    import gc

    from click.testing import CliRunner

    from rethook.cli.main import cli

    prog = tmp_path / "prog.py"
    prog.write_text("def f():\n    pass\n\nf()\n")
    assert gc.isenabled()
    r = CliRunner().invoke(cli, ["record", "-l", "no_such_function_anywhere", "-o",
                                 str(tmp_path / "t.dat"), str(prog)])
    assert r.exit_code == 2, r.output
    assert gc.isenabled()
