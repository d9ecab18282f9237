"""What people look at: the profile table, pstats files, Chrome trace JSON, speedscope files,
per-thread folded stacks, ``rethook info``, and the terminal (colour, progress bars).

Most checks run ``rethook`` on real programs in a subprocess (tests/cli_programs) and compare
what the files say against what the program counted itself, or against cProfile's profile
of the same program; the JSON formats are checked by their own field rules.
"""

from __future__ import annotations

import io
import json
import os
import pstats
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rethook.output.profile import render_table, sort_stats
from rethook.output.slices import split_args
from rethook.tracers.base import bounded_repr
from rethook.tracers.profiler import CallerStat, FunctionStat

PROGRAMS = Path(__file__).parent / "cli_programs"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

#: Tests of how files and tables are written, not of what the engine records: they run once,
#: not again when test_ccore reruns the suite on the other core (the profiler's tests do).
formats_only = pytest.mark.skipif(
    bool(os.environ.get("RETHOOK_NO_OTHER_CORE")),
    reason="output formats: tested once, on the default core")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TERM",
                        "COLUMNS")}
    env["PYTHONIOENCODING"] = "utf-8"
    env.update(extra)
    return env


def rethook(*args: str, cwd: Path = PROGRAMS, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rethook", *args], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=120)


# -- the profile table ----------------------------------------------------------------------

def _stats() -> list[FunctionStat]:
    main = FunctionStat("app.main", hit=1, time_ns=2_451_371, time_sq=2_451_371**2, prim=1,
                        total_ns=2_451_371, self_ns=1_000_000, file="/src/app.py", line=30,
                        func="main")
    fib = FunctionStat("app.fib", hit=177, time_ns=203_104, time_sq=400_000_000, prim=1,
                       total_ns=150_000, self_ns=203_104, file="/src/app.py", line=3,
                       func="fib", callers={"app.main": CallerStat(1, 1, 1000, 150_000),
                                            "app.fib": CallerStat(176, 2, 202_104, 149_000)})
    leaf = FunctionStat("app.Shape.area", hit=12, time_ns=12_000, time_sq=12_000_000, prim=12,
                        total_ns=12_000, self_ns=12_000, file="/elsewhere/shape.py", line=7,
                        func="Shape.area")
    anon = FunctionStat("gen.<lambda>", hit=3, time_ns=30, time_sq=300, prim=3, total_ns=30,
                        self_ns=30)
    return [leaf, fib, main, anon]


GOLDEN_TABLE = """\
  Function                               Hit    Total           Self            Avg             s^2             File:Line
  --------                               ---    -----           ----            ---             ---             ---------
  app.main                                 1    2451.371 us     1000.000 us     2451.371 us     0.000 us        app.py:30
  app.fib                                177    150.000 us      203.104 us      1.147 us        0.948 us        app.py:3
  app.Shape.area                          12    12.000 us       12.000 us       1.000 us        0.000 us        /elsewhere/shape.py:7
  gen.<lambda>                             3    0.030 us        0.030 us        0.010 us        0.000 us
"""  # noqa: E501 - the table is as wide as it is


@formats_only
def test_profile_table_golden():
    rows = sort_stats(_stats())
    assert render_table(rows, cwd="/src") == GOLDEN_TABLE


@formats_only
def test_profile_table_sort_and_limit():
    def names(by, **kw):
        return [s.name for s in sort_stats(_stats(), by, **kw)]

    assert names("self") == ["app.main", "app.fib", "app.Shape.area", "gen.<lambda>"]
    assert names(None, graph_time=False) == names("self")
    assert names("hit") == names("calls") == ["app.fib", "app.Shape.area", "gen.<lambda>",
                                              "app.main"]
    assert names("name") == ["app.Shape.area", "app.fib", "app.main", "gen.<lambda>"]
    assert names("file") == ["gen.<lambda>", "app.Shape.area", "app.fib", "app.main"]
    assert names("cumtime") == names("total")
    top = sort_stats(_stats())[:2]
    text = render_table(top, total=4, cwd="/src")
    assert text.splitlines()[2:] == GOLDEN_TABLE.splitlines()[2:4] + [
        "  (2 of 4 functions shown: --limit)"]


@formats_only
def test_profile_rich_table_has_every_row():
    from rich.console import Console

    from rethook.output.profile import rich_table

    con = Console(file=io.StringIO(), record=True, width=200, force_terminal=True,
                  color_system="standard")
    con.print(rich_table(sort_stats(_stats()), cwd="/src", sort="total"))
    text = con.export_text(clear=False)
    for name in ("app.main", "app.fib", "app.Shape.area", "gen.<lambda>", "app.py:30"):
        assert name in text
    assert "\x1b[" in con.export_text(styles=True)  # marks and the header are styled


def test_profile_command_table_sort_limit_and_errors():
    r = rethook("profile", "--sort", "hit", "--limit", "2", "profiled.py")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "76"  # the program's own output first
    assert lines[1].split() == ["Function", "Hit", "Total", "Self", "Avg", "s^2", "File:Line"]
    rows = [line.split() for line in lines[3:5]]
    assert [(row[0], row[1], row[-1]) for row in rows] == [
        ("__main__.fib", "177", "profiled.py:5"), ("__main__.step", "5", "profiled.py:9")]
    assert lines[5] == "  (2 of 4 functions shown: --limit)"
    bad = rethook("profile", "--sort", "bogus", "profiled.py")
    assert bad.returncode == 2 and "'bogus' is not a column: hit, total" in bad.stderr
    assert "Traceback" not in bad.stderr
    nowhere = rethook("profile", "-o", "/nonexistent/dir/p.pstats", "profiled.py")
    assert nowhere.returncode == 2 and "cannot write there" in nowhere.stderr
    assert nowhere.stdout == ""  # a usage error: the program did not run


# -- pstats, against cProfile's own file of the same program --------------------------------

def _place(key: tuple) -> tuple[str, int]:
    """A pstats key by (file name, line): rethook names functions by qualname, cProfile by
    co_name, and cProfile keeps the script's path as given."""
    return (os.path.basename(key[0]), key[1])


def _compare_with_cprofile(ours: dict, theirs: dict, functions: set[str]) -> None:
    """Per function of ``functions`` (co_names): calls and primitive calls; per Python caller:
    calls and primitive calls, where the callee's callers are all Python functions rethook
    profiled (a C function in between, such as sum(), is a caller only cProfile sees)."""
    ours = {_place(k): v for k, v in ours.items()}
    seen = set()
    for key, (cc, nc, _tt, _ct, callers) in theirs.items():
        if key[2] not in functions or not key[0].endswith("profiled.py"):
            continue
        seen.add(key[2])
        mine = ours[_place(key)]
        assert (mine[0], mine[1]) == (cc, nc), key
        their_callers = {_place(c): v[:2] for c, v in callers.items()}
        if all(c in ours for c in their_callers):
            assert {_place(c): v[:2] for c, v in mine[4].items()} == their_callers, key
    assert seen == functions


@pytest.fixture(scope="module")
def cprofile_stats(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("cprof") / "c.pstats"
    r = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "profiled.py"],
                       cwd=PROGRAMS, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return pstats.Stats(str(out)).stats


def test_profile_pstats_round_trip_against_cprofile(tmp_path, cprofile_stats):
    out = tmp_path / "r.pstats"
    r = rethook("profile", "-o", str(out), "profiled.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "76\n"  # the table is not printed: the profile is in the file
    assert f"rethook: profile of 4 functions written to {out}" in r.stderr
    stats = pstats.Stats(str(out))  # loads as pstats does for python -m pstats
    printed = io.StringIO()
    pstats.Stats(str(out), stream=printed).sort_stats("cumulative").print_stats()
    assert "177/1" in printed.getvalue()  # fib: 177 calls, 1 primitive, as cProfile prints
    assert {k[2] for k in stats.stats} == {"main", "fib", "step", "gen"}
    _compare_with_cprofile(stats.stats, cprofile_stats, {"main", "fib", "step", "gen"})
    fib = next(v for k, v in stats.stats.items() if k[2] == "fib")
    main = next(v for k, v in stats.stats.items() if k[2] == "main")
    assert 0 < fib[3] <= main[3]  # fib's cumulative time counts its recursion once


def test_export_pstats_from_a_trace_against_cprofile(tmp_path, cprofile_stats):
    trace = tmp_path / "t.dat"
    assert rethook("record", "-o", str(trace), "profiled.py").returncode == 0
    r = rethook("export", "-i", str(trace), "--format", "pstats")
    assert r.returncode == 0, r.stderr
    stats = pstats.Stats(str(tmp_path / "t.pstats"))
    _compare_with_cprofile(stats.stats, cprofile_stats, {"main", "fib", "step", "gen"})
    function_trace = tmp_path / "f.dat"
    assert rethook("record", "-p", "function", "-o", str(function_trace),
                   "profiled.py").returncode == 0
    bad = rethook("export", "-i", str(function_trace), "--format", "pstats")
    assert bad.returncode == 1 and "needs a function_graph trace" in bad.stderr
    assert not (tmp_path / "f.pstats").exists()


# -- Chrome JSON and speedscope, against the program's own counts ----------------------------

FUNCS = ("fib", "squares", "check", "fetch", "crawl", "worker", "main")
GENERATORS = ("squares", "fetch", "crawl")


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    """``counted.py`` recorded with a probe event; its own counts; the trace's entries and
    resumptions per (thread name, function)."""
    from rethook.buffer.traceread import TraceReader

    tmp = tmp_path_factory.mktemp("counted")
    trace, counts = tmp / "trace.dat", tmp / "counts.json"
    r = rethook("record", "-o", str(trace), "-O", "funcgraph-args", "-e",
                "r:app/check __main__.check status=status:s64 ret=$retval:s64",
                "counted.py", str(counts))
    assert r.returncode == 0, r.stderr
    own = Counter()
    for key, n in json.loads(counts.read_text()).items():
        thread, func = key.split("|")
        own[thread, func] = n
    with TraceReader(trace) as reader:
        names = reader.threads
        ids = {f.name: f.id for f in reader.formats}
        entries, resumes, probes = Counter(), Counter(), Counter()
        for ev in reader.events():
            key = (names[ev[2]], ev[4].removeprefix("__main__.") if ev[0] != ids["app/check"]
                   else "check")
            if ev[0] == ids["funcgraph_entry"]:
                entries[key] += 1
            elif ev[0] == ids["funcgraph_resume"]:
                resumes[key] += 1
            elif ev[0] == ids["app/check"]:
                probes[key] += 1
    for key, n in own.items():
        assert entries[key] == n, key  # the trace holds every call the program made
    assert probes == Counter({k: n for k, n in own.items() if k[1] == "check"})
    return tmp, trace, own, entries, resumes, probes


@formats_only
def test_chrome_json_follows_the_trace_event_format(counted):
    tmp, trace, own, entries, resumes, probes = counted
    r = rethook("export", "-i", str(trace), "--format", "chrome", "-o", str(tmp / "t.json"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp / "t.json").read_text())
    assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert doc["displayTimeUnit"] == "ns" and doc["otherData"]["tracer"] == "function_graph"
    events = doc["traceEvents"]
    assert r.stderr.startswith(f"rethook: {len(events):,} events written to")
    thread_names, process_names = {}, {}
    stacks: dict = {}
    last_ts: dict = {}
    begins, instants = Counter(), Counter()
    pid = None
    for ev in events:
        assert isinstance(ev["name"], str) and ev["ph"] in ("B", "E", "i", "M")
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        pid = ev["pid"] if pid is None else pid
        assert ev["pid"] == pid  # one process
        if ev["ph"] == "M":
            assert "ts" not in ev and ev["name"] in ("process_name", "thread_name",
                                                     "thread_sort_index")
            if ev["name"] == "thread_name":
                thread_names[ev["tid"]] = ev["args"]["name"]
            elif ev["name"] == "process_name":
                process_names[ev["pid"]] = ev["args"]["name"]
            continue
        tid = ev["tid"]
        assert tid in thread_names, "thread named before its first event"
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= last_ts.get(tid, 0)
        last_ts[tid] = ev["ts"]
        assert isinstance(ev.get("args", {}), dict)
        stack = stacks.setdefault(tid, [])
        func = (thread_names[tid], ev["name"].removeprefix("__main__."))
        if ev["ph"] == "B":
            stack.append(ev["name"])
            if not ev.get("args", {}).get("resumed"):
                begins[func] += 1
        elif ev["ph"] == "E":
            assert stack and stack.pop() == ev["name"], "E ends the innermost B"
        else:
            assert ev["s"] == "t"
            instants[(thread_names[tid], ev["name"])] += 1
    assert all(not s for s in stacks.values()), "every B has its E"
    assert process_names == {pid: "counted.py"}
    assert sorted(set(thread_names.values())) == ["MainThread", "worker-0", "worker-1"]
    assert begins == entries  # one B per recorded call (resumptions are marked)
    for key, n in own.items():
        assert begins[key] == n
    assert Counter({(t, "check"): n for (t, _), n in instants.items()}) == probes
    fib = next(ev for ev in events if ev["name"] == "__main__.fib" and ev["ph"] == "B")
    assert set(fib["args"]["args"]) == {"n"}  # one arg per parameter


@formats_only
def test_speedscope_follows_its_schema(counted):
    tmp, trace, own, entries, resumes, _ = counted
    r = rethook("export", "-i", str(trace), "--format", "speedscope")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp / "trace.speedscope.json").read_text())
    # FileFormat.File: required $schema (the one URL), shared.frames, profiles
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert isinstance(doc["name"], str) and isinstance(doc["exporter"], str)
    assert isinstance(doc["activeProfileIndex"], int)
    frames = doc["shared"]["frames"]
    for frame in frames:  # FileFormat.Frame: name required; file, line optional
        assert set(frame) <= {"name", "file", "line", "col"} and isinstance(frame["name"], str)
        if "file" in frame:
            assert frame["file"].endswith("counted.py") and isinstance(frame["line"], int)
    names = [f["name"].removeprefix("__main__.") for f in frames]
    assert set(FUNCS) <= set(names) and len(set(names)) == len(names)
    opens = Counter()
    profiles = {}
    for prof in doc["profiles"]:  # FileFormat.EventedProfile
        assert set(prof) == {"type", "name", "unit", "startValue", "endValue", "events"}
        assert prof["type"] == "evented" and prof["unit"] == "nanoseconds"
        assert 0 <= prof["startValue"] <= prof["endValue"]
        thread = prof["name"].split("-", 1)[0] if not prof["name"].startswith("worker") else (
            "-".join(prof["name"].split("-")[:2]))
        profiles[thread] = prof
        stack, at = [], prof["startValue"]
        for ev in prof["events"]:
            assert set(ev) == {"type", "frame", "at"} and ev["type"] in ("O", "C")
            assert 0 <= ev["frame"] < len(frames)
            assert at <= ev["at"] <= prof["endValue"], "at never decreases"
            at = ev["at"]
            if ev["type"] == "O":
                stack.append(ev["frame"])
                opens[thread, names[ev["frame"]]] += 1
            else:
                assert stack and stack.pop() == ev["frame"], "C closes the frame on top"
        assert not stack, "balanced"
    assert sorted(profiles) == ["MainThread", "worker-0", "worker-1"]
    assert opens == entries + resumes  # a call opens a frame, and so does each resumption
    for key, n in own.items():
        if key[1] not in GENERATORS:
            assert opens[key] == n


@formats_only
def test_folded_per_thread_roots(counted):
    tmp, trace, own, *_ = counted
    r = rethook("export", "-i", str(trace), "--format", "folded", "--per-thread", "-o", "-")
    assert r.returncode == 0, r.stderr
    roots = {line.split(";", 1)[0] for line in r.stdout.splitlines()}
    pid = json.loads(rethook("info", "-i", str(trace), "--json").stdout)["pid"]
    assert {re.sub(r"/\d+$", "", root) for root in roots} == {
        f"MainThread-{pid}", f"worker-0-{pid}", f"worker-1-{pid}"}
    bad = rethook("export", "-i", str(trace), "--format", "chrome", "--per-thread")
    assert bad.returncode == 2 and "--per-thread is for --format folded" in bad.stderr


@formats_only
def test_info_text_and_json(counted):
    tmp, trace, own, entries, resumes, probes = counted
    r = rethook("info", "-i", str(trace))
    assert r.returncode == 0, r.stderr
    text = r.stdout
    for needle in ("tracer:         function_graph", "options:        funcgraph-args",
                   "app/check: r:app/check __main__.check status=status:s64",
                   "events:", "threads:        3", "worker-0", "clock:          monotonic_ns"):
        assert needle in text, needle
    assert "counted.py" in text.split("command:", 1)[1].splitlines()[0]
    info = json.loads(rethook("info", "-i", str(trace), "--json").stdout)
    assert info["complete"] and info["lost"] == 0
    assert info["events_by_format"]["funcgraph_entry"] == sum(entries.values())
    assert info["events_by_format"]["funcgraph_resume"] == sum(resumes.values())
    assert info["events_by_format"]["app/check"] == sum(probes.values())
    assert {t["name"] for t in info["threads"]} == {"MainThread", "worker-0", "worker-1"}
    assert info["span_ns"][0] < info["span_ns"][1]
    assert info["meta"]["functions"]["__main__.fib"][1:] == [20, "fib"]
    damaged = tmp / "cut.dat"
    damaged.write_bytes(trace.read_bytes()[: trace.stat().st_size // 2])
    r = rethook("info", "-i", str(damaged))
    assert r.returncode == 1 and "damaged:" in r.stdout and "rethook: error:" in r.stderr
    assert "Traceback" not in r.stderr


# -- arguments as one annotation each ------------------------------------------------------

_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=6)


@formats_only
@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), _values,
                       min_size=1, max_size=4))
def test_split_args_gives_one_item_per_parameter(params):
    text = ", ".join(f"{k}={bounded_repr(v)}" for k, v in params.items())
    assert split_args(text) == {k: bounded_repr(v) for k, v in params.items()}


@formats_only
def test_split_args_of_odd_reprs():
    assert split_args("self=<Shape a, b=1>, n=2") == {"self": "<Shape a, b=1>", "n": "2"}
    assert split_args("s='it''s, x=1'") == {"s": "'it''s, x=1'"}
    assert split_args("not args") == {"args": "not args"}


# -- the terminal ---------------------------------------------------------------------------

@pytest.fixture
def term_env(monkeypatch):
    """No terminal conventions from the environment the tests run in."""
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TERM", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _colours(text: str) -> set[int]:
    """The colour parameters (foreground, background) of the SGR sequences in ``text``."""
    return {int(p) for m in ANSI.finditer(text) for p in m.group()[2:-1].split(";")
            if p.isdigit() and (30 <= int(p) <= 49 or 90 <= int(p) <= 107)}


@formats_only
def test_report_and_profile_colour_only_on_a_colour_terminal(tmp_path, term_env):
    from rethook.cli.reporting import report_file
    from rethook.cli.summaries import print_profile

    trace = tmp_path / "t.dat"
    assert rethook("record", "-o", str(trace), "profiled.py").returncode == 0

    def report(**env: str) -> str:
        for name, value in env.items():
            term_env.setenv(name, value)
        out = io.StringIO()  # not a terminal: FORCE_COLOR makes it one
        assert report_file(str(trace), (), out) == 0
        table = io.StringIO()
        print_profile(_stats(), table, sort=None, limit=None, graph_time=True)
        for name in env:
            term_env.delenv(name)
        return out.getvalue(), table.getvalue()

    plain, plain_table = report()
    assert "\x1b" not in plain + plain_table and "  Function" in plain_table
    forced, forced_table = report(FORCE_COLOR="1")
    assert "\x1b[" in forced  # the duration marks
    assert ANSI.sub("", forced) == plain
    assert _colours(forced_table) and "  Function" not in forced_table  # a rich table
    no_colour, no_colour_table = report(FORCE_COLOR="1", NO_COLOR="1")
    assert no_colour == plain and not _colours(no_colour_table)  # bold and dim stay
    assert "app.fib" in no_colour_table and "  Function" not in no_colour_table
    assert report(FORCE_COLOR="1", TERM="dumb") == (plain, plain_table)


@formats_only
def test_progress_bar_on_a_terminal_only(tmp_path, term_env):
    monkeypatch = term_env
    from rethook.cli import reporting, term

    trace = tmp_path / "t.dat"
    assert rethook("record", "-o", str(trace), "profiled.py").returncode == 0
    monkeypatch.setattr(term, "PROGRESS_MIN_EVENTS", 1)
    monkeypatch.setattr(term, "PROGRESS_STEP", 7)
    outputs = {}
    for forced in (False, True):
        if forced:
            monkeypatch.setenv("FORCE_COLOR", "1")  # stderr counts as a terminal
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        out = tmp_path / f"{forced}.json"
        assert reporting.export_file(str(trace), "chrome", str(out)) == 0
        outputs[forced] = out.read_text()
        shown = err.getvalue()
        assert ("export chrome" in shown) == forced, shown
    assert outputs[True] == outputs[False]  # the bar changes nothing in the output
