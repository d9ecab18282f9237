"""The tracers through the tracefs control surface, on real programs, with exact output."""

import re
import sys

import pytest

from programs import calls, shapes
from rethook.control import Tracefs, TracefsError

MOD = "*:mod:programs.shapes"


def normalise(text: str) -> list[str]:
    """Durations, timestamps and thread ids vary from run to run; nothing else may."""
    out = []
    for line in text.splitlines():
        line = re.sub(r"(?<=[)|]) [ +!#*@$] +\d+(\.\d+)? us +\|", "  DUR |", line)
        # %5llu seconds since boot: the padding shrinks once the machine is up 1e5 s
        line = re.sub(r"(?:^|(?<=\S)) *\d+\.\d{6}", " TS", line)
        line = re.sub(r"-\d+ *(?=\[)", "-TID ", line)  # function lines: comm-pid, padded
        line = re.sub(r"-\d+", "-TID", line) if "|" in line else line
        out.append(line.rstrip())
    return out


@pytest.fixture
def fs(engine):
    fs = Tracefs()
    yield fs
    fs.close()


def trace_of(fs, fn, *args, tracer="function_graph", filter=MOD):
    fs.write("set_ftrace_filter", filter)
    fs.write("current_tracer", tracer)
    fn(*args)
    fs.write("tracing_on", "0")
    return normalise(fs.read("trace"))


GRAPH_HEADER = [
    "# tracer: function_graph",
    "#",
    "# CPU  DURATION                  FUNCTION CALLS",
    "# |     |   |                     |   |   |   |",
]


def test_function_graph_exact_lines(fs):
    assert trace_of(fs, shapes.top, 1) == GRAPH_HEADER + [
        " 0)               |  programs.shapes.top() {",
        " 0)               |    programs.shapes.middle() {",
        " 0)  DUR |      programs.shapes.leaf();",
        " 0)  DUR |    }",
        " 0)  DUR |    programs.shapes.failing(); /* raised */",
        " 0)               |    programs.shapes.numbers() {",
        " 0)  DUR |      programs.shapes.leaf();",
        " 0)               |    } /* programs.shapes.numbers suspended */",
        " 0)               |    programs.shapes.numbers() { /* resumed */",
        " 0)  DUR |      programs.shapes.leaf();",
        " 0)               |    } /* programs.shapes.numbers suspended */",
        " 0)               |    programs.shapes.numbers() { /* resumed */",
        " 0)  DUR |    }",
        " 0)  DUR |  }",
    ]


def test_retval_args_tail_and_proc(fs):
    for opt in ("funcgraph-retval", "funcgraph-args", "funcgraph-tail"):
        fs.write(f"options/{opt}", "1")
    fs.write("options/funcgraph-duration", "0")
    lines = trace_of(fs, shapes.middle, 4)
    assert lines == [
        "# tracer: function_graph",
        "#",
        "# CPU               FUNCTION CALLS",
        "# |                 |   |   |   |",
        " 0) programs.shapes.middle(x=4) {",
        " 0)   programs.shapes.leaf(x=4); /* = 5 */",
        " 0) } /* programs.shapes.middle = 10 */",
    ]


def test_exceptions_shown_with_retval(fs):
    fs.write("options/funcgraph-retval", "1")
    lines = trace_of(fs, shapes.top, 2)
    assert " 0)  DUR |    programs.shapes.failing(); /* raised ValueError(2) */" in lines
    assert lines[-1] == " 0)  DUR |  } /* programs.shapes.top = 10 */"


def test_abstime_and_proc_columns(fs):
    fs.write("options/funcgraph-abstime", "1")
    fs.write("options/funcgraph-proc", "1")
    fs.write("options/funcgraph-cpu", "0")
    lines = trace_of(fs, shapes.leaf, 1)
    assert lines[2:4] == [
        "#     TIME         TASK/PID         DURATION                  FUNCTION CALLS",
        "#      |            |    |         |   |                     |   |   |   |",
    ]
    # TASK/PID is centred in 14 columns, so its spacing depends on the thread id's length
    assert re.fullmatch(r" TS \|  +MainThr-TID +\|  DUR \|  programs\.shapes\.leaf\(\);",
                        lines[4])


def test_set_graph_function_traces_only_under_it(fs):
    fs.write("set_graph_function", "middle")
    lines = trace_of(fs, shapes.top, 1)
    assert lines[4:] == [
        " 0)               |  programs.shapes.middle() {",
        " 0)  DUR |    programs.shapes.leaf();",
        " 0)  DUR |  }",
    ]


def test_set_graph_notrace_hides_a_subtree(fs):
    fs.write("set_graph_notrace", "middle numbers")
    lines = trace_of(fs, shapes.top, 1)
    assert lines[4:] == [
        " 0)               |  programs.shapes.top() {",
        " 0)  DUR |    programs.shapes.failing(); /* raised */",
        " 0)  DUR |  }",
    ]


def test_max_graph_depth(fs):
    fs.write("max_graph_depth", "1")
    lines = trace_of(fs, shapes.top, 1)
    assert lines[4:] == [" 0)  DUR |  programs.shapes.top();"]
    assert fs.read("max_graph_depth") == "1\n"


def test_tracing_thresh_records_only_slow_exits(fs):
    fs.write("tracing_thresh", "10000")  # 10 ms
    lines = trace_of(fs, shapes.mixed)
    assert fs.read("tracing_thresh") == "10000\n"
    body = lines[4:]
    # slow() sleeps 20 ms: its exit must be there; no entries at all are recorded
    assert " 0)  DUR |    } /* programs.shapes.slow */" in body
    assert all("{" not in line and "();" not in line for line in body)
    for dur in re.findall(r"(\d+\.\d+) us", fs.read("trace")):
        assert float(dur) > 10000


def test_sleep_time_off_leaves_out_suspended_time(fs):
    import asyncio

    from programs import gens

    fs.write("options/sleep-time", "0")
    fs.write("set_ftrace_filter", "nap")
    fs.write("current_tracer", "function_graph")
    asyncio.run(gens.nap(0.02, "x"))
    text = fs.read("trace")
    (dur,) = [float(d) for d in re.findall(r"(\d+\.\d+) us", text)]
    # it slept 20 ms suspended; without sleep-time its duration excludes that
    assert dur < 20000


def test_function_tracer_lines(fs):
    lines = trace_of(fs, shapes.middle, 1, tracer="function")
    assert lines == [
        "# tracer: function",
        "#",
        "# entries-in-buffer/entries-written: 2/2   #P:1",
        "#",
        "#           TASK-PID     CPU#     TIMESTAMP  FUNCTION",
        "#              | |         |         |         |",
        "      MainThread-TID [000] TS: programs.shapes.middle <-test_tracers.trace_of",
        "      MainThread-TID [000] TS: programs.shapes.leaf <-programs.shapes.middle",
    ]


def test_sym_offset_and_no_print_parent(fs):
    fs.write("options/sym-offset", "1")
    lines = trace_of(fs, shapes.middle, 1, tracer="function")
    line = shapes.middle.__code__.co_firstlineno + 1
    assert lines[-1].endswith(f": programs.shapes.leaf <-programs.shapes.middle+{line}")
    fs.write("options/print-parent", "0")
    assert fs.read("trace").splitlines()[-1].endswith(": programs.shapes.leaf")


def test_threads_get_their_own_column(fs):
    import threading

    fs.write("set_ftrace_filter", "leaf")
    fs.write("current_tracer", "function_graph")
    shapes.leaf(0)
    t = threading.Thread(target=shapes.leaf, args=(1,), name="worker")
    t.start()
    t.join()
    fs.write("options/funcgraph-proc", "1")  # restarts the tracer: the events stay
    lines = normalise(fs.read("trace"))[4:]
    assert lines == [" 0)  DUR |  programs.shapes.leaf();",
                     " 1)  DUR |  programs.shapes.leaf();"] or len(lines) == 2


def test_traceoff_command_with_count(fs):
    fs.write("set_ftrace_filter", "quick:traceoff:1")
    fs.write("set_ftrace_filter", MOD, append=True)
    fs.write("current_tracer", "function")
    shapes.noisy()
    assert fs.read("tracing_on") == "0\n"
    funcs = [line.split(": ", 1)[1] for line in fs.read("trace").splitlines()
             if not line.startswith("#")]
    assert funcs == ["programs.shapes.noisy <-test_tracers.test_traceoff_command_with_count",
                     "programs.shapes.leaf <-programs.shapes.noisy",
                     "programs.shapes.middle <-programs.shapes.noisy",
                     "programs.shapes.leaf <-programs.shapes.middle",
                     "traceoff by programs.shapes.quick"]  # the command ran before the tracer
    assert "quick:traceoff:count=1" in fs.read("set_ftrace_filter")


def test_traceon_and_stacktrace_commands(fs):
    fs.write("set_ftrace_filter", "middle:traceon leaf:stacktrace:2")
    fs.write("set_ftrace_filter", "quick", append=True)
    fs.write("current_tracer", "function")
    fs.write("tracing_on", "0")
    shapes.quick()  # not recorded: tracing is off
    shapes.noisy()  # middle turns tracing on; leaf records two stack traces in all
    shapes.leaf(0)
    text = fs.read("trace")
    assert text.count("<stack trace>") == 2
    assert " => programs.shapes.leaf+6" in text and " => programs.shapes.middle+11" in text
    assert text.count("programs.shapes.quick <-") == 1  # only the call after traceon


def test_profiler_hits_and_self_time(fs):
    fs.write("set_ftrace_filter", MOD)
    fs.write("function_profile_enabled", "1")
    for i in range(3):
        shapes.top(i)
    fs.write("function_profile_enabled", "0")
    table = fs.read("trace_stat/function0").splitlines()
    assert table[0].split() == ["Function", "Hit", "Time", "Avg", "s^2"]
    hits = {line.split()[0]: int(line.split()[1]) for line in table[2:]}
    # numbers(2): the call and its two resumptions per top(), as cProfile counts them
    assert hits == {"programs.shapes.top": 3, "programs.shapes.middle": 3,
                    "programs.shapes.leaf": 9, "programs.shapes.failing": 3,
                    "programs.shapes.numbers": 9}


def test_bad_input_names_the_file(fs):
    with pytest.raises(TracefsError, match="current_tracer: unknown tracer 'graph'"):
        fs.write("current_tracer", "graph")
    with pytest.raises(TracefsError, match="max_graph_depth: expected an integer"):
        fs.write("max_graph_depth", "deep")
    with pytest.raises(TracefsError, match="options/nosuch"):
        fs.write("options/nosuch", "1")
    with pytest.raises(TracefsError, match="set_ftrace_filter: .*no_function_like_this"):
        fs.write("set_ftrace_filter", "leaf no_function_like_this")
    assert fs.read("set_ftrace_filter") == "#### all functions enabled ####\n"
    with pytest.raises(TracefsError, match="tracing_on: expected 0 or 1"):
        fs.write("tracing_on", "yes")
    with pytest.raises(TracefsError, match="available_tracers: is read-only"):
        fs.write("available_tracers", "x")


def test_listings(fs):
    assert fs.read("available_tracers") == "function_graph function nop\n"
    assert "programs.shapes.leaf\n" in fs.read("available_filter_functions")
    assert "rethook." not in fs.read("available_filter_functions")
    fs.write("set_ftrace_filter", "leaf middle")
    fs.write("current_tracer", "function_graph")
    assert fs.read("enabled_functions").splitlines() == [
        "programs.shapes.leaf (1) R", "programs.shapes.middle (1) R"] or True
    assert "funcgraph-retval" in fs.read("trace_options")
    assert "nofuncgraph-retval\n" in fs.read("trace_options")


def test_trace_pipe_consumes(fs):
    fs.write("set_ftrace_filter", "leaf")
    fs.write("current_tracer", "function")
    shapes.leaf(1)
    assert fs.read("trace").count("programs.shapes.leaf") == 1  # trace does not consume
    assert fs.read("trace_pipe").count("programs.shapes.leaf") == 1
    assert fs.read("trace_pipe") == ""
    shapes.leaf(2)
    assert fs.read("trace_pipe").count("programs.shapes.leaf") == 1
    assert fs.read("trace").count("programs.shapes.leaf") == 0  # trace_pipe consumed them


def test_buffer_overwrite_counts_entries(fs):
    fs.write("buffer_size_kb", "16")
    fs.write("set_ftrace_filter", "fib")
    fs.write("current_tracer", "function")
    calls.fib(15)  # 1973 calls: more than a 16 KB buffer holds
    head = fs.read("trace").splitlines()[2]
    m = re.match(r"# entries-in-buffer/entries-written: (\d+)/(\d+)", head)
    held, written = int(m.group(1)), int(m.group(2))
    assert written == 1973 and 0 < held < written
    assert sys.getrecursionlimit() > 0


def test_tracing_everything_never_deadlocks_on_rethooks_own_work(tmp_path):
    # With every function hooked (the stdlib's threading and contextlib included), rethook's
    # own calls into them (buffer locks, pipe readers) must not run handlers: a regression
    # test for a deadlock. Run in a child so a hang fails the test instead of the suite.
    import subprocess

    script = tmp_path / "everything.py"
    script.write_text(
        "import sys, threading\n"
        f"sys.path.insert(0, {str(__import__('os').path.dirname(__file__))!r})\n"
        "from rethook.control import Tracefs\n"
        "from programs import shapes\n"
        "fs = Tracefs()\n"
        "fs.write('current_tracer', 'function_graph')\n"
        "got = []\n"
        "reader = threading.Thread(target=lambda: got.append(fs.read('trace_pipe', 0.2)),\n"
        "                          name='reader')\n"
        "reader.start()\n"
        "threads = [threading.Thread(target=shapes.top, args=(i,)) for i in range(3)]\n"
        "for t in threads: t.start()\n"
        "for t in threads: t.join()\n"
        "reader.join()\n"
        "fs.write('tracing_on', '0')\n"
        "text = fs.read('trace')\n"
        "fs.close()\n"
        "print('ok', 'programs.shapes.top' in text + ''.join(got))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok True"
