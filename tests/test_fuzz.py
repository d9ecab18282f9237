"""Fuzzing what users type and what files hold (issue 13's suite).

Every input is either accepted or refused with the error its grammar documents -- never a
traceback -- and a refused one changes nothing:

- the grammars (filter commands, probe definitions and fetch args, event filters, triggers
  and hist commands) on token soup built from their own words and from numbers of every
  size, including ones past CPython's 4300-digit limit;
- tracefs writes: a refused write leaves every file as it was, and ``current_tracer`` always
  names a tracer that runs;
- the command line's flags, parsed and applied in-process as ``rethook record`` does before
  the program starts (usage errors exit 2, and no file is made), and a few real runs in a
  subprocess;
- trace files: truncated at every chunk boundary and inside chunks, bit flips, META keys of
  the wrong type (CRCs made right). ``report``, ``export``, ``hist`` and the Python reader
  print everything before the damage and then one ``rethook: error: FILE: what (at byte
  offset N)`` line; an export never leaves a half file over an existing one.

The examples per test are few enough for CI; ``RETHOOK_FUZZ=long`` multiplies them (by 25)
for a longer search (docs/cli.md, "Testing").
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import warnings
import zlib
from pathlib import Path
from types import FunctionType

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rethook.runner.run
from programs import calls
from rethook.buffer.tracefile import (
    CHUNK_OVERHEAD,
    HEADER_SIZE,
    TraceFileError,
    TraceFileWarning,
    TraceWriter,
)
from rethook.buffer.traceread import TraceReader
from rethook.cli import main as climain
from rethook.cli.reporting import export_file, hist_file, report_file
from rethook.control.tracefs import Tracefs, TracefsError
from rethook.engine.engine import get_engine
from rethook.engine.filters import FilterError, parse_filter_text
from rethook.engine.registry import Registry
from rethook.probes.dynevent import parse_definition
from rethook.probes.evfilter import FilterSyntaxError, compile_filter
from rethook.probes.fetch import ProbeSyntaxError
from rethook.probes.triggers import parse_trigger
from rethook.runner.program import Outcome
from rethook.tracers.base import TraceContext

LONG = os.environ.get("RETHOOK_FUZZ") == "long"


def fuzz(examples: int):
    """Hypothesis settings for a fuzz test: ``examples`` in CI, 25 times more when long."""
    return settings(max_examples=examples * (25 if LONG else 1), deadline=None,
                    derandomize=not LONG,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.function_scoped_fixture])


# --- strategies ----------------------------------------------------------------------------------
#: Numbers as users type them: small, at the edges of the ranges, huge, and (rarely: every
#: grammar is linear in them, but a 5000-character glob is slow to compile) past the 4300
#: digits int() takes.
_SMALL = st.one_of(
    st.integers(-5, 300).map(str),
    st.sampled_from(["0", "-0", "+1", "007", "0x10", "0o7", "0b1", "1_000", "4294967295",
                     "4294967296", "9223372036854775807", "9223372036854775808",
                     "18446744073709551615", "18446744073709551616", "-9223372036854775809",
                     "128", "131072", "65535", "65536", "127"]),
    st.integers(19, 60).map(lambda n: "9" * n),
)
HUGE = ["9" * 4301, "1" + "0" * 5000, "0" * 5000 + "1"]
#: In CI, numbers up to 60 digits (every grammar meets numbers past int()'s limit in
#: test_every_number_slot_takes_a_huge_number); the long profile mixes those in too.
NUMBERS = st.one_of(_SMALL, st.sampled_from(HUGE)) if LONG else _SMALL


def soup(words: list[str]) -> st.SearchStrategy[str]:
    """Text made of a grammar's words, numbers and separators, in any order."""
    token = st.one_of(st.sampled_from(words), NUMBERS, st.sampled_from([" ", " ", ":", "=", ","]),
                      st.text(max_size=3))
    return st.lists(token, max_size=12).map("".join)


FILTER_WORDS = ["fib", "calls.*", "*fib*", "!", ":mod:", "programs.calls", "traceon", "traceoff",
                "stacktrace", "dump", "enable_event", "count=", "unlimited", "[a-z]", "?", "\n"]
PROBE_WORDS = ["p", "r", "f", ":", "g/e", "-:", "programs.calls.fib", "%return", "n", "x=",
               "$arg", "$retval", "$stack", "$comm", "$duration", "\\", '\\"s"', "@calls.x",
               ":u8", ":s64", ":x32", ":string", ":symbol", ":repr", "[", "]", "->", ".", "+"]
EVFILTER_WORDS = ["len", "ret", "dur", "name", "ok", "common_pid", "==", "!=", ">", "<=", "&",
                  "~", "&&", "||", "!", "(", ")", '"a*"', "'x'", "-", "."]
TRIGGER_WORDS = ["traceon", "traceoff", "stacktrace", "snapshot", "hist", ":keys=", ":vals=",
                 ":size=", ":sort=", ":pause", ":cont", ":clear", ":name=", "len", "ret", "name",
                 ".hex", ".log2", ".buckets=", ".descending", "hitcount", " if ", "&&", "!", "=="]
FIELDS = {"len": "u64", "ret": "s64", "dur": "f64", "name": "str", "ok": "bool"}


def assert_position(e: Exception, text: str) -> None:
    """The caret is inside the text, or just past it (where a missing word would go)."""
    pos = getattr(e, "position", 0)
    assert 0 <= pos <= len(text) + 1, (pos, e)


# --- grammars ------------------------------------------------------------------------------------
@fuzz(300)
@given(soup(FILTER_WORDS))
def test_filter_commands(text):
    try:
        parse_filter_text(text)  # syntax (resolution is fuzzed with the tracefs writes)
    except FilterError as e:
        assert_position(e, text)
        assert "Command:" in str(e)


@fuzz(300)
@given(soup(PROBE_WORDS))
def test_probe_definitions(text):
    try:
        d = parse_definition(text)
    except ProbeSyntaxError as e:
        assert_position(e, text)
        return
    canonical = getattr(d, "canonical", None)
    if canonical is not None:
        parse_definition(canonical())  # what it prints, it reads back


@fuzz(300)
@given(soup(EVFILTER_WORDS))
def test_event_filters(text):
    try:
        flt = compile_filter(text, FIELDS)
    except FilterSyntaxError as e:
        assert_position(e, text)
        return
    flt.match({"len": 3, "ret": -1, "dur": 0.5, "name": "abc", "ok": True})


@fuzz(300)
@given(soup(TRIGGER_WORDS))
def test_triggers_and_hists(text):
    try:
        parse_trigger(text, FIELDS)
    except FilterSyntaxError as e:
        assert_position(e, text)


#: Every place a grammar reads a number, with N standing for it.
NUMBER_SLOTS = [
    ("filter", "fib:traceon:N"), ("filter", "fib:stacktrace:count=N"),
    ("probe", "rN:g/e programs.calls.fib"), ("probe", "p:g/e programs.calls.fib x=\\N"),
    ("probe", "p:g/e programs.calls.fib x=\\-N"), ("probe", "p:g/e programs.calls.fib x=\\0xN"),
    ("probe", "p:g/e programs.calls.fib x=$argN"), ("probe", "p:g/e programs.calls.fib x=$stackN"),
    ("probe", "p:g/e programs.calls.fib x=n[N]"), ("evfilter", "len > N"),
    ("evfilter", "ret == -N"), ("evfilter", "dur < N"), ("evfilter", "len & 0xN"),
    ("trigger", "traceon:N"), ("trigger", "stacktrace:N if len > N"),
    ("trigger", "hist:keys=len:size=N"), ("trigger", "hist:keys=len.buckets=N"),
]


@pytest.mark.parametrize("number", [*HUGE[:2], "18446744073709551616", "99999999999999999999999"])
@pytest.mark.parametrize(("grammar", "text"), NUMBER_SLOTS)
def test_every_number_slot_takes_a_huge_number(grammar, text, number):
    """Past its range, or past the 4300 digits int() converts: an error at the number."""
    text = text.replace("N", number)
    try:
        if grammar == "filter":
            parse_filter_text(text)
        elif grammar == "probe":
            parse_definition(text)
        elif grammar == "evfilter":
            compile_filter(text, FIELDS)
        else:
            parse_trigger(text, FIELDS)
    except (FilterError, ProbeSyntaxError, FilterSyntaxError) as e:
        assert_position(e, text)
        assert len(str(e)) < 2 * len(text) + 300
    else:
        assert grammar == "evfilter" and "dur" in text  # a float: any size is a number


# --- tracefs writes ------------------------------------------------------------------------------
PATHS = ["set_ftrace_filter", "set_ftrace_notrace", "set_graph_function", "set_graph_notrace",
         "current_tracer", "max_graph_depth", "tracing_thresh", "buffer_size_kb", "trace_options",
         "tracing_on", "function_profile_enabled", "dynamic_events", "kprobe_events",
         "events/enable", "events/g/enable", "events/g/e/enable", "events/g/e/filter",
         "events/g/e/trigger", "options/funcgraph-retval", "options/bogus", "trace",
         "trace_stat/function0", "nosuch"]
#: Files whose text must not change when a write is refused (trace and error_log may).
WATCHED = ["current_tracer", "set_ftrace_filter", "set_ftrace_notrace", "set_graph_function",
           "set_graph_notrace", "max_graph_depth", "tracing_thresh", "buffer_size_kb",
           "trace_options", "tracing_on", "function_profile_enabled", "dynamic_events",
           "events/enable", "enabled_functions"]
WRITES = st.one_of(
    soup([*FILTER_WORDS, *PROBE_WORDS, *TRIGGER_WORDS, "function", "function_graph", "nop",
          "funcgraph-retval", "nofuncgraph-tail", "overwrite", "nograph-time"]),
    NUMBERS)


def _state(fs: Tracefs) -> dict[str, str]:
    out = {path: fs.read(path) for path in WATCHED}
    for path in fs.listdir():
        if path.startswith("events/") and path.rsplit("/", 1)[1] in ("filter", "trigger",
                                                                       "enable"):
            out[path] = fs.read(path)
    return out


class _Only(Registry):
    """A registry of the functions added to it, never the whole process's: with an empty
    filter the tracer hooks every function its registry knows, and this process knows
    tens of thousands."""

    def _scan(self) -> list:
        self._scanned = True
        return []


@pytest.fixture
def tracefs(engine):
    reg = _Only()
    for value in vars(calls).values():
        if isinstance(value, FunctionType):
            reg.info(value.__code__, calls.__name__)
    fs = Tracefs(TraceContext(registry=reg))
    fs.write("current_tracer", "function_graph")
    fs.write("dynamic_events", "p:g/e programs.calls.fib n", append=True)
    yield fs
    fs.close()


@fuzz(200)
@given(st.lists(st.tuples(st.sampled_from(PATHS), WRITES, st.booleans()), min_size=1,
                max_size=5))
def test_tracefs_writes_apply_whole_or_not_at_all(tracefs, writes):
    fs = tracefs
    for path, text, append in writes:
        before = _state(fs)
        try:
            fs.write(path, text, append=append)
        except TracefsError:
            after = _state(fs)
            changed = {k for k in before if before[k] != after.get(k)}
            if path in ("dynamic_events", "kprobe_events") and not append:
                # the kernel's rule: a truncating write removes every event first
                changed = {k for k in changed if k != "dynamic_events"
                           and not k.startswith("events/")}
            assert not changed, (path, text, changed)
        tracer = fs.read("current_tracer").strip()
        assert tracer == "nop" or fs.tracer.ops is not None, tracer  # it names what runs
        calls.fib(3)


# --- the command line, in-process ----------------------------------------------------------------
FLAG_VALUES = {"-b": NUMBERS, "--max-graph-depth": NUMBERS, "--tracing-thresh": NUMBERS,
               "-p": st.sampled_from(["function", "function_graph", "nop", "bogus"]),
               "-l": soup(FILTER_WORDS), "-n": soup(FILTER_WORDS), "-g": soup(FILTER_WORDS),
               "-O": st.sampled_from(["funcgraph-retval", "nofuncgraph-tail", "bogus", ""]),
               "-e": soup(PROBE_WORDS), "-f": soup(EVFILTER_WORDS), "-R": soup(TRIGGER_WORDS)}
FLAGS = st.lists(st.sampled_from(sorted(FLAG_VALUES)).flatmap(
    lambda flag: st.tuples(st.just(flag), FLAG_VALUES[flag])), max_size=5)

PROGRAM = "def work(n):\n    return n + 1\n\nfor i in range(3):\n    work(i)\nprint('ran')\n"


class _NoRun:
    """Session stand-in: the program is not run; the trace instance is closed, as a run
    ends it (the command's own setup is what is under test)."""

    def __init__(self, program, fs, children=None):
        self.fs = fs

    def run(self, observers=()):
        self.fs.close()
        return Outcome()


def _runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        return CliRunner()


@pytest.fixture
def program_dir(tmp_path, monkeypatch, engine):
    (tmp_path / "prog.py").write_text(PROGRAM)
    monkeypatch.setattr(rethook.runner.run, "Session", _NoRun)
    monkeypatch.chdir(tmp_path)
    saved = list(sys.path)
    yield tmp_path
    sys.path[:] = saved


@fuzz(60)
@given(flags=FLAGS)
def test_record_flags_in_process(program_dir, flags):
    out = program_dir / "t.dat"
    with contextlib.suppress(FileNotFoundError):
        out.unlink()
    args = ["record", "-o", str(out)]
    for flag, value in flags:
        args += [flag, value]
    result = _runner().invoke(climain.cli, [*args, "prog.py"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: {result.exception!r}") from result.exception
    assert result.exit_code in (0, 2), (args, result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr
    if result.exit_code == 2:
        assert re.search(r"^(Error: |rethook: error: )", result.stderr, re.M), result.stderr
        assert not out.exists(), "a refused command made its output file"
    assert not get_engine().users


# --- the command line, as users run it -----------------------------------------------------------
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-m", "rethook", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@fuzz(4)
@given(flags=FLAGS)
def test_record_flags_in_a_subprocess(tmp_path_factory, flags):
    where = tmp_path_factory.mktemp("cli")
    (where / "prog.py").write_text(PROGRAM)
    args = [x for pair in flags for x in pair]
    r = _cli("record", "-o", "t.dat", *args, "prog.py", cwd=where)
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode == 2:
        assert "ran" not in r.stdout and not (where / "t.dat").exists()
        assert "Error:" in r.stderr or "rethook: error:" in r.stderr
    else:
        assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
        assert _cli("report", "-i", "t.dat", cwd=where).returncode == 0


# --- damaged trace files -------------------------------------------------------------------------
ERROR_LINE = re.compile(r"^rethook: error: (.+): (.+) \(at byte offset (\d+)\)", re.M)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """A trace of many small chunks: function_graph, a probe event with a histogram, a Lost
    marker, thread names, counters."""
    fs = Tracefs()
    try:
        fs.write("current_tracer", "function_graph")
        fs.write("set_ftrace_filter", "programs.calls.fib")
        fs.write("dynamic_events", "r:g/ret programs.calls.fib ret=$retval:s64", append=True)
        fs.write("events/g/ret/trigger", "hist:keys=ret")
        fs.write("events/g/ret/enable", "1")
        calls.fib(7)
        fs.write("tracing_on", "0")
        events = list(fs.ctx.buffer.iter_trace())
        meta = {"tracer": "function_graph", "options": fs.ctx.options.as_dict(),
                "probe_events": dict(fs.dynamic.printed)}
        hists = {name: e.read_hist() for name, e in fs.dynamic.events.items()}
        path = tmp_path_factory.mktemp("sample") / "sample.dat"
        with TraceWriter(path, meta, formats=fs.ctx.formats, batch_events=16) as w:
            for tid, name in fs.ctx.buffer.threads().items():
                w.set_thread_name(tid, name)
            tid = events[0][2]
            w.write_events(events[:40])
            w.write_lost(tid, 3)
            w.write_events(events[40:])
            w.write_stats(fs.ctx.buffer.stats())
            w.set_meta("histograms", hists)
    finally:
        fs.close()
    return path


def _chunks(data: bytes) -> list[tuple[int, bytes, int]]:
    """(offset, tag, length) of every chunk."""
    out, pos = [], HEADER_SIZE
    while pos < len(data):
        tag, length = struct.unpack_from("<4sI", data, pos)
        out.append((pos, tag, length))
        pos += CHUNK_OVERHEAD + length
    return out


def _read_all(path) -> dict[str, tuple[int, str, str]]:
    """Every reader on ``path``: report, export (both formats), hist -> (status, out, err)."""
    runs = {}
    for name, call in (
            ("report", lambda: report_file(str(path), ())),
            ("perfetto", lambda: export_file(str(path), "perfetto", str(path) + ".pf")),
            ("folded", lambda: export_file(str(path), "folded", str(path) + ".folded")),
            ("hist", lambda: hist_file(str(path), ()))):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = call()
            except click.UsageError as e:  # hist -e: not here
                raise AssertionError(e) from e
        runs[name] = (status, out.getvalue(), err.getvalue())
    return runs


def _check_damaged(path, intact_report: list[str]) -> None:
    for name, (status, out, err) in _read_all(path).items():
        assert "Traceback" not in err and "Warning" not in err, (name, err)
        errors = [line for line in err.splitlines() if line.startswith("rethook: error:")]
        if status == 0:
            assert not errors, (name, err)
            continue
        assert status == 1 and len(errors) == 1, (name, status, err)
        assert ERROR_LINE.match(errors[0]), errors[0]
        if name == "report":  # everything before the damage (the last line may be cut short)
            lines = out.splitlines()[:-1]
            assert lines == intact_report[:len(lines)], name
    with warnings.catch_warnings(record=True) as caught:  # the Python API: never a crash
        warnings.simplefilter("always")
        try:
            with TraceReader(path, strict=False) as r:
                list(r.events(lost=True))
                _ = (r.all_meta, r.threads, r.stats, r.formats)
        except TraceFileError:
            pass  # the header itself: not a trace file
        try:
            with TraceReader(path) as r:
                list(r.events(lost=True))
        except TraceFileError:
            pass
    assert all(w.category is TraceFileWarning for w in caught), [str(w) for w in caught]


@pytest.fixture(scope="module")
def intact(sample):
    out = io.StringIO()
    assert report_file(str(sample), (), out=out) == 0
    return out.getvalue().splitlines()


def test_truncated_at_every_chunk_boundary_and_inside(sample, intact, tmp_path):
    data = sample.read_bytes()
    cuts = {0, 5, HEADER_SIZE - 1}
    for offset, _tag, length in _chunks(data):
        cuts |= {offset, offset + 3, offset + 8 + length // 2, offset + CHUNK_OVERHEAD + length - 1}
    damaged = tmp_path / "cut.dat"
    for cut in sorted(c for c in cuts if c < len(data)):
        damaged.write_bytes(data[:cut])
        _check_damaged(damaged, intact)


@fuzz(100)
@given(where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_bit_flips(sample, intact, tmp_path_factory, where, bit):
    data = bytearray(sample.read_bytes())
    i = int(where * len(data))
    data[i] ^= 1 << bit
    damaged = tmp_path_factory.mktemp("flip") / "flip.dat"
    damaged.write_bytes(bytes(data))
    _check_damaged(damaged, intact)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


def _with_meta(data: bytes, key: str, value) -> bytes:
    """``data`` with ``key`` of its first META chunk set to ``value``, CRC made right."""
    offset, tag, length = _chunks(data)[0]
    assert tag == b"META"
    meta = json.loads(data[offset + 8:offset + 8 + length])
    meta[key] = value
    payload = json.dumps(meta).encode()
    head = struct.pack("<4sI", b"META", len(payload))
    chunk = head + payload + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head)))
    return data[:offset] + chunk + data[offset + CHUNK_OVERHEAD + length:]


@fuzz(100)
@given(key=st.sampled_from(["tracer", "options", "probe_events", "histograms", "argv", "pid"]),
       value=JSON)
def test_meta_of_the_wrong_type(sample, intact, tmp_path_factory, key, value):
    damaged = tmp_path_factory.mktemp("meta") / "meta.dat"
    damaged.write_bytes(_with_meta(sample.read_bytes(), key, value))
    _check_damaged(damaged, intact)


def test_an_export_never_replaces_a_file_with_nothing(sample, tmp_path):
    data = sample.read_bytes()
    damaged = tmp_path / "d.dat"
    damaged.write_bytes(data[:_chunks(data)[1][0] + 4])  # only the first META survives
    for fmt in ("perfetto", "folded"):
        out = tmp_path / f"out.{fmt}"
        out.write_text("precious")
        assert export_file(str(damaged), fmt, str(out)) == 1
        assert out.read_text() == "precious"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            ["d.dat", *(f"out.{f}" for f in ("perfetto", "folded") if (tmp_path / f"out.{f}")
                        .exists())])  # no temporary file left behind



