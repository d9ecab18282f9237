"""Dynamic probe events end to end: definitions through tracefs, on real programs."""

import asyncio
import re
import sys
import threading

import pytest

from programs import probed
from rethook.control import Tracefs, TracefsError


@pytest.fixture
def fs(engine):
    fs = Tracefs()
    yield fs
    fs.close()


def events(fs, text, enable=True):
    fs.write("dynamic_events", text, append=True)
    if enable:
        fs.write("events/enable", "1")


def lines(fs):
    """The event part of each trace line (after ``comm-pid [cpu] ts: ``)."""
    return [line.split(": ", 1)[1] for line in fs.read("trace").splitlines()
            if not line.startswith("#") and ": " in line]


def test_return_probe_sees_arguments_as_passed_and_the_return_value(fs):
    events(fs, "r:send programs.probed.Session.send self.host path size:u32 ret=$retval:s16")
    s = probed.Session("example.org")
    here = sys._getframe().f_lineno
    assert s.send("/index", 12) == 200
    assert s.send("/big", 500) == 413
    test = "test_return_probe_sees_arguments_as_passed_and_the_return_value"
    assert lines(fs) == [
        f"send: (test_probe_events.{test}+{here + 1} <- programs.probed.Session.send) "
        f"arg1='example.org' path='/index' size=12 ret=200",
        f"send: (test_probe_events.{test}+{here + 2} <- programs.probed.Session.send) "
        f"arg1='example.org' path='/big' size=500 ret=413",
    ]


def test_entry_probe_and_default_names(fs):
    events(fs, "p programs.probed.lookup key:string")
    assert fs.read("dynamic_events") == (
        "p:kprobes/p_programs_probed_lookup_0 programs.probed.lookup key=key:string\n")
    probed.lookup({"a": 1}, "a")
    (line,) = lines(fs)
    line_no = probed.lookup.__code__.co_firstlineno
    assert line == f'p_programs_probed_lookup_0: (programs.probed.lookup+{line_no}) key="a"'


def test_exceptions_are_recorded_and_marked(fs):
    events(fs, "r:lk programs.probed.lookup key ret=$retval")
    with pytest.raises(KeyError):
        probed.lookup({}, "missing")
    (line,) = lines(fs)
    assert line.endswith("key='missing' ret=(raised KeyError: 'missing')")


def test_generator_and_coroutine_return_values(fs):
    events(fs, "f:fprobes/cd programs.probed.countdown%return n r=$retval\n"
               "f:fprobes/fe programs.probed.fetch%return value r=$retval d=$duration")
    assert list(probed.countdown(3)) == [3, 2, 1]
    assert asyncio.run(probed.fetch_all()) == [2, 4]
    got = lines(fs)
    assert got[0].endswith("n=3 r='liftoff'")
    fetches = sorted(line for line in got if line.startswith("fe:"))
    assert len(fetches) == 2
    assert re.search(r"value=1 r=2 d=\d+$", fetches[0])
    assert re.search(r"value=2 r=4 d=\d+$", fetches[1])


def test_fetch_chains_types_and_faults(fs):
    events(fs, 'p:ch programs.probed.lookup t=table["a"][1]:x8 n=table["b"]:u8 missing=table["zz"] '
               "ty=key:type ln=table:len yes=key:bool g=@programs.probed.asyncio:type")
    probed.lookup({"a": [0, 255], "b": 300}, "a")
    probed.lookup({"a": "x"}, "a")
    first, second = lines(fs)
    assert first.endswith("t=0xff n=44 missing=(fault) ty=str ln=2 yes=True g=module")
    assert "t=(fault) n=(fault)" in second


def test_filters_count_exactly(fs):
    events(fs, "r:sz programs.probed.sizes data:len r=$retval:u32")
    fs.write("events/kprobes/sz/filter", "data > 3 && r < 10")
    kept = 0
    for n in range(15):
        probed.sizes("x" * n)
        kept += 3 < n < 10
    assert len(lines(fs)) == kept == 6
    assert fs.read("events/kprobes/sz/filter") == "data > 3 && r < 10\n"
    assert fs.read("kprobe_profile").split() == ["sz", "15", "0"]


def sizes_with(fs, calls, **files):
    """An ``r:sz`` probe on programs.probed.sizes (``r`` its return value), files of its
    events/kprobes/sz/ written in order (FILE=TEXT, TEXT or a list), then sizes(0..calls-1)."""
    fs.write("current_tracer", "nop")
    events(fs, "r:sz programs.probed.sizes r=$retval:u32")
    for name, texts in files.items():
        for text in [texts] if isinstance(texts, str) else texts:
            fs.write(f"events/kprobes/sz/{name}", text)
    for n in range(calls):
        probed.sizes("y" * n)


def test_traceoff_trigger_with_count_and_filter(fs):
    sizes_with(fs, 8, trigger="traceoff:1 if r == 5")
    assert fs.read("tracing_on") == "0\n"
    # recorded: sizes 0..5; traceoff is a post trigger (the kernel's), so the hit with r == 5
    # that turned tracing off is recorded, and nothing after it
    assert [line.rsplit("=", 1)[1] for line in lines(fs)] == ["0", "1", "2", "3", "4", "5"]
    assert fs.read("events/kprobes/sz/trigger") == "traceoff:count=0 if r == 5\n"


def test_the_event_filter_does_not_gate_triggers(fs):
    """The kernel's rule (trace_events_trigger.c: event_triggers_call runs before the event
    filter discards the event): every hit reaches the triggers, each gated by its own filter;
    traceoff and stacktrace act after the event."""
    sizes_with(fs, 8, filter="r > 5", trigger=[
        "hist:keys=r", "hist:keys=r:sort=r if r > 5", "stacktrace:2 if r >= 2"])
    hist_all, hist_kept = fs.read("events/kprobes/sz/hist").split("\n\n# event histogram")
    assert "    Hits: 8\n" in hist_all and "    Hits: 2\n" in hist_kept
    trace = lines(fs)
    # two stack traces (r == 2, 3, whose events the filter dropped), then the events r > 5
    assert [line.split(" ", 1)[0] for line in trace] == ["<stack", "<stack", "sz:", "sz:"]
    assert [line.rsplit("=", 1)[1] for line in trace[2:]] == ["6", "7"]


def test_stack_trace_trigger_follows_its_event(fs):
    sizes_with(fs, 3, trigger="stacktrace if r == 1")
    trace = [line.split(" ", 1)[0] for line in lines(fs)]
    assert trace == ["sz:", "sz:", "<stack", "sz:"]


def test_histogram_totals_equal_calls(fs):
    events(fs, "r:sz programs.probed.sizes data:len")
    fs.write("events/kprobes/sz/trigger", "hist:keys=data.log2")
    calls = 0
    for n in range(1, 40):
        probed.sizes("z" * n)
        calls += 1
    hist = fs.read("events/kprobes/sz/hist")
    assert f"    Hits: {calls}\n" in hist
    # the kernel's buckets are log2 of the value rounded up to a power of two:
    # 1, 2, 3-4, 5-8, 9-16, 17-32, 33-39
    assert "    Entries: 7\n" in hist
    counts = [int(m) for m in re.findall(r"hitcount:\s+(\d+)", hist)]
    assert sum(counts) == calls


def test_probe_on_a_module_imported_later(fs):
    sys.modules.pop("programs.probed_late", None)
    events(fs, "r:dbl programs.probed_late.double x r=$retval")
    import programs.probed_late as late

    assert late.FIRST == 42
    late.double(5)
    assert [line.split(") ", 1)[1] for line in lines(fs)] == ["x=21 r=42", "x=5 r=10"]


def test_probes_added_and_deleted_while_another_thread_runs(fs):
    stop = threading.Event()
    done = []

    def worker():
        n = 0
        while not stop.is_set():
            probed.sizes("w" * (n % 5))
            n += 1
        done.append(n)

    t = threading.Thread(target=worker)
    t.start()
    try:
        for i in range(10):
            fs.write("dynamic_events", f"r:s{i} programs.probed.sizes r=$retval:u8", append=True)
            fs.write(f"events/kprobes/s{i}/enable", "1")
            probed.sizes("main")
            fs.write(f"events/kprobes/s{i}/enable", "0")
            fs.write("dynamic_events", f"-:s{i}", append=True)
    finally:
        stop.set()
        t.join()
    assert done and fs.read("dynamic_events") == ""
    per_event = {}
    for line in lines(fs):
        per_event.setdefault(line.split(":", 1)[0], []).append(line)
    # every event saw the main thread's own call at least
    assert sorted(per_event) == sorted(f"s{i}" for i in range(10))


def test_rejected_commands_create_nothing_and_point_at_the_error(fs):
    with pytest.raises(TracefsError) as info:
        fs.write("dynamic_events", "r:bad programs.probed.sizes data=$arg9x", append=True)
    text = str(info.value)
    assert "Invalid" in text and "Command: r:bad programs.probed.sizes data=$arg9x" in text
    caret = text.splitlines()[-1]
    command = [line for line in text.splitlines() if "Command:" in line][0]
    assert command[caret.index("^")] == "$"
    assert fs.read("dynamic_events") == ""
    assert "Command: r:bad" in fs.read("error_log")
    with pytest.raises(TracefsError, match="no function matches"):
        fs.write("dynamic_events", "r:nope programs.probed.no_such", append=True)
    with pytest.raises(TracefsError, match="Expecting string field"):  # repr is a string
        fs.write("dynamic_events", "r:ok programs.probed.sizes data", append=True)
        fs.write("events/kprobes/ok/filter", "data > 3")
    assert fs.read("events/kprobes/ok/filter") == "none\n"


def test_disabled_events_cost_nothing(fs):
    events(fs, "r:sz programs.probed.sizes", enable=False)
    tool = fs.ctx.engine.tool_id
    code = probed.sizes.__code__
    assert tool is None or sys.monitoring.get_local_events(tool, code) == 0
    fs.write("events/kprobes/sz/enable", "1")
    assert sys.monitoring.get_local_events(fs.ctx.engine.tool_id, code) != 0


def test_redefined_event_keeps_old_records_printable(fs):
    events(fs, "r:sz programs.probed.sizes data:len")
    probed.sizes("ab")
    fs.write("events/kprobes/sz/enable", "0")
    fs.write("dynamic_events", "-:kprobes/sz", append=True)
    events(fs, "r:sz programs.probed.sizes r=$retval:u8 data:string")
    probed.sizes("xyz")
    assert [line.split(") ", 1)[1] for line in lines(fs)] == ["data=2", 'r=3 data="xyz"']
