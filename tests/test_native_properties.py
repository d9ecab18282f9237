"""Property: the native function_graph user writes the trace the Python user writes.

Random programs from the engine's property tests (tests/propgen: recursion, exceptions caught
at random levels, generators kept suspended and then resumed, closed, thrown into or dropped,
coroutines, gathers) run under ``function_graph`` twice in one process: with the native user
(plain functions get direct entries, generators and coroutines get records, both on one
shadow stack) and with the Python user. The traces must be the same line for line once
timestamps and durations are normalised, and the program must run the same under both.
"""

import gc
import sys

import pytest
from hypothesis import HealthCheck, given, settings

from propgen import programs
from propgen.harness import Runner, bind, load, run_entry
from rethook.control import Tracefs
from rethook.tracers import native
from rethook.tracers.function_graph import GraphOps, NativeGraphOps
from test_tracers import normalise

pytestmark = pytest.mark.skipif(native._native is None, reason="the native users are not built")

_SETTINGS = settings(max_examples=80, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.function_scoped_fixture])


def traced_run(program, native_users: bool, graph_function: str = ""):
    """Run the program under function_graph; its trace, the user's type and its own log."""
    mod, name, _ = load(program)
    log: list = []
    errors: list[str] = []
    keep: list = []
    tasks: list = []
    runner = Runner([], (), log, errors)  # no live steps: only the program runs
    cids = bind(mod, runner, log, keep, tasks)
    fs = Tracefs()
    gc_was = gc.isenabled()
    gc.disable()  # generators dropped while suspended go at the same point in both runs
    # a generator finalised with an exception is the program's business, as in the harness
    unraisable, sys.unraisablehook = sys.unraisablehook, lambda hook_args: None
    try:
        fs.ctx.native_users = native_users
        fs.write("buffer_size_kb", "8192")
        fs.write("set_ftrace_filter", f"*:mod:{name}")
        if graph_function:
            fs.write("set_graph_function", f"{name}.{graph_function}")
        fs.write("current_tracer", "function_graph")
        user = type(fs.tracer.ops)
        top = run_entry(mod, program, cids)
        keep.clear()  # kept generators are dropped here, while tracing is on
        tasks.clear()
        fs.write("tracing_on", "0")
        # (object ids in the program's log differ from run to run)
        log = [tuple("ID" if isinstance(x, int) and x > 2**32 else x for x in ev) for ev in log]
        trace = [line.replace(f"{name}.", "MODULE.") for line in normalise(fs.read("trace"))]
        return trace, user, (log, top, errors)
    finally:
        fs.close()
        sys.unraisablehook = unraisable
        if gc_was:
            gc.enable()


def check_same(program, graph_function: str = "") -> None:
    """(The two runs may import the program as two modules: see propgen.harness.load.)"""
    got, got_user, got_run = traced_run(program, True, graph_function)
    want, want_user, want_run = traced_run(program, False, graph_function)
    assert got_user is NativeGraphOps and want_user is GraphOps
    assert got_run == want_run  # the program ran the same way
    assert got == want


@pytest.fixture
def c_core(engine):
    if not engine.core.capabilities.native_users:
        pytest.skip(f"the {engine.core.name} core runs no native users")
    return engine


@_SETTINGS
@given(program=programs())
def test_sync_programs_native_equals_python(c_core, program):
    check_same(program)


@settings(_SETTINGS, max_examples=40)
@given(program=programs(is_async=True))
def test_async_programs_native_equals_python(c_core, program):
    check_same(program)


@settings(_SETTINGS, max_examples=40)
@given(program=programs())
def test_graph_function_native_equals_python(c_core, program):
    """set_graph_function on the entry point's callee: direct entries declined outside it."""
    names = program.names()
    check_same(program, graph_function=names[min(1, len(names) - 1)])
