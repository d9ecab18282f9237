"""End-to-end tests of the ``rethook`` command line: real subprocesses running real programs.

Programs live in tests/cli_programs. A traced run must look, from the outside, exactly like a
plain ``python`` run (stdout, stderr but rethook's summary line, exit status); reports are
compared line for line after normalising durations, timestamps and thread ids, nothing else.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).parent / "cli_programs"
SUMMARY = re.compile(r"^rethook: ([\d,]+) events \(([\d,]+) lost\) (written to|streamed)")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # PYTHONUNBUFFERED would let `stream` lines land between the pieces one print() writes
    for name in ("PYTHONPATH", "PYTHONWARNINGS", "PYTHONSTARTUP", "PYTHONINSPECT",
                 "PYTHONUNBUFFERED", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    env["PYTHONIOENCODING"] = "utf-8"
    return env


def run(*args: str, cwd: Path = PROGRAMS) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=120)


def rethook(*args: str, cwd: Path = PROGRAMS) -> subprocess.CompletedProcess[str]:
    return run("-m", "rethook", *args, cwd=cwd)


def strip_summary(stderr: str) -> tuple[str, list[str]]:
    """stderr without rethook's own lines (the summary, notes), and the summary line."""
    lines = stderr.splitlines(keepends=True)
    summary = [line for line in lines if SUMMARY.match(line)]
    assert len(summary) == 1, stderr
    rest = "".join(line for line in lines if not line.startswith("rethook: "))
    return rest, summary


DURATION = re.compile(r"(?<=[)|] )[ +!#*@$] +\d+\.\d+ us +\|")
TIMESTAMP = re.compile(r" +\d+\.\d{6}\b")
TASK_PID = re.compile(r"(?<=[A-Za-z_])-\d+\b( +(?=\[))?")  # with the tid's padding
PROC_COLUMN = re.compile(r"(?<=\)) +([^ |]+-<tid>) +(?=\|)")


def normalise(text: str) -> list[str]:
    """Report lines with durations, timestamps and thread ids replaced (nothing else)."""
    out = []
    for line in text.splitlines():
        line = DURATION.sub("<dur> |", line)
        line = TIMESTAMP.sub(" <ts>", line)
        line = TASK_PID.sub(lambda m: "-<tid> " if m.group(1) else "-<tid>", line)
        line = PROC_COLUMN.sub(r" \1 ", line)  # centred: its padding depends on the tid's width
        out.append(line)
    return out


def record_report(tmp_path: Path, *flags: str, program: str = "golden.py",
                  report_flags: tuple[str, ...] = ()) -> list[str]:
    out = tmp_path / "t.dat"
    rec = rethook("record", "-o", str(out), *flags, program)
    assert rec.returncode == 0, rec.stderr
    rep = rethook("report", "-i", str(out), *report_flags)
    assert rep.returncode == 0, rep.stderr
    assert rep.stderr == ""
    return normalise(rep.stdout)


GRAPH_HEADER = [
    "# tracer: function_graph",
    "#",
    "# CPU  DURATION                  FUNCTION CALLS",
    "# |     |   |                     |   |   |   |",
]


# --- the program runs as python would run it ------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["argv_prog.py", "-x", "--y", "--", "-m", "z"],
    ["exit3.py"],
    ["exit_msg.py"],
    ["raises.py"],
    ["threads_prog.py"],
    ["async_prog.py"],
    ["gen_prog.py"],
    pytest.param(["forking.py"], marks=pytest.mark.skipif(not hasattr(os, "fork"),
                                                          reason="no os.fork")),
    ["-m", "clipkg.tool", "a", "-v", "--fail"],
    ["-m", "clipkg", "--flag"],
    ["-m", "clipkg.broken"],
], ids=lambda argv: " ".join(argv))
def test_traced_run_is_indistinguishable(tmp_path: Path, argv: list[str]) -> None:
    plain = run(*argv)
    traced = rethook("record", "-o", str(tmp_path / "t.dat"), *argv)
    assert traced.stdout == plain.stdout
    rest, summary = strip_summary(traced.stderr)
    assert rest == plain.stderr
    assert traced.returncode == plain.returncode
    assert f"written to {tmp_path / 't.dat'}" in summary[0]


def test_fork_keeps_the_trace_intact(tmp_path: Path) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no os.fork")
    lines = record_report(tmp_path, program="forking.py")  # children are followed
    ours = [line.split(")", 1) for line in lines[4:] if "__main__" in line]
    # one line each, on two threads (numbered in the order they first ran: either can be 0)
    assert sorted(rest for _, rest in ours) == [" <dur> |  __main__.child();",
                                                " <dur> |  __main__.parent();"]
    assert sorted(n for n, _ in ours) == [" 0", " 1"]
    lines = record_report(tmp_path, "--no-follow", program="forking.py")
    assert lines[4:] == [" 0) <dur> |  __main__.parent();"]  # the child's calls are its own


def test_exit_statuses_and_messages(tmp_path: Path) -> None:
    r = rethook("record", "-o", str(tmp_path / "t.dat"), "exit3.py")
    assert (r.returncode, r.stdout) == (3, "leaving with 3\n")
    r = rethook("record", "-o", str(tmp_path / "t.dat"), "exit_msg.py")
    assert r.returncode == 1
    assert strip_summary(r.stderr)[0] == "fatal: giving up\n"
    r = rethook("record", "-o", str(tmp_path / "t.dat"), "raises.py")
    assert r.returncode == 1
    err = strip_summary(r.stderr)[0]
    assert err.startswith("Traceback (most recent call last):\n")
    assert "rethook" not in err  # no frame of rethook's own
    assert err.endswith("RuntimeError: cannot load 'x'\n")
    assert "The above exception was the direct cause of the following exception" in err


def test_keyboard_interrupt_exits_like_python(tmp_path: Path) -> None:
    prog = tmp_path / "ki.py"
    prog.write_text("def f():\n    raise KeyboardInterrupt\n\n\nf()\n")
    plain = run(str(prog))
    traced = rethook("record", "-o", str(tmp_path / "t.dat"), str(prog))
    assert traced.returncode == plain.returncode  # killed by SIGINT, as python does it
    assert strip_summary(traced.stderr)[0] == plain.stderr


def test_argv_and_main_module(tmp_path: Path) -> None:
    r = rethook("record", "-o", str(tmp_path / "t.dat"), "argv_prog.py", "-o", "x", "--", "-l")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "argv: ['argv_prog.py', '-o', 'x', '--', '-l']",
        "name: __main__",
        f"file: {PROGRAMS / 'argv_prog.py'}",
        "spec: None",
        "package: None",
        "path0 is script dir: True",
        "main module: True",
        "threads: 1",  # rethook's own thread is invisible to the program
    ]
    # '--' before the script is rethook's, not the program's
    r = rethook("record", "-o", str(tmp_path / "t.dat"), "--", "argv_prog.py", "-p")
    assert r.stdout.splitlines()[0] == "argv: ['argv_prog.py', '-p']"


def test_default_filter_never_means_everything(tmp_path: Path) -> None:
    r = rethook("record", "-o", str(tmp_path / "t.dat"), "nofuncs.py")
    assert (r.returncode, r.stdout) == (0, "45\n")
    note, summary = r.stderr.splitlines()
    assert note == ("rethook: the program defines no functions of its own: nothing is traced "
                    "(choose functions with -l)")
    assert summary.startswith(f"rethook: 0 events (0 lost) written to {tmp_path / 't.dat'} (")


def test_module_run(tmp_path: Path) -> None:
    r = rethook("record", "-o", str(tmp_path / "t.dat"), "-m", "clipkg.tool", "-p", "x")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "tool 1.0 ['-p', 'x']",
        "name: __main__ spec: clipkg.tool package: clipkg",
        "argv0 is file: True",
        "path0 is cwd: True",
    ]
    rep = rethook("report", "-i", str(tmp_path / "t.dat"))
    # by default the module's whole top-level package is the program's own code
    assert normalise(rep.stdout)[4:] == [
        " 0)               |  __main__.run() {",
        " 0) <dur> |    clipkg.version();",
        " 0) <dur> |  }",
    ]


# --- record -> report --------------------------------------------------------------------------
GOLDEN = GRAPH_HEADER + [
    " 0)               |  __main__.main() {",
    " 0) <dur> |    __main__.Counter.__init__();",
    " 0) <dur> |    __main__.Counter.bump();",
    " 0)               |    __main__.fib() {",
    " 0)               |      __main__.fib() {",
    " 0) <dur> |        __main__.fib();",
    " 0) <dur> |        __main__.fib();",
    " 0) <dur> |      }",
    " 0) <dur> |      __main__.fib();",
    " 0) <dur> |    }",
    " 0) <dur> |    __main__.Counter.double();",
    " 0)               |    __main__.safe() {",
    " 0)               |      __main__.fail() {",
    " 0) <dur> |        __main__.fail(); /* raised */",
    " 0) <dur> |      } /* __main__.fail raised */",
    " 0) <dur> |    }",
    " 0)               |    helper.twice() {",
    " 0) <dur> |      helper.inc();",
    " 0) <dur> |      helper.inc();",
    " 0) <dur> |    }",
    " 0) <dur> |  }",
]


def test_record_report_round_trip(tmp_path: Path) -> None:
    assert record_report(tmp_path) == GOLDEN


def test_retval_and_tail_options(tmp_path: Path) -> None:
    lines = record_report(tmp_path, "-O", "funcgraph-retval", "-O", "funcgraph-tail",
                          "-l", "fib", "-l", "safe", "-l", "fail")
    assert lines[4:] == [
        " 0)               |  __main__.fib() {",
        " 0)               |    __main__.fib() {",
        " 0) <dur> |      __main__.fib(); /* = 1 */",
        " 0) <dur> |      __main__.fib(); /* = 0 */",
        " 0) <dur> |    } /* __main__.fib = 1 */",
        " 0) <dur> |    __main__.fib(); /* = 1 */",
        " 0) <dur> |  } /* __main__.fib = 2 */",
        " 0)               |  __main__.safe() {",
        " 0)               |    __main__.fail() {",
        " 0) <dur> |      __main__.fail(); /* raised ValueError('zero') */",
        " 0) <dur> |    } /* __main__.fail raised ValueError('zero') */",
        " 0) <dur> |  } /* __main__.safe = 'caught' */",
    ]


def test_no_duration_option_needs_no_normalising(tmp_path: Path) -> None:
    out = tmp_path / "t.dat"
    assert rethook("record", "-o", str(out), "-O", "nofuncgraph-duration", "-l", "helper.*",
                   "golden.py").returncode == 0
    rep = rethook("report", "-i", str(out))
    assert rep.stdout.splitlines() == [
        "# tracer: function_graph",
        "#",
        "# CPU               FUNCTION CALLS",
        "# |                 |   |   |   |",
        " 0) helper.twice() {",
        " 0)   helper.inc();",
        " 0)   helper.inc();",
        " 0) }",
    ]


def test_notrace_graph_function_and_depth(tmp_path: Path) -> None:
    # -n: the function and only it disappears (what it calls is still traced)
    lines = record_report(tmp_path, "-n", "__main__.safe", "-n", "helper.twice")
    assert " 0)               |    __main__.fail() {" in lines
    assert not [line for line in lines if "safe" in line or "twice" in line]
    # -g: only what runs under the graph function
    assert record_report(tmp_path, "-g", "__main__.safe")[4:] == [
        " 0)               |  __main__.safe() {",
        " 0)               |    __main__.fail() {",
        " 0) <dur> |      __main__.fail(); /* raised */",
        " 0) <dur> |    } /* __main__.fail raised */",
        " 0) <dur> |  }",
    ]
    # --max-graph-depth 1: main and nothing below
    assert record_report(tmp_path, "--max-graph-depth", "1")[4:] == [
        " 0) <dur> |  __main__.main();",
    ]
    # -l with ftrace's glob and :mod: syntax
    assert record_report(tmp_path, "-l", "*:mod:helper")[4:] == [
        " 0)               |  helper.twice() {",
        " 0) <dur> |    helper.inc();",
        " 0) <dur> |    helper.inc();",
        " 0) <dur> |  }",
    ]


def test_probe_events(tmp_path: Path) -> None:
    lines = record_report(tmp_path, "-l", "helper.*", "-e", "p:cli/inc helper.inc x",
                          "-e", "r:cli/twice helper.twice ret=$retval")
    assert lines[4:] == [
        " 0)               |  helper.twice() {",
        " 0)               |    /* inc: (helper.inc+4) x=4 */",
        " 0) <dur> |    helper.inc();",
        " 0)               |    /* inc: (helper.inc+4) x=4 */",
        " 0) <dur> |    helper.inc();",
        " 0) <dur> |  }",
        " 0)               |  /* twice: (__main__.main+39 <- helper.twice) ret=10 */",
    ]


def test_report_display_overrides(tmp_path: Path) -> None:
    lines = record_report(tmp_path, "-l", "helper.inc", report_flags=("-O", "funcgraph-proc"))
    assert lines == [
        "# tracer: function_graph",
        "#",
        "# CPU  TASK/PID         DURATION                  FUNCTION CALLS",
        "# |     |    |         |   |                     |   |   |   |",
        " 0) MainThr-<tid> | <dur> |  helper.inc();",
        " 0) MainThr-<tid> | <dur> |  helper.inc();",
    ]


def test_function_tracer(tmp_path: Path) -> None:
    lines = record_report(tmp_path, "-p", "function", "-l", "fib", "-l", "helper.*")
    assert lines[:6] == [
        "# tracer: function",
        "#",
        "# entries-in-buffer/entries-written: 8/8   #P:1",
        "#",
        "#           TASK-PID     CPU#     TIMESTAMP  FUNCTION",
        "#              | |         |         |         |",
    ]
    assert lines[6:] == [
        "      MainThread-<tid> [000] <ts>: __main__.fib <-__main__.main",
        "      MainThread-<tid> [000] <ts>: __main__.fib <-__main__.fib",
        "      MainThread-<tid> [000] <ts>: __main__.fib <-__main__.fib",
        "      MainThread-<tid> [000] <ts>: __main__.fib <-__main__.fib",
        "      MainThread-<tid> [000] <ts>: __main__.fib <-__main__.fib",
        "      MainThread-<tid> [000] <ts>: helper.twice <-__main__.main",
        "      MainThread-<tid> [000] <ts>: helper.inc <-helper.twice",
        "      MainThread-<tid> [000] <ts>: helper.inc <-helper.twice",
    ]


def test_generators_async_and_threads_in_report(tmp_path: Path) -> None:
    lines = record_report(tmp_path, program="gen_prog.py")
    assert " 0)               |      __main__.count() { /* resumed */" in lines
    # g.close(): 3.12 throws GeneratorExit in (an exception exit), 3.13.0 fires no event at
    # all (CPython issue 140373) and the engine finds the call closed
    assert [line for line in lines
            if re.fullmatch(r" 0\) <dur> \|    } /\* __main__\.count (closed|raised) \*/", line)]
    lines = record_report(tmp_path, program="async_prog.py")
    assert lines.count(" 0)               |  } /* __main__.job suspended */") == 4
    assert lines.count(" 0)               |  __main__.job() { /* resumed */") == 4
    lines = record_report(tmp_path, "-l", "square", program="threads_prog.py")
    calls = [line for line in lines if "__main__.square();" in line]
    assert len(calls) == 9  # four threads, five pool calls
    assert len({line.split(")")[0] for line in calls}) >= 3  # several threads


def test_trace_metadata(tmp_path: Path) -> None:
    out = tmp_path / "t.dat"
    r = rethook("record", "-o", str(out), "-b", "64", "-O", "funcgraph-retval", "golden.py",
                "arg")
    assert r.returncode == 0, r.stderr
    from rethook.buffer.traceread import TraceReader

    with TraceReader(out) as reader:
        meta = reader.meta
        assert meta["tracer"] == "function_graph"
        assert meta["options"]["funcgraph-retval"] is True
        assert meta["argv"] == ["golden.py", "arg"]
        assert meta["buffer_size_kb"] == 64
        assert meta["filter"] == ["*:mod:__main__", "*:mod:helper"]
        assert meta["python"] == sys.version.split()[0]
        assert meta["engine"]
        assert meta["rethook_version"]
        assert meta["start_time"] > 0
        assert sum(1 for _ in reader.events()) == 30
        assert set(reader.threads.values()) == {"MainThread"}


def test_loss_is_counted_never_silent(tmp_path: Path) -> None:
    prog = tmp_path / "many.py"
    prog.write_text("def work(i):\n    return i\n\n\nfor i in range(30000):\n    work(i)\n")
    out = tmp_path / "t.dat"
    # (--blocking-timeout 0: the program never waits for the drain, so a tiny ring overflows)
    r = rethook("record", "-b", "4", "--blocking-timeout", "0", "-o", str(out), str(prog))
    assert r.returncode == 0, r.stderr
    (summary,) = [line for line in r.stderr.splitlines() if SUMMARY.match(line)]
    events, lost = (int(n.replace(",", "")) for n in SUMMARY.match(summary).groups()[:2])
    assert events + lost == 60000  # every entry and exit is either in the file or counted
    assert lost > 0  # a 4 KB buffer holds ~70 records: the summary says what to do
    assert "a larger per-thread buffer (-b KB) or a narrower filter (-l)" in r.stderr
    rep = rethook("report", "-i", str(out))
    shown = sum(int(n) for n in re.findall(r"\[LOST (\d+) EVENTS\]", rep.stdout))
    assert shown == lost


THREADED_CALLS = """\
import sys
import threading


def work(i):
    return i


def squares(n):
    yield from (i * i for i in range(n))


def run(k):
    total = 0
    for i in range(20000):
        total += work(i)
        if i % 1000 == 0:
            total += sum(squares(3))
    sys.stdout.write(f"{k} {total}\\n")  # (one write: print's pieces may interleave)


threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


@pytest.mark.parametrize("buffer_kb", [None, "4"])
def test_threads_writing_at_once_are_all_counted(tmp_path: Path, buffer_kb: str | None) -> None:
    """Four threads writing records at once (the drain's rounds then come first: the threads
    hand the GIL over at their next callback): the program's output is its own, and every
    entry and exit is in the file or counted lost, with a tiny buffer too."""
    prog = tmp_path / "threaded.py"
    prog.write_text(THREADED_CALLS)
    plain = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True)
    out = tmp_path / "t.dat"
    # (a tiny buffer without blocking: the drain falls behind, and the loss is counted)
    r = rethook("record", *(["-b", buffer_kb, "--blocking-timeout", "0"] if buffer_kb else []),
                "-o", str(out), str(prog))
    assert (r.returncode, sorted(r.stdout.splitlines())) == \
        (0, sorted(plain.stdout.splitlines())), r.stderr
    (summary,) = [line for line in r.stderr.splitlines() if SUMMARY.match(line)]
    events, lost = (int(n.replace(",", "")) for n in SUMMARY.match(summary).groups()[:2])
    # run and work: an entry and an exit each; squares and its generator expression, 20
    # times: an entry, 3 suspends, 3 resumes and an exit each
    per_thread = 2 * (1 + 20000) + 20 * 2 * 8
    assert events + lost == 4 * per_thread


@pytest.mark.parametrize("program", ["many.py", "threaded.py"])
def test_record_waits_for_the_drain_rather_than_lose(tmp_path: Path, program: str) -> None:
    """A ring far too small for the program (-b 16: ~290 records a thread): record's
    blocking has the program's threads wait for the drain whenever a ring is three quarters
    full, so nothing is lost, whatever the threads; the output is the program's own."""
    if os.environ.get("RETHOOK_ENGINE") == "python":
        pytest.skip("blocking is the C core's: its native rings")
    prog = tmp_path / program
    if program == "many.py":
        prog.write_text("def work(i):\n    return i\n\n\nfor i in range(30000):\n    work(i)\n")
        total = 2 * 30000
    else:
        prog.write_text(THREADED_CALLS)
        total = 4 * (2 * (1 + 20000) + 20 * 2 * 8)  # as in the test above
    plain = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True)
    out = tmp_path / "t.dat"
    # (a timeout no loaded machine reaches: lossless by design, not by timing)
    r = rethook("record", "-b", "16", "--blocking-timeout", "600000", "-o", str(out),
                str(prog))
    assert (r.returncode, sorted(r.stdout.splitlines())) == \
        (0, sorted(plain.stdout.splitlines())), r.stderr
    (summary,) = [line for line in r.stderr.splitlines() if SUMMARY.match(line)]
    events, lost = (int(n.replace(",", "")) for n in SUMMARY.match(summary).groups()[:2])
    assert (events, lost) == (total, 0)
    assert "larger per-thread buffer" not in r.stderr


def test_stream_prints_live(tmp_path: Path) -> None:
    r = rethook("stream", "-l", "helper.*", "golden.py")
    assert r.returncode == 0, r.stderr
    lines = normalise(r.stdout)
    # the program's own output is untouched (its buffering decides when it appears)
    assert [line for line in lines if not line.startswith(" 0)")] == ["2 4 caught 10"]
    assert [line for line in lines if line.startswith(" 0)")] == [
        " 0)               |  helper.twice() {",
        " 0) <dur> |    helper.inc();",
        " 0) <dur> |    helper.inc();",
        " 0) <dur> |  }",
    ]
    rest, summary = strip_summary(r.stderr)
    assert rest == ""
    assert summary[0] == "rethook: 6 events (0 lost) streamed\n"


STORM = """\
import os


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


print(fib(20))
pid = os.fork()
if pid == 0:
    fib(5)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_stream_prints_every_event_of_a_storm(tmp_path: Path, monkeypatch) -> None:
    """21,891 calls, each one line of the function tracer (fewer than a thread's ring holds,
    so none may be lost whatever the machine's speed), then a fork child's 15: all printed
    by the printer process, and its temporary files gone (the run's directory too, which
    held the child's trace file: it once stayed in /tmp, with the file)."""
    (tmp_path / "storm.py").write_text(STORM)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    r = rethook("stream", "-p", "function", "-l", "fib", "storm.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines.count("6765") == 1  # (the program's stdout is a pipe: printed at its exit)
    assert sum(": __main__.fib <-__main__.fib" in line for line in lines) == 21_890 + 14
    assert sum(": __main__.fib <-__main__.<module>" in line for line in lines) == 2
    assert len(lines) == 1 + 21_891 + 15 + 4  # and the process switch to the child
    rest, summary = strip_summary(r.stderr)
    assert rest == "" and summary[0] == "rethook: 21,891 events (0 lost) streamed\n"
    assert not list(tmp_path.glob("*.stream")) and not list(tmp_path.glob("*.procs"))
    assert list(tmp.iterdir()) == []


# --- profile ------------------------------------------------------------------------------------
def profile_hits(stdout: str) -> dict[str, int]:
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"^  (\S+)\s+(\d+)\s+\d", line)
        if m:
            rows[m.group(1)] = int(m.group(2))
    return rows


def test_profile_hit_counts() -> None:
    r = rethook("profile", "profiled.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == str(55 + 15 + 6)  # the program's own output first
    assert "  Function" in r.stdout and "Hit    Total           Self            Avg" in r.stdout
    assert profile_hits(r.stdout) == {"__main__.fib": 177, "__main__.step": 5, "__main__.gen": 4,
                                      "__main__.main": 1}
    self_time = rethook("profile", "-O", "nograph-time", "-l", "fib", "profiled.py")
    assert self_time.returncode == 0, self_time.stderr
    assert profile_hits(self_time.stdout) == {"__main__.fib": 177}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_profile_follows_a_fork_and_leaves_no_files(tmp_path: Path, monkeypatch) -> None:
    """The fork child's calls are in the table; the run's temporary directory (made only
    when the program forks) is gone at the end."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    plain = run("forking.py")
    r = rethook("profile", "forking.py")
    assert r.returncode == plain.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == plain.stdout.splitlines()
    assert profile_hits(r.stdout) == {"__main__.parent": 1, "__main__.child": 1}
    assert list(tmp.iterdir()) == []


# --- list ---------------------------------------------------------------------------------------
def test_list_tracers_and_options() -> None:
    r = rethook("list", "-t")
    assert [line.split()[0] for line in r.stdout.splitlines()] == \
        ["function_graph", "function", "nop"]
    r = rethook("list", "-o")
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["OPTION", "DEFAULT", "USED", "BY"]
    assert "funcgraph-retval    off      function_graph" in lines
    assert "graph-time          on       profile" in lines
    assert "print-parent        on       function" in lines
    both = rethook("list")
    assert both.stdout == rethook("list", "-t").stdout + "\n" + r.stdout


def test_list_functions() -> None:
    r = rethook("list", "-f", "--", "golden.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "__main__.Counter.__init__", "__main__.Counter.bump", "__main__.Counter.double",
        "__main__.fail", "__main__.fib", "__main__.main", "__main__.safe",
        "helper.inc", "helper.twice",
    ]
    r = rethook("list", "-f", "f*", "--", "golden.py")
    assert r.stdout.splitlines() == ["__main__.fail", "__main__.fib"]
    r = rethook("list", "-f", "dump*", "-m", "json")
    assert r.stdout.splitlines() == ["json.dump", "json.dumps"]
    # listing a module never runs it (clipkg.tool would print and exit)
    r = rethook("list", "-f", "-m", "clipkg.tool")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == ["clipkg.tool.run", "clipkg.version"]


# --- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["record", "-p", "bogus", "golden.py"], "'bogus' is not one of"),
    (["record", "-O", "bogus", "golden.py"], "-O 'bogus': unknown option 'bogus'"),
    (["record", "-l", "nosuchfunc", "golden.py"], "-l 'nosuchfunc': no function matches"),
    (["record", "-n", "nosuchfunc", "golden.py"], "-n 'nosuchfunc': no function matches"),
    (["record", "-g", "nosuchfunc", "golden.py"], "-g 'nosuchfunc': no function matches"),
    (["record", "-l", "fib:bogus", "golden.py"], "unknown command 'bogus'"),
    (["record", "-e", "q:bad", "golden.py"], "-e 'q:bad': dynamic_events: error: Unknown probe"),
    (["record", "missing.py"], "can't open file 'missing.py'"),
    (["record", "-m", "no_such_module"], "no module named 'no_such_module'"),
    (["record", "-m", "clipkg.nope"], "no module named 'clipkg.nope'"),
    (["record"], "missing program"),
    (["record", "--bogus", "golden.py"], "No such option '--bogus'"),
    (["record", "-b", "0", "golden.py"], "Invalid value for '-b'"),
    (["stream", "-O", "nobogus", "golden.py"], "-O 'nobogus'"),
    (["profile", "-l", "nosuchfunc", "golden.py"], "-l 'nosuchfunc'"),
    (["report", "-i", "missing.dat"], "'missing.dat' does not exist"),
    (["report", "-i", "golden.py", "-O", "bogus"], "bogus"),
    (["export", "-i", "golden.py", "--format", "svg"], "'svg' is not one of"),
    (["list", "-f", "nomatch", "--", "golden.py"], "-f 'nomatch': no function matches"),
    (["list", "-f"], "-f lists the functions of a program"),
    (["list", "-f", "-m", "no_such_module"], "no_such_module"),
    (["bogus"], "No such command 'bogus'"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    r = rethook(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


def test_not_a_trace_file() -> None:
    r = rethook("report", "-i", "golden.py")
    assert r.returncode == 1
    assert r.stderr == ("rethook: error: golden.py: not a rethook trace file (bad magic) "
                        "(at byte offset 0)\n")


def test_syntax_error_is_reported_like_python(tmp_path: Path) -> None:
    prog = tmp_path / "bad.py"
    prog.write_text("def broken(:\n    pass\n")
    plain = run(str(prog))
    traced = rethook("record", "-o", str(tmp_path / "t.dat"), str(prog))
    assert (traced.returncode, traced.stderr) == (plain.returncode, plain.stderr)
    assert not (tmp_path / "t.dat").exists()


def test_truncated_file(tmp_path: Path) -> None:
    out = tmp_path / "t.dat"
    assert rethook("record", "-o", str(out), "golden.py").returncode == 0
    data = out.read_bytes()
    # without its END chunk (20 bytes; a killed run): every event is shown, with a warning
    cut = tmp_path / "cut.dat"
    cut.write_bytes(data[:-20])
    r = rethook("report", "-i", str(cut))
    assert r.returncode == 0
    assert normalise(r.stdout) == GOLDEN
    assert r.stderr == (f"rethook: warning: {cut}: the recording has no end (its END chunk is "
                        f"missing: killed, or still running?); shown up to byte offset "
                        f"{len(data) - 20}, the last complete chunk\n")
    # cut in the middle: what comes before is printed, the warning names file and offset
    half = tmp_path / "half.dat"
    half.write_bytes(data[: len(data) // 2])
    r = rethook("report", "-i", str(half))
    assert r.returncode == 0
    assert normalise(r.stdout)[:4] == GRAPH_HEADER
    assert re.fullmatch(rf"rethook: warning: {re.escape(str(half))}: .* byte offset \d+, .*\n",
                        r.stderr)
    # damaged in the middle: what comes before is printed, then an error, status 1
    bad = tmp_path / "bad.dat"
    at = len(data) // 2
    bad.write_bytes(data[:at] + b"\xff" * 24 + data[at + 24:])
    r = rethook("report", "-i", str(bad))
    assert r.returncode == 1
    assert normalise(r.stdout)[:4] == GRAPH_HEADER
    assert re.fullmatch(rf"rethook: error: {re.escape(str(bad))}: .* \(at byte offset \d+\)\n",
                        r.stderr)


# --- export, demo, help -------------------------------------------------------------------------
def test_export_folded(tmp_path: Path) -> None:
    pytest.importorskip("rethook.output.folded")
    out = tmp_path / "t.dat"
    assert rethook("record", "-o", str(out), "golden.py").returncode == 0
    r = rethook("export", "-i", str(out), "--format", "folded")
    assert r.returncode == 0, r.stderr
    folded = (tmp_path / "t.folded").read_text()
    assert re.search(r"^__main__\.main;__main__\.fib;__main__\.fib \d+$", folded, re.M), folded
    r = rethook("export", "-i", str(out), "--format", "folded", "-o", "-")
    assert r.stdout == folded


def test_export_perfetto(tmp_path: Path) -> None:
    pytest.importorskip("rethook.output.perfetto")
    out = tmp_path / "t.dat"
    assert rethook("record", "-o", str(out), "golden.py").returncode == 0
    r = rethook("export", "-i", str(out), "--format", "perfetto", "-o", str(tmp_path / "p.pb"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p.pb").stat().st_size > 0


def test_demo(tmp_path: Path) -> None:
    out = tmp_path / "demo.dat"
    r = rethook("demo", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.exists()
    lines = normalise(r.stdout)
    assert "stock value: 2.75" in lines
    assert GRAPH_HEADER[0] in lines
    assert " 0)               |  __main__.main() {" in lines
    assert (" 0) <dur> |        __main__.parse_price(); /* raised ValueError(\"could not "
            "convert string to float: 'n/a'\") */") in lines
    assert " 0)               |    } /* __main__.fetch_price suspended */" in lines
    assert " 1) <dur> |  __main__.audit(); /* = None */" in lines
    assert len(lines) < 120  # fits a screen or two


@pytest.mark.parametrize("command", ["", "record", "report", "stream", "profile", "list",
                                     "export", "demo"])
def test_help(command: str) -> None:
    r = rethook(*([command] if command else []), "--help")
    assert r.returncode == 0
    assert r.stdout.startswith(f"Usage: rethook {command}".rstrip())


def test_version() -> None:
    r = rethook("--version")
    assert r.returncode == 0
    first, note, caps, users, clock = r.stdout.splitlines()
    assert re.fullmatch(r"rethook \d+\.\d+\.\d+ \(engine: (c|python) core, \w+ \d+\.\d+\.\d+\S*\)",
                        first)
    # which core runs, and why (the C core unless it is not built or RETHOOK_ENGINE=python)
    assert note.startswith(("C core", "pure-Python core"))
    # what the core can do (engine/coreapi.py's Capabilities, which the tracers also read)
    assert caps.startswith("core capabilities: ")
    assert ("native users" in caps) == ("engine: c core" in first)
    # and which users the tracers run (native on the C core when built)
    assert users.startswith(("tracers: native users", "tracers: Python users"))
    assert users.startswith("tracers: native") == ("engine: c core" in first
                                                   and "not built" not in users)
    # and the trace clock (the TSC scaled onto CLOCK_MONOTONIC, or CLOCK_MONOTONIC itself)
    assert clock.startswith(("clock: tsc (", "clock: monotonic ("))


def test_engine_option_forces_the_pure_core(tmp_path: Path) -> None:
    r = rethook("--engine", "python", "--version")
    assert r.returncode == 0
    assert "(engine: python core," in r.stdout
    assert "core capabilities: reference only (no C)" in r.stdout
    assert "tracers: Python users (the engine's python core runs no native users)" in r.stdout
    # the same program recorded on either core reports the same trace
    pytest.importorskip("rethook.engine._ccore")
    reports = []
    for engine in ("python", "c"):
        out = tmp_path / f"{engine}.dat"
        rec = rethook("--engine", engine, "record", "-o", str(out), "golden.py")
        assert rec.returncode == 0, rec.stderr
        rep = rethook("report", "-i", str(out))
        assert rep.returncode == 0, rep.stderr
        reports.append(normalise(rep.stdout))
    assert len(reports[0]) > 10 and " 0)               |  __main__.main() {" in reports[0]
    assert reports[0] == reports[1]
    r = rethook("--engine", "fast", "--version")
    assert r.returncode == 2 and "Invalid value for '--engine'" in r.stderr


def test_the_program_body_is_named_alike_under_the_console_script(tmp_path):
    """The console script's own ``<module>`` runs while the set-up scans the heap: it is not
    the program's, whose body keeps the name ``__main__.<module>``."""
    exe = shutil.which("rethook", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("the rethook console script is not installed next to this python")
    out = tmp_path / "p.dat"
    r = subprocess.run([exe, "record", "-p", "nop", "-o", str(out), "-e",
                        "r:parse __main__.parse text:len", "jsonparse.py"], cwd=PROGRAMS,
                       env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = rethook("report", "-i", str(out)).stdout
    assert "parse: (__main__.<module>+11 <- __main__.parse) text=3" in report, report


def test_console_script_is_installed() -> None:
    exe = shutil.which("rethook", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("the rethook console script is not installed next to this python")
    r = subprocess.run([exe, "list", "-t"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert r.stdout.split()[0] == "function_graph"


def test_probe_events_with_filter_and_triggers_then_hist(tmp_path):
    out = tmp_path / "p.dat"
    r = rethook("record", "-p", "nop", "-o", str(out),
                "-e", "r:parse __main__.parse text:len ret=$retval:len",
                "-f", "text > 40", "-R", "hist:keys=text.log2:vals=ret",
                "-R", "stacktrace:1", "jsonparse.py")
    assert r.returncode == 0, r.stderr
    report = rethook("report", "-i", str(out)).stdout.splitlines()
    events = [line.split(": ", 1)[1] for line in report if ": parse: " in line]
    # 49 documents of 2n+1 characters: those longer than 40 pass the filter (n >= 20)
    assert len(events) == 30
    # (the program's body is __main__.<module>: the launcher's, running while the set-up scans
    # the heap, is rethook's own)
    assert events[0] == "parse: (__main__.<module>+11 <- __main__.parse) text=41 ret=20"
    # the stack trace is taken when the trigger fires: at parse's return
    assert report[6].endswith("<stack trace>") and report[7] == " => __main__.parse+7"
    hist = rethook("hist", "-i", str(out))
    assert hist.returncode == 0
    # the hist trigger sees every hit (the filter only decides what is recorded): 49 + 1 raised
    assert "    Hits: 50\n" in hist.stdout
    assert hist.stdout.startswith("# kprobes/parse\n# event histogram\n")


def test_event_filter_before_any_event_is_a_usage_error():
    r = rethook("record", "-f", "x > 1", "-e", "r:p __main__.parse", "jsonparse.py")
    assert r.returncode == 2
    assert "-f 'x > 1' must follow the -e it applies to" in r.stderr


def test_bad_event_filter_names_the_flag():
    r = rethook("record", "-e", "r:p __main__.parse text:len", "-f", "text >", "jsonparse.py")
    assert r.returncode == 2
    assert "-f 'text >'" in r.stderr and "^" in r.stderr
