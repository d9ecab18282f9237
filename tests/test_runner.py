"""The runner owns the traced program's whole life (end to end, rethook in a subprocess):
``-m`` packages, child processes followed into one trace, and no way of ending that loses what
was recorded. Programs live in tests/runner_programs; each traced run is compared with the
untraced one (stdout, stderr but rethook's lines, exit status)."""

from __future__ import annotations

import collections
import os
import re
import resource
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from tests.test_cli import _env

from rethook.buffer.traceread import TraceReader
from rethook.engine.select import choose_core

PROGRAMS = Path(__file__).parent / "runner_programs"


def run(*args: str, cwd: Path = PROGRAMS) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=300)


def own_stderr(stderr: str) -> str:
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not line.startswith("rethook: "))


def calls(path: Path, name: str) -> collections.Counter[int]:
    """Returns of function ``name`` per process, in a trace file."""
    with TraceReader(path) as reader:
        exit_id = reader.formats.by_name("funcgraph_exit").id
        pids = reader.thread_pids
        return collections.Counter(pids.get(ev[2]) for ev in reader.events()
                                   if ev[0] == exit_id and ev[4] == name)


def test_module_package_with_empty_init(tmp_path: Path) -> None:
    plain = run("-m", "emptypkg")
    out = tmp_path / "t.dat"
    for flt in ("emptypkg.*", "*:mod:emptypkg"):
        r = run("-m", "rethook", "record", "-o", str(out), "-l", flt, "-m", "emptypkg")
        assert (r.returncode, r.stdout, own_stderr(r.stderr)) == (
            plain.returncode, plain.stdout, plain.stderr)
        assert sum(calls(out, "emptypkg.work.step").values()) == 5
    r = run("-m", "rethook", "record", "-o", str(out), "-l", "emptypkg.nope*", "-m", "emptypkg")
    assert r.returncode == 2 and "no function matches 'emptypkg.nope*'" in r.stderr
    assert "^" in r.stderr
    listed = run("-m", "rethook", "list", "-f", "-m", "emptypkg")
    assert listed.stdout.split() == ["emptypkg.work.step", "emptypkg.work.total",
                                     "emptypkg.work.total.<locals>.<genexpr>@6"]


def test_children_followed_into_one_trace(tmp_path: Path) -> None:
    plain = run("procs.py")
    out = tmp_path / "t.dat"
    r = run("-m", "rethook", "record", "-o", str(out), "-l", "work", "-l", "leaf", "procs.py")
    pids = re.compile(r"leaf \d+ ")
    assert (r.returncode, pids.sub("", r.stdout), own_stderr(r.stderr)) == (
        plain.returncode, pids.sub("", plain.stdout), plain.stderr), r.stderr
    assert "not traced" not in r.stderr
    work = calls(out, "__main__.work") + calls(out, "__mp_main__.work")
    assert sum(work.values()) == int(re.search(r"work (\d+)", r.stdout).group(1))
    assert len(work) >= 4  # fork, spawn and forkserver workers and the executor's
    leaves = {int(pid): int(n) for pid, n in re.findall(r"leaf (\d+) (\d+)", r.stdout)}
    assert len(leaves) == 3 and dict(calls(out, "__main__.leaf")) == leaves
    report = run("-m", "rethook", "report", "-i", str(out))
    assert report.returncode == 0 and " => " in report.stdout  # process switches shown
    info = run("-m", "rethook", "info", "-i", str(out))
    with TraceReader(out) as reader:
        processes = reader.processes
    assert info.returncode == 0 and len(processes) >= 9
    assert re.search(rf"^processes:\s+{len(processes)}$", info.stdout, re.M), info.stdout
    assert all(re.search(rf"^\s+{pid}\s", info.stdout, re.M) for pid in processes)


def test_the_run_directory_is_made_when_a_child_needs_it(tmp_path: Path) -> None:
    """``trace.dat.procs/`` is made when the program first starts or forks another, not
    before (most programs start none); a previous run's leftovers are not this run's
    children; a fork child's and a started Python's events are in the trace; no directory
    is left either way."""
    out = tmp_path / "t.dat"
    procs = tmp_path / "t.dat.procs"
    (tmp_path / "alone.py").write_text(
        "import os, sys\n"
        "def f():\n"
        "    return 1\n"
        f"print(f(), os.path.exists({str(procs)!r}))\n")
    (tmp_path / "parent.py").write_text(
        "import os, subprocess, sys\n"
        "def f():\n"
        "    return 1\n"
        "def g():  # (the started Python's g is traced under the same -l)\n"
        "    return 2\n"
        f"print(os.path.exists({str(procs)!r}))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    f()\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        f"print(os.path.exists({str(procs)!r}))\n"
        "subprocess.run([sys.executable, '-c', 'def g():\\n    return 2\\ng()'], check=True)\n")
    procs.mkdir()  # a previous run's, killed: its child's file must not be taken in
    (procs / "12345.dat").write_bytes(b"leftover")
    r = run("-m", "rethook", "record", "-o", str(out), "-l", "f", "alone.py", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "1 False\n", r.stderr
    assert not procs.exists() and "12345" not in r.stderr
    assert sum(calls(out, "__main__.f").values()) == 1
    r = run("-m", "rethook", "record", "-o", str(out), "-l", "f", "-l", "g", "parent.py",
            cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "False\nTrue\n", r.stderr
    assert "not traced" not in r.stderr and not procs.exists()
    assert len(calls(out, "__main__.f")) == 1 and sum(calls(out, "__main__.g").values()) == 1


def _until_ready(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=PROGRAMS, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_fatal_signal_finishes_the_trace(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "t.dat"
    ends = []
    for cmd in (["ending.py"], ["-m", "rethook", "record", "-o", str(out), "ending.py"]):
        proc = _start(*cmd)
        _until_ready(proc)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
        ends.append((proc.returncode, stdout, own_stderr(stderr)))
    assert ends[0] == ends[1] and ends[0][0] == -sig
    with TraceReader(out) as reader:  # complete: the END chunk is there
        assert reader.all_meta["end_time"] and reader.damage is None
    assert sum(calls(out, "__main__.spin").values()) >= 100
    report = run("-m", "rethook", "report", "-i", str(out))
    assert report.returncode == 0 and "__main__.main unfinished" in report.stdout


@pytest.mark.parametrize("end", ["SIGTERM", "return"])
def test_threads_still_calling_at_the_end_lose_nothing(tmp_path: Path, end: str) -> None:
    """Daemon threads make events until tracing stops, millions a second: the drain keeps
    taking them until then (a ring left without one fills within milliseconds)."""
    out = tmp_path / "t.dat"
    proc = _start("-m", "rethook", "record", "--blocking-timeout", "60000", "-l", "*",
                  "-o", str(out), "spinners.py", *([] if end == "SIGTERM" else ["return"]))
    _until_ready(proc)
    if end == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == (-signal.SIGTERM if end == "SIGTERM" else 0), stderr
    said = re.search(r"rethook: ([\d,]+) events \(([\d,]+) lost\)", stderr)
    assert said, stderr
    if choose_core().capabilities.native_users:  # native rings: the threads wait for the drain
        assert said[2] == "0", stderr
    else:  # Python rings have no blocking: what they lose is counted, with advice
        assert said[2] == "0" or "-b KB" in stderr, stderr
    with TraceReader(out) as reader:
        assert reader.damage is None


def test_os_exit_and_sigkill(tmp_path: Path) -> None:
    plain = run("ending.py", "exit")
    out = tmp_path / "t.dat"
    r = run("-m", "rethook", "record", "-o", str(out), "ending.py", "exit")
    assert (r.returncode, r.stdout, own_stderr(r.stderr)) == (3, "ready\n", plain.stderr)
    assert sum(calls(out, "__main__.spin").values()) == 100
    # SIGKILL: nothing runs; the file holds what was drained, readable without its end
    proc = _start("-m", "rethook", "record", "-o", str(out), "ending.py")
    _until_ready(proc)
    while b"EVTS" not in out.read_bytes():  # wait for a drain round to reach the file
        time.sleep(0.01)
    proc.kill()
    proc.communicate(timeout=60)
    report = run("-m", "rethook", "report", "-i", str(out))
    assert report.returncode == 0 and "__main__.spin" in report.stdout
    assert "warning" in report.stderr and "no end" in report.stderr
    exported = tmp_path / "t.pftrace"
    r = run("-m", "rethook", "export", "-i", str(out), "--format", "perfetto", "-o", str(exported))
    assert r.returncode == 0 and exported.stat().st_size > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_own_threads_leave_signals_to_the_program() -> None:
    """A signal sent to the process must reach the program's threads, as untraced: one that
    landed on rethook's drain thread would not wake the main thread from a blocking wait."""
    r = run("-m", "rethook", "record", "-o", os.devnull, "sigmasks.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() and set(r.stdout.split()) == {"True"}, r.stdout


#: A program whose fork child makes fib(20)'s 21,891 calls.
FORK_STORM = ("import os\n\n"
              "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
              "pid = os.fork()\n"
              "if pid == 0:\n    fib(20)\n    os._exit(0)\n"
              "os.waitpid(pid, 0)\n")


def test_children_losses_are_in_the_summary(tmp_path: Path) -> None:
    """Events a child process lost are counted in the run's summary, as the file has them."""
    prog = tmp_path / "storm.py"
    prog.write_text(FORK_STORM)
    out = tmp_path / "t.dat"
    r = run("-m", "rethook", "record", "-b", "16", "--blocking-timeout", "0", "-o", str(out),
            str(prog), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = re.search(r"rethook: ([\d,]+) events \(([\d,]+) lost\)", r.stderr)
    assert said, r.stderr
    with TraceReader(out) as reader:
        events = sum(1 for _ in reader.events())
        lost = sum(item.count for item in reader.events(lost=True) if not isinstance(item, tuple))
    assert (int(said.group(1).replace(",", "")), int(said.group(2).replace(",", ""))) == (
        events, lost)


def test_a_child_waits_for_its_drain_rather_than_lose(tmp_path: Path) -> None:
    """A fork child's recorder blocks as the first process's does (the run's
    --blocking-timeout): with a ring far too small for it, the child loses nothing."""
    if os.environ.get("RETHOOK_ENGINE") == "python":
        pytest.skip("blocking is the C core's: its native rings")
    prog = tmp_path / "storm.py"
    prog.write_text(FORK_STORM)
    out = tmp_path / "t.dat"
    # (a timeout no loaded machine reaches: lossless by design, not by timing)
    r = run("-m", "rethook", "record", "-b", "16", "--blocking-timeout", "600000", "-o",
            str(out), str(prog), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = re.search(r"rethook: ([\d,]+) events \(([\d,]+) lost\)", r.stderr)
    assert said, r.stderr
    assert (said.group(1), said.group(2)) == (f"{2 * 21891:,}", "0")  # fib(20): 21,891 calls


_STUCK = """
import os, signal, sys, threading, time
from rethook.runner import exits

exits.guard(lambda why: print("finished", why, flush=True))
r, w = exits._wakeup
os.write(w, bytes([signal.SIGTERM]))  # CPython received it; its handler never ran


def drain():
    while True:
        exits.check_signals()
        time.sleep(0.01)


threading.Thread(target=drain, daemon=True).start()
print("waiting", flush=True)
threading.Event().wait()  # the main thread blocked for good, as a pool worker on its queue
"""


def test_a_fatal_signal_whose_handler_did_not_run_is_raised_again(tmp_path: Path) -> None:
    """The wakeup fd shows a SIGTERM CPython noted but never handled (it came just before the
    main thread blocked): rethook's drain raises it again in the main thread, and the process
    ends by it with its trace finished, as it would have ended untraced."""
    r = subprocess.run([sys.executable, "-c", _STUCK], env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert (r.returncode, r.stdout) == (-signal.SIGTERM, "waiting\nfinished SIGTERM\n"), r.stderr


def test_the_default_filters_import_walk_reads_what_ast_reads() -> None:
    """runner.program reads a local module's imports from its compiled code (no ``ast`` at
    start-up): the names are what ``ast.walk`` finds, on every module of a few standard
    packages (syntax errors included: none), each once (the order is the compiler's)."""
    import ast
    import sysconfig

    from rethook.runner.program import _imported_names

    def by_ast(path: str) -> list[str]:
        try:
            tree = ast.parse(Path(path).read_bytes(), path)
        except (SyntaxError, ValueError):
            return []
        names: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.append(node.module.split(".")[0])
        return list(dict.fromkeys(names))

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [str(p) for pkg in ("asyncio", "email", "json", "importlib", "concurrent")
             for p in sorted((stdlib / pkg).rglob("*.py"))]
    files += [str(p) for p in sorted(Path(__file__).parent.rglob("*.py"))]
    assert len(files) > 100
    for path in files:
        names = _imported_names(path)
        assert len(names) == len(set(names)) and set(names) == set(by_ast(path)), path


_SOURCES = [
    "x = 1\n",
    b"# -*- coding: latin-1 -*-\ns = '\xe9'\n",
    "\ufeffs = 'bom'\n".encode("utf-8"),
    "def f(a: int) -> 'str':\n    return [i async for i in a]\n",
    "x = (",  # a syntax error
    b"x = 1\x00",  # a null byte
    "def f():\n    yield from g()\n\nclass C:\n    import os as o\n",
]


@pytest.mark.parametrize("source", _SOURCES)
def test_compile_exec_compiles_as_compile_does(source: str | bytes) -> None:
    """The program is compiled as compile(source, path, "exec", dont_inherit=True) would (no
    __future__ flag of rethook's own leaks into it), without its AST check."""
    from rethook.runner.program import compile_exec

    def outcome(fn):
        try:
            return fn(source, "prog.py")
        except (SyntaxError, ValueError) as e:
            return type(e), e.args

    want = outcome(lambda s, f: compile(s, f, "exec", dont_inherit=True))
    assert outcome(compile_exec) == want
    if isinstance(want, types.CodeType):  # the same code: annotations stay evaluated
        ns: dict = {}
        exec(outcome(compile_exec), ns)
        f = ns.get("f")
        if f is not None and getattr(f, "__annotations__", None):
            assert f.__annotations__["a"] is int


# --- wrapping a module as the program imports it (follow._when_imported) ------------------------
def test_a_module_is_wrapped_as_it_is_imported(tmp_path: Path, monkeypatch) -> None:
    """follow.install wraps _posixsubprocess.fork_exec when the program imports it: a source
    module (its loader instance wrapped), a frozen one (a loader shared by many modules: a
    loader of its own wraps it), one imported already (at once); the finder leaves
    sys.meta_path once it has found its module, and the module is the one imported."""
    from rethook.runner import follow

    (tmp_path / "rh_later_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # (as it was, whatever happens)
    seen: list[types.ModuleType] = []
    meta = list(sys.meta_path)
    for k, name in enumerate(("rh_later_mod", "__hello__")):
        monkeypatch.delitem(sys.modules, name, raising=False)
        follow._when_imported(name, seen.append)
        assert len(sys.meta_path) == len(meta) + k + 1 and not seen
    import __hello__  # noqa: F401  (a frozen module: prints "Hello world!")

    import rh_later_mod

    assert [m.__name__ for m in seen] == ["__hello__", "rh_later_mod"]
    assert seen[1] is rh_later_mod and rh_later_mod.VALUE == 1
    assert sys.meta_path == meta
    follow._when_imported("rh_later_mod", seen.append)  # imported already: at once
    assert seen[2] is rh_later_mod and sys.meta_path == meta
