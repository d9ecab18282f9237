"""Hardening (issue 13): each case a careless or hostile user met, as they met it.

The command runs in a subprocess on a real program; its exit status and stderr are checked:
no traceback ever, usage errors exit 2 before anything runs or is created, a damaged file
gives everything before the damage and one error line, text from the program never reaches
the terminal raw, summaries count what reached the file, and another tool taking rethook's
``sys.monitoring`` hook stops tracing with a warning but never changes the program's exit.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from programs import calls
from rethook import limits
from rethook.buffer.tracefile import TraceWriter
from rethook.buffer.traceread import TraceReader
from rethook.control.tracefs import Tracefs, TracefsError
from rethook.tracers.formats import builtin_registry

ERROR_LINE = re.compile(r"^rethook: error: (.+?): (.+) \(at byte offset (\d+)\)$")
#: What must never reach a terminal from a program or a file: ESC, BEL, a bidi override.
RAW = re.compile("[\x1b\x07\u202e]")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONIOENCODING"] = "utf-8"
    env.update(extra)
    return env


def run(*args: str, cwd: Path, env: dict[str, str] | None = None, limit=None,
        module: bool = True) -> subprocess.CompletedProcess[str]:
    """``rethook ARGS`` (or ``python ARGS`` with ``module=False``) in ``cwd``; ``limit``
    is an (RLIMIT_*, bytes) pair set in the child."""
    pre = None
    if limit is not None:
        def pre() -> None:
            resource.setrlimit(limit[0], (limit[1], limit[1]))
    cmd = [sys.executable, *(["-m", "rethook"] if module else []), *args]
    return subprocess.run(cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True,
                          timeout=120, preexec_fn=pre)


def write(where: Path, name: str, source: str) -> Path:
    path = where / name
    path.write_text(textwrap.dedent(source))
    return path


PROGRAM = """\
def work(n):
    return n + 1

for i in range(5):
    work(i)
print("ran")
"""


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr and "Warning:" not in r.stderr, r.stderr


# --- numbers out of range ------------------------------------------------------------------------
MANY = "9" * 5000


@pytest.mark.parametrize(("flags", "said"), [
    (["-b", "18446744073709551616"], "'-b': '18446744073709551616' is out of range "
                                     "(must be 1 to 4294967296)"),
    (["--max-graph-depth", "99999999999999999999"],
     "'--max-graph-depth': '99999999999999999999' is out of range (must be 0 to 4294967295)"),
    (["--tracing-thresh", "18446744073709551616"],
     "'--tracing-thresh': '18446744073709551616' is out of range (must be 0 to "
     "9223372036854775)"),
    (["--blocking-timeout", "-1"],
     "'--blocking-timeout': '-1' is out of range (must be 0 to 3600000)"),
    (["-b", "100000000"], "-b '100000000': 100000000 KiB per thread is more memory than can "
                          "be had"),
    (["-l", f"work:traceon:{MANY}"], "bad count '99999999"),
    (["-p", "nop", "-e", f"p:g/e __main__.work x=\\{MANY}"],
     "Invalid immediate value (must be -9223372036854775808 to 18446744073709551615)"),
], ids=["b-2**64", "max-graph-depth", "tracing-thresh", "blocking-timeout", "b-memory",
        "filter-count", "immediate"])
def test_numbers_out_of_range_are_usage_errors(tmp_path, flags, said):
    write(tmp_path, "prog.py", PROGRAM)
    # -b 100000000 asks 95 GiB per thread: more than any test machine has under this limit
    r = run("record", *flags, "prog.py", cwd=tmp_path, limit=(resource.RLIMIT_AS, 8 << 30))
    no_traceback(r)
    assert r.returncode == 2, r.stderr
    assert said in r.stderr, r.stderr
    if "Command:" in r.stderr:  # a grammar: the caret under the number
        lines = r.stderr.splitlines()
        command = next(i for i, line in enumerate(lines) if "Command:" in line)
        caret = lines[command + 1].index("^")
        assert lines[command][caret] == "9" and lines[command][caret - 1] in ":\\"
    assert r.stdout == "" and not (tmp_path / "trace.dat").exists()  # nothing ran or was made


def test_tracefs_refuses_out_of_range_and_changes_nothing(engine):
    fs = Tracefs()
    try:
        fs.write("current_tracer", "function_graph")
        fs.write("set_ftrace_filter", "programs.calls.fib")
        fs.write("options/funcgraph-tail", "1")
        refused = [("max_graph_depth", "9" * 23), ("max_graph_depth", MANY),
                   ("tracing_thresh", "18446744073709551616"), ("buffer_size_kb", "0"),
                   ("buffer_size_kb", str(limits.BUFFER_KB[1] + 1)),
                   ("trace_options", "nofuncgraph-tail funcgraph-proc nosuch"),
                   ("set_ftrace_filter", "fib:enable_event:sys:ev"),
                   ("set_ftrace_filter", f"fib:traceon:{MANY}")]
        before = {p: fs.read(p) for p in ("max_graph_depth", "tracing_thresh", "buffer_size_kb",
                                          "trace_options", "set_ftrace_filter")}
        for path, text in refused:
            with pytest.raises(TracefsError) as info:
                fs.write(path, text)
            assert str(info.value).startswith(f"{path}: "), info.value
        assert {p: fs.read(p) for p in before} == before
        assert fs.read("current_tracer") == "function_graph\n"
        calls.fib(4)  # and the tracer it names is running
        assert "programs.calls.fib();" in fs.read("trace")
        with pytest.raises(TracefsError, match=r"out of range \(must be 0 to 4294967295\)"):
            fs.write("max_graph_depth", "9" * 23)
    finally:
        fs.close()


# --- other tools' moves --------------------------------------------------------------------------
def test_no_free_tool_id_is_a_clean_error(tmp_path):
    write(tmp_path, "prog.py", PROGRAM)
    site = tmp_path / "site"
    site.mkdir()
    write(site, "sitecustomize.py", """\
        import sys
        for i in range(6):
            sys.monitoring.use_tool_id(i, f"tool{i}")
        """)
    r = run("record", "prog.py", cwd=tmp_path, env=_env(PYTHONPATH=str(site)))
    no_traceback(r)
    assert r.returncode == 2
    assert r.stderr.startswith("rethook: error: rethook needs one sys.monitoring tool id and "
                               "all six are in use (0: 'tool0', 1: 'tool1'"), r.stderr
    assert r.stdout == "" and not (tmp_path / "trace.dat").exists()


MOVER = """\
import sys

def work(n):
    return n + 1

def main():
    for i in range(5):
        work(i)
    tool = next((i for i in range(6) if sys.monitoring.get_tool(i) == "rethook"), None)
    if tool is not None:  # traced
        MOVE
    for i in range(5):
        work(i)
    print("done")
    sys.exit(3)

main()
"""
MOVES = {
    "free_tool_id": ("sys.monitoring.free_tool_id(tool)",
                     "was freed by the program (sys.monitoring.free_tool_id("),
    "set_events": ("sys.monitoring.set_events(tool, 0)",
                   "events were changed by the program (sys.monitoring.set_events("),
    "register_callback": ("sys.monitoring.register_callback(tool, "
                          "sys.monitoring.events.PY_RETURN, None)",
                          "the callback for PY_RETURN of rethook's sys.monitoring tool id"),
    "taken": ("sys.monitoring.free_tool_id(tool); sys.monitoring.use_tool_id(tool, 'mine')",
              "is now held by 'mine'"),
    "restart_events": ("sys.monitoring.restart_events()", None),
}


@pytest.mark.parametrize("move", sorted(MOVES))
def test_the_program_moving_rethooks_hook(tmp_path, move):
    code, said = MOVES[move]
    write(tmp_path, "prog.py", MOVER.replace("MOVE", code))
    plain = run("prog.py", cwd=tmp_path, module=False)
    r = run("record", "-o", "t.dat", "prog.py", cwd=tmp_path)
    no_traceback(r)
    assert (r.returncode, r.stdout) == (plain.returncode, plain.stdout) == (3, "done\n")
    warnings = [line for line in r.stderr.splitlines() if line.startswith("rethook: warning")]
    if said is None:  # restart_events re-arms nothing of rethook's: the trace is whole
        assert warnings == []
    else:
        assert len(warnings) == 1 and said in warnings[0], r.stderr
        assert "Tracing stopped when rethook noticed" in warnings[0]
    report = run("report", "-i", "t.dat", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    works = report.stdout.count("__main__.work()")
    assert works >= 5 if said else works == 10, report.stdout


def test_profile_survives_the_tool_id_being_freed(tmp_path):
    write(tmp_path, "prog.py", MOVER.replace("MOVE", MOVES["free_tool_id"][0]))
    r = run("profile", "prog.py", cwd=tmp_path)
    no_traceback(r)
    assert r.returncode == 3 and r.stdout.startswith("done\n")
    assert "__main__.work" in r.stdout
    assert "rethook: warning: rethook's sys.monitoring tool id" in r.stderr


# --- damaged files -------------------------------------------------------------------------------
def _sample(path: Path, **meta) -> Path:
    """A trace file written by TraceWriter, with ``meta`` over the usual keys."""
    fs = Tracefs()
    try:
        fs.write("current_tracer", "function_graph")
        fs.write("set_ftrace_filter", "programs.calls.fib")
        calls.fib(5)
        fs.write("tracing_on", "0")
        base = {"tracer": "function_graph", "options": fs.ctx.options.as_dict(),
                "histograms": {"g/e": "# hist\n"}}
        with TraceWriter(path, {**base, **meta}, formats=fs.ctx.formats,
                         batch_events=8) as w:
            w.write_events(fs.ctx.buffer.iter_trace())
    finally:
        fs.close()
    return path


@pytest.mark.parametrize("meta", [{"options": None}, {"histograms": "a string"}],
                         ids=["options-null", "histograms-string"])  # the rest: test_fuzz
def test_meta_of_the_wrong_type(tmp_path, engine, meta):
    path = _sample(tmp_path / "t.dat", **meta)
    key = next(iter(meta))
    for cmd in (["report"], ["hist"], ["export", "--format", "folded"]):
        r = run(*cmd, "-i", "t.dat", cwd=tmp_path)
        no_traceback(r)
        assert r.returncode == 1, (cmd, r.stderr)
        (line,) = [x for x in r.stderr.splitlines() if x.startswith("rethook:")]
        m = ERROR_LINE.match(line)
        assert m and m.group(1) == "t.dat" and f"META key '{key}' is" in line, line
        assert m.group(3) == "20"  # the first chunk, right after the header
    assert path.exists()


def _corrupt(data: bytes) -> bytes:
    """``data`` with 24 bytes two thirds of the way in overwritten: a chunk fails its CRC."""
    at = len(data) * 2 // 3
    return data[:at] + b"\xff" * 24 + data[at + 24:]


def test_hist_on_a_damaged_file_says_where(tmp_path, engine):
    data = _sample(tmp_path / "t.dat").read_bytes()
    (tmp_path / "bad.dat").write_bytes(_corrupt(data))
    r = run("hist", "-i", "bad.dat", cwd=tmp_path)
    no_traceback(r)
    assert r.returncode == 1
    assert "tracefile.py" not in r.stderr and "no histograms" not in r.stderr, r.stderr
    (line,) = r.stderr.splitlines()
    assert ERROR_LINE.match(line), line
    # a file that merely stops early (a killed recording): what it has, and a warning
    (tmp_path / "cut.dat").write_bytes(data[:len(data) // 2])
    r = run("hist", "-i", "cut.dat", cwd=tmp_path)
    no_traceback(r)
    assert r.returncode == 0 and r.stdout.startswith("# g/e\n"), r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("rethook: warning: cut.dat: ") and "byte offset" in line, line


def test_export_never_replaces_a_file_with_less(tmp_path, engine):
    data = _sample(tmp_path / "t.dat").read_bytes()
    (tmp_path / "cut.dat").write_bytes(data[:30])  # not even the first chunk whole
    (tmp_path / "out.folded").write_text("precious\n")
    r = run("export", "-i", "cut.dat", "--format", "folded", "-o", "out.folded", cwd=tmp_path)
    no_traceback(r)
    assert r.returncode == 1 and ERROR_LINE.match(r.stderr.splitlines()[0]), r.stderr
    assert (tmp_path / "out.folded").read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.dat", "out.folded", "t.dat"]
    # a file damaged further in: what comes before the damage is exported, then the error
    (tmp_path / "half.dat").write_bytes(_corrupt(data))
    r = run("export", "-i", "half.dat", "--format", "folded", "-o", "out.folded", cwd=tmp_path)
    no_traceback(r)
    done, error = r.stderr.splitlines()
    assert r.returncode == 1 and ERROR_LINE.match(error)
    assert done.endswith("what comes before the damage")
    assert "fib" in (tmp_path / "out.folded").read_text()


# --- text from the program and from files --------------------------------------------------------
EVIL = """\
import threading

class Evil:
    def __repr__(self):
        return "\\x1b[2J\\u202e"

def work(s):
    return Evil()

threading.current_thread().name = "Main\\x1b]0;owned\\x07"
for s in ("\\x1b[31mred", "plain"):
    work(s)
print("ran")
"""


def test_program_text_is_escaped_in_every_view(tmp_path):
    write(tmp_path, "prog.py", EVIL)
    probe = ["-e", "p:g/e __main__.work s=s:string", "-R", "hist:keys=s"]
    rec = run("record", "-O", "funcgraph-retval", *probe, "-o", "t.dat", "prog.py", cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    views = [
        run("report", "-i", "t.dat", "-O", "funcgraph-proc", cwd=tmp_path),
        run("hist", "-i", "t.dat", cwd=tmp_path),
        run("export", "-i", "t.dat", "--format", "folded", "-o", "-", cwd=tmp_path),
        run("stream", "-p", "function", "-O", "nofuncgraph-retval", "prog.py", cwd=tmp_path),
        run("record", "-p", "function", "-o", "f.dat", "prog.py", cwd=tmp_path),
    ]
    views.append(run("report", "-i", "f.dat", cwd=tmp_path))
    for v in views:
        assert v.returncode == 0, v.stderr
        assert not RAW.search(v.stdout.replace("ran\n", "")) and not RAW.search(v.stderr), v.args
    assert "\\x1b[2J\\u202e" in views[0].stdout  # the return value, written out
    assert "Main\\x1b" in views[-1].stdout  # the thread's name, in the function tracer's TASK
    assert "\\x1b[31mred" in views[1].stdout  # a hist key


def test_names_from_a_file_are_escaped(tmp_path):
    from rethook.tracers.formats import FUNCGRAPH_ENTRY, FUNCGRAPH_EXIT

    with TraceWriter(tmp_path / "t.dat", {"tracer": "function_graph"},
                     formats=builtin_registry()) as w:
        w.set_thread_name(1, "T\x1b[2J")
        w.write_events([(FUNCGRAPH_ENTRY.id, 10, 1, 0, "f\x1b]0;x\x07", ""),
                        (FUNCGRAPH_EXIT.id, 20, 1, 0, "f\x1b]0;x\x07", 10, 0, 0, 0, "")])
    r = run("report", "-i", "t.dat", "-O", "funcgraph-proc", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not RAW.search(r.stdout) and "f\\x1b]0;x\\x07();" in r.stdout, r.stdout


# --- summaries -----------------------------------------------------------------------------------
BUSY = """\
def f(n):
    return n

for i in range(100000):
    f(i)
print("ran")
"""


def test_summary_after_the_file_size_limit(tmp_path):
    write(tmp_path, "prog.py", BUSY)
    r = run("record", "-o", "t.dat", "prog.py", cwd=tmp_path,
            limit=(resource.RLIMIT_FSIZE, 64 * 1024))
    no_traceback(r)
    assert r.returncode == 1 and r.stdout == "ran\n"
    lines = r.stderr.splitlines()
    assert lines[0] == "rethook: error writing t.dat: [Errno 27] File too large", r.stderr
    m = re.match(r"rethook: ([\d,]+) events \(([\d,]+) lost\) written to t\.dat", lines[1])
    assert m, r.stderr
    written, lost = (int(g.replace(",", "")) for g in m.groups())
    import warnings

    # (the write the limit cut short may have left a chunk half written: the reader warns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with TraceReader(tmp_path / "t.dat", strict=False) as reader:
            assert reader.event_count == written  # what reached the file, no more
    assert written + lost == 200000
    assert "size limit (ulimit -f)" in lines[2] and "-b" not in lines[2]


def test_an_unwritable_output_is_refused_before_the_program_runs(tmp_path):
    write(tmp_path, "prog.py", PROGRAM)
    r = run("record", "-o", "/dev/full", "prog.py", cwd=tmp_path)
    no_traceback(r)
    assert r.returncode == 2 and r.stdout == ""
    assert "-o '/dev/full': cannot write: No space left on device" in r.stderr


# --- handlers at the recursion limit -------------------------------------------------------------
RECURSES = """\
def r(n):
    return r(n + 1)

try:
    r(0)
except RecursionError:
    print("caught")
"""


@pytest.mark.parametrize(("flags", "engine_core", "head"), [
    (["-p", "nop", "-e", "p:g/e __main__.r n"], None,
     "rethook: a handler of <_EntryProbeOps 'probe:g/e'> raised (reported once, counted after)"),
    ([], "python", "rethook: a handler of <GraphOps 'function_graph'> raised (reported once, "
                   "counted after)"),
], ids=["probe-handler", "pure-core"])
def test_failures_at_the_recursion_limit_say_what_happened(tmp_path, flags, engine_core, head):
    write(tmp_path, "prog.py", RECURSES)
    env = _env(RETHOOK_ENGINE=engine_core) if engine_core else None
    r = run("record", *flags, "-o", "t.dat", "prog.py", cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stdout == "caught\n", r.stderr
    report = r.stderr[r.stderr.index(head):]
    assert "RecursionError: maximum recursion depth exceeded" in report, r.stderr
    assert "rethook: the program was at Python's recursion limit (1000)" in report


# --- the documented ranges -----------------------------------------------------------------------
DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_documented_ranges_are_the_code_s():
    from rethook.probes import dynevent, fetch, hist

    ranges = {
        "`-b KB`": limits.BUFFER_KB, "`--max-graph-depth N`": limits.MAX_GRAPH_DEPTH,
        "`--tracing-thresh USECS`": limits.TRACING_THRESH_US, "`FUNC:traceon:N`": limits.COUNT,
        "trigger counts": limits.TRIGGER_COUNT,
        "hist `size=N`": (1 << hist.MIN_BITS, 1 << hist.MAX_BITS),
        "probe `rN:`": (1, dynevent.MAX_MAXACTIVE), "`$argN`": (1, fetch.MAX_ARG_NUM),
        "`$stackN`": (0, fetch.MAX_STACK_DEPTH - 1), "integer immediates": limits.IMMEDIATE,
        "numbers in event filters": (limits.S64_MIN, limits.U64_MAX),
    }
    tracefs = {"`max_graph_depth`": limits.MAX_GRAPH_DEPTH,
               "`tracing_thresh`": limits.TRACING_THRESH_US, "`buffer_size_kb`": limits.BUFFER_KB}
    for doc, table, section in (("cli.md", ranges, "### Numbers and their ranges"),
                                ("tracefs.md", tracefs, "## Files")):
        text = (DOCS / doc).read_text()
        lines = text[text.index(section):].splitlines()
        for start, (lo, hi) in table.items():
            line = next(x for x in lines if x.startswith(f"| {start}"))
            assert str(lo) in line and str(hi) in line, (doc, line)


def test_a_failure_report_always_says_what_failed(capsys, monkeypatch):
    import traceback

    from rethook.engine import core

    class Mute(Exception):
        def __str__(self):
            raise RuntimeError("no str")

    core.report_failure("rethook: head", ValueError("bad"))
    assert capsys.readouterr().err.endswith("rethook: head:\nValueError: bad\n")

    def fails(exc):  # at the recursion limit, formatting a traceback fails too
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(traceback, "format_exception", fails)
    for exc in (ValueError(), Mute(), RecursionError("maximum recursion depth exceeded")):
        core.report_failure("rethook: head", exc)
    assert capsys.readouterr().err == (
        "rethook: head: ValueError\nrethook: head: Mute\n"
        "rethook: head: RecursionError: maximum recursion depth exceeded\n"
        "rethook: the program was at Python's recursion limit "
        f"({sys.getrecursionlimit()}): calls made there may be missing from the trace\n")


@pytest.mark.parametrize("which", ["RLIMIT_AS", "RLIMIT_DATA"])
def test_memory_available_reads_the_limits_the_resource_module_reports(which):
    """limits.memory_available() reads ``ulimit -v`` and ``-d`` from /proc/self/limits (no
    resource module at start-up): what it finds is what resource.getrlimit() says, and a
    limit lowers the memory it reports below that limit."""
    code = textwrap.dedent(f"""
        import resource
        from rethook import limits
        resource.setrlimit(resource.{which}, (6 << 30, resource.RLIM_INFINITY))
        softs = [resource.getrlimit(r)[0] for r in (resource.RLIMIT_AS, resource.RLIMIT_DATA)]
        expect = [None if s == resource.RLIM_INFINITY else s for s in softs]
        assert limits._soft_limits() == expect, (limits._soft_limits(), expect)
        assert limits.memory_available() <= 6 << 30
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
