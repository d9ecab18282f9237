"""Discovery: every code object that runs reaches the registry and can be hooked.

Engine-level tests (both cores: tests/test_ccore.py reruns this module on the other one) of
code the import hook never sees -- ``exec``'d functions, dataclass and namedtuple methods,
modules loaded with ``exec_module`` -- and of how discovery's ``sys.monitoring.DISABLE``
lives with filter changes, other tools' ``restart_events()`` and the engine's stop. The same
programs run as users run them, through the command line, are in tests/test_cli_discovery.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import sys
import textwrap
import time

from programs import calls
from recorder import Recorder
from rethook.control import Tracefs
from test_cli import PROGRAMS

_names = itertools.count()


def fresh_name() -> str:
    return f"rh_disc_{next(_names)}"


def exec_module(name: str, source: str, tmp_path) -> object:
    """Load ``source`` as module ``name`` past every import hook, as plugin loaders do."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def is_hooked(engine, code) -> bool:
    return any(info.code is code for info, _, _ in engine.enabled_functions())


def test_exec_code_is_hooked_from_its_first_call(engine):
    name = fresh_name()
    rec = Recorder(f"*:mod:{name}")
    engine.register_ftrace_graph(rec)
    try:
        ns = {"__name__": name}
        exec("def dx_scale(v, k):\n    return v * k\n", ns)
        assert [ns["dx_scale"](i, 2) for i in range(5)] == [0, 2, 4, 6, 8]
    finally:
        engine.unregister_ftrace_graph(rec)
    assert rec.names() == ["dx_scale"] * 5  # the very first call included
    rec.assert_exactly_once()
    assert [r[2] for r in rec.returns] == [0, 2, 4, 6, 8]
    assert engine.registry.lookup(ns["dx_scale"].__code__).name == f"{name}.dx_scale"


def test_exec_code_without_a_module_is_named_where_it_was_made(engine):
    rec = Recorder("*:mod:test_discovery")
    engine.register_ftrace_graph(rec)
    try:
        ns: dict = {}  # no __name__: the module that ran exec() names it
        exec("def dx_orphan():\n    return 7\n", ns)
        assert ns["dx_orphan"]() == 7
    finally:
        engine.unregister_ftrace_graph(rec)
    assert engine.registry.lookup(ns["dx_orphan"].__code__).name == "test_discovery.dx_orphan"
    assert rec.names() == ["dx_orphan"]


def test_generated_code_of_a_module_loaded_past_the_import_hook(engine, tmp_path, capsys):
    """tests/cli_programs/generated.py loaded with exec_module: its body is found as it starts,
    dataclass and namedtuple methods (met only when they run) are named after the class found
    from their first argument, exec'd functions after their namespace or where they were
    made."""
    name = fresh_name()
    rec = Recorder(f"*:mod:{name}")
    engine.register_ftrace_graph(rec)
    try:
        mod = exec_module(name, (PROGRAMS / "generated.py").read_text(), tmp_path)
    finally:
        engine.unregister_ftrace_graph(rec)
    assert capsys.readouterr().out == "3865 40\n"
    rec.assert_exactly_once()
    names = {engine.registry.lookup(c).base_name for c in (
        mod.Point.__init__.__code__, mod.Point.__eq__.__code__, mod.Point.__hash__.__code__,
        mod.Point.__repr__.__wrapped__.__code__, mod.Pair.__new__.__code__,
        mod.Point.norm.__code__, mod.main.__code__, mod.NS["scale"].__code__,
        mod.shift.__code__)}
    assert names == {f"{name}.{q}" for q in (
        "Point.__init__", "Point.__eq__", "Point.__hash__", "Point.__repr__", "Pair.__new__",
        "Point.norm", "main", "scale", "shift")}
    calls = rec.names()
    for fn, n in (("__init__", 80), ("__repr__", 40), ("__eq__", 40), ("__hash__", 40),
                  ("<lambda>", 40), ("norm", 40), ("scale", 40), ("shift", 40), ("main", 1)):
        assert calls.count(fn) == n, (fn, calls)


def test_a_filter_change_hooks_code_that_discovery_had_disabled(engine, tmp_path):
    name = fresh_name()
    mod = exec_module(name, """
        def dx_used(i):
            return i + 1

        def dx_other(i):
            return i - 1
    """, tmp_path)
    rec = Recorder(f"{name}.dx_used")
    engine.register_ftrace_graph(rec)
    try:
        for i in range(3):
            mod.dx_used(i)
            mod.dx_other(i)  # seen by discovery, nobody wants it: disabled
        assert id(mod.dx_other.__code__) in engine.core.disabled()
        rec.set_filter(f"{name}.dx_other", append=True)
        assert is_hooked(engine, mod.dx_other.__code__)
        assert id(mod.dx_other.__code__) not in engine.core.disabled()  # restart_events() ran
        for i in range(3):
            mod.dx_other(i)
    finally:
        engine.unregister_ftrace_graph(rec)
    assert rec.names() == ["dx_used"] * 3 + ["dx_other"] * 3
    rec.assert_exactly_once()


def test_another_tool_restarting_events(engine, tmp_path):
    """restart_events() re-arms discovery's disabled locations: unwatched code is seen once
    more and disabled again; hooked code keeps exactly one return per entry."""
    name = fresh_name()
    mod = exec_module(name, """
        def dx_hooked(i):
            return dx_unwatched(i) + 1

        def dx_unwatched(i):
            return i
    """, tmp_path)
    rec = Recorder(f"{name}.dx_hooked")
    engine.register_ftrace_graph(rec)
    key = id(mod.dx_unwatched.__code__)
    try:
        mod.dx_hooked(0)
        assert key in engine.core.disabled()
        for i in range(3):
            engine.core.disabled().discard(key)
            sys.monitoring.restart_events()  # another tool's
            mod.dx_hooked(i)
            assert key in engine.core.disabled()  # seen again, disabled again
    finally:
        engine.unregister_ftrace_graph(rec)
    assert rec.names() == ["dx_hooked"] * 4
    rec.assert_exactly_once()


def test_stop_leaves_no_disabled_location_behind(engine, tmp_path):
    """The next tool to take rethook's tool id sees every code object again."""
    mod = exec_module(fresh_name(), "def dx_seen():\n    return 1\n", tmp_path)
    rec = Recorder("fib")
    engine.register_ftrace_graph(rec)
    tool = engine.tool_id
    mod.dx_seen()
    assert id(mod.dx_seen.__code__) in engine.core.disabled()
    engine.unregister_ftrace_graph(rec)  # the last user: the engine stops
    assert not engine.running and not engine.core.disabled()
    ev = sys.monitoring.events
    started = []
    sys.monitoring.use_tool_id(tool, "next-tool")
    try:
        sys.monitoring.register_callback(tool, ev.PY_START, lambda code, off: started.append(code))
        sys.monitoring.set_events(tool, ev.PY_START)
        mod.dx_seen()
        sys.monitoring.set_events(tool, 0)
    finally:
        sys.monitoring.register_callback(tool, ev.PY_START, None)
        sys.monitoring.free_tool_id(tool)
    assert mod.dx_seen.__code__ in started


def test_code_first_run_inside_a_handler_is_discovered_when_the_program_runs_it(engine):
    name = fresh_name()
    ns = {"__name__": name}
    exec("def dx_helper(x):\n    return x * 3\n", ns)
    dx_helper = ns["dx_helper"]

    class Calls(Recorder):
        def entryfunc(self, code, frame, depth, t):
            if code.co_name == "fib":
                dx_helper(1)  # first run ever, in a handler: not discovered there
            return super().entryfunc(code, frame, depth, t)

    rec = Calls(f"*:mod:{name} fib")
    engine.register_ftrace_graph(rec)
    try:
        # (the count is this thread's since the process started: earlier tests' stay in it)
        recursion = engine.stats()["recursion"]
        calls.fib(1)
        assert engine.registry.lookup(dx_helper.__code__) is None
        assert engine.stats()["recursion"] == recursion  # an unhooked call in a handler
        dx_helper(2)
    finally:
        engine.unregister_ftrace_graph(rec)
    assert rec.names() == ["fib", "dx_helper"]
    rec.assert_exactly_once()


def test_rethooks_own_code_met_in_its_own_work_is_disabled(engine):
    """rethook's own code (never hooked) met while rethook works outside the callbacks (a
    notrace section: the registry's import hook, the drain) gets DISABLE at once, as code
    nobody wants, not a callback at every later call; the program's code met there does not
    (it is discovered when the program runs it). Code a handler runs makes no events at all
    (CPython's monitoring is off inside a callback)."""
    from rethook.engine import core

    own = {"__name__": f"rethook.{fresh_name()}"}  # a module of rethook's own, by name
    other = {"__name__": fresh_name()}
    rec = Recorder(f"*:mod:{fresh_name()} fib *:mod:{other['__name__']}")  # (discovery on)
    engine.register_ftrace_graph(rec)
    # (the functions made after the filter: a filter naming their module registers them)
    exec("def own_helper(x):\n    return x + 1\n", own)
    exec("def other_helper(x):\n    return x + 2\n", other)
    own_helper, other_helper = own["own_helper"], other["other_helper"]
    try:
        with core.notrace():
            own_helper(1)
            other_helper(1)
        assert id(own_helper.__code__) in core._disabled
        assert id(other_helper.__code__) not in core._disabled
        assert engine.registry.lookup(other_helper.__code__) is None
        other_helper(2)  # the program's call: discovered, hooked, recorded
        own_helper(2)  # rethook's: never
    finally:
        engine.unregister_ftrace_graph(rec)
    assert rec.names() == ["other_helper"]
    assert core.is_own_module(own["__name__"]) and not core.is_own_module(other["__name__"])


def test_rethooks_own_code_met_running_is_disabled_unregistered(engine):
    """rethook's own code met outside its own work (its runner's and drain's functions, which
    run on the program's threads with tracing on) gets DISABLE at once too, by its module's
    name, without the registry registering it first (~65 us a function, a dozen a run)."""
    from rethook.engine import core

    own = {"__name__": f"rethook.{fresh_name()}"}  # a module of rethook's own, by name
    exec("def own_runner(x):\n    return x + 1\n", own)
    own_runner = own["own_runner"]
    rec = Recorder("*")  # (every function: discovery on, first calls armed)
    engine.register_ftrace_graph(rec)
    try:
        assert own_runner(1) == 2 and own_runner(2) == 3
        assert id(own_runner.__code__) in core._disabled
        assert engine.registry.lookup(own_runner.__code__) is None
        assert not _armed(engine, own_runner.__code__)
    finally:
        engine.unregister_ftrace_graph(rec)
    assert not any("own_runner" in n for n in rec.names())


def test_walked_bodies_run_without_the_discovery_hook(engine, tmp_path, monkeypatch):
    """A module and class bodies the import hook walked (their nested code registered) are
    answered by the core on their first run: no call of the discovery hook (sqlglot runs
    ~1,200 class bodies as it is imported); their methods are hooked and recorded."""
    name = fresh_name()
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        class A:
            def f(self):
                return 1

        class B(A):
            class Inner:
                pass

            def g(self):
                return self.f() + 1
    """))
    asked = []
    discover = engine.registry.discover
    monkeypatch.setattr(engine.registry, "discover",
                        lambda code, frame: asked.append(code.co_name) or discover(code, frame))
    monkeypatch.syspath_prepend(str(tmp_path))
    rec = Recorder(f"*:mod:{name}")  # (discovery on: set with the patched hook)
    engine.register_ftrace_graph(rec)
    try:
        mod = importlib.import_module(name)
        assert mod.B().g() == 2
    finally:
        engine.unregister_ftrace_graph(rec)
        sys.modules.pop(name, None)
    assert not {"<module>", "A", "B", "Inner"} & set(asked)
    assert sorted(rec.names()) == ["f", "g"]


def test_available_filter_functions_lists_generated_code(engine):
    name = fresh_name()
    fs = Tracefs()
    try:
        fs.write("set_ftrace_filter", f"*:mod:{name}")
        fs.write("current_tracer", "function")
        ns = {"__name__": name}
        exec("def dx_made():\n    return 1\n", ns)
        assert f"{name}.dx_made" not in fs.read("available_filter_functions").split()
        ns["dx_made"]()
        assert f"{name}.dx_made" in fs.read("available_filter_functions").split()
        fs.write("tracing_on", "0")
        assert f"{name}.dx_made" in fs.read("trace")
    finally:
        fs.close()


def test_discovery_races_with_hooking(engine, threads=2):
    """Threads call fresh exec'd functions while another thread changes the filter over and
    over: every call of a function while it is hooked gets exactly one return, and code
    hooked after discovery disabled it is hooked for real (its later calls are seen)."""
    import threading

    name = fresh_name()
    ns = {"__name__": name}
    exec("\n".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(10)), ns)
    funcs = [ns[f"f{i}"] for i in range(10)]
    rec = Recorder("fib")
    engine.register_ftrace_graph(rec)
    for f in funcs:
        f(0)  # discovered now, and disabled
    stop = threading.Event()

    def run():
        while not stop.is_set():
            for f in funcs:
                f(1)
            time.sleep(0)  # let the main thread in

    workers = [threading.Thread(target=run) for _ in range(threads)]
    try:
        for t in workers:
            t.start()
        for i in range(10):
            rec.set_filter(f"{name}.f{i}", append=True)
        stop.set()
        for t in workers:
            t.join()
        before = len(rec.entries)
        for f in funcs:
            f(1)
    finally:
        stop.set()
        engine.unregister_ftrace_graph(rec)
    rec.assert_exactly_once()
    assert len(rec.entries) == before + 10  # every function is hooked now



def test_first_call_at_the_recursion_limit(engine):
    """Discovery needs a few frames: met first at the program's recursion limit, the code
    runs untouched (no internal error) and, if it could not be registered there, is on a
    later call."""
    name = fresh_name()
    ns = {"__name__": name}
    exec("def dx_deep():\n    return 1\n", ns)
    rec = Recorder(f"*:mod:{name}")
    engine.register_ftrace_graph(rec)
    errors = engine.stats()["internal_errors"]

    def probe():
        try:
            return probe()
        except RecursionError:  # as deep as calls go: the first call of dx_deep() is here
            return ns["dx_deep"]()

    try:
        assert probe() == 1
        assert ns["dx_deep"]() == 1
    finally:
        engine.unregister_ftrace_graph(rec)
    assert engine.stats()["internal_errors"] == errors
    assert rec.names() in (["dx_deep"], ["dx_deep", "dx_deep"])
    rec.assert_exactly_once()


def _armed(engine, code) -> bool:
    """Whether rethook's local events are set on ``code`` (what hooking it does)."""
    return sys.monitoring.get_local_events(engine.tool_id, code) != 0


@contextlib.contextmanager
def _recorded_module(engine, tmp_path, monkeypatch, source: str, filt: str = "*:mod:{name}"):
    """A fresh module of ``source``, imported through the import hook while a Recorder of
    ``filt`` (default: ``*:mod:`` the module) runs: yields (module, recorder); the recorder
    leaves at the end."""
    name = fresh_name()
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    rec = Recorder(filt.format(name=name))
    engine.register_ftrace_graph(rec)
    try:
        yield importlib.import_module(name), rec
    finally:
        engine.unregister_ftrace_graph(rec)
        sys.modules.pop(name, None)


#: A module's source: a function calling another, and one nobody calls.
OUTER_INNER_UNUSED = """
        def dx_outer(n):
            return [dx_inner(i) for i in range(n)]

        def dx_inner(i):
            return i * 2

        def dx_unused():
            return 0
"""


def test_a_modules_functions_are_hooked_at_their_first_call(engine, tmp_path, monkeypatch):
    """The functions a filter selects as their module loads are hooked when each is first
    called (most never are): the first call recorded like every other, the ones never
    called listed as enabled but costing nothing (no local events set)."""
    with _recorded_module(engine, tmp_path, monkeypatch, OUTER_INNER_UNUSED + """
        class K:
            def dx_method(self):
                return dx_inner(5)
    """) as (mod, rec):
        selected = {i.code.co_name for i, _, _ in engine.enabled_functions()
                    if i.module == mod.__name__}
        assert {"dx_outer", "dx_inner", "dx_unused", "dx_method"} <= selected
        assert not any(_armed(engine, f.__code__) for f in (mod.dx_outer, mod.dx_unused))
        assert mod.dx_outer(3) == [0, 2, 4]
        assert mod.K().dx_method() == 10
        assert _armed(engine, mod.dx_outer.__code__) and _armed(engine, mod.dx_inner.__code__)
        assert not _armed(engine, mod.dx_unused.__code__)
        assert mod.dx_unused() == 0  # (its first call, after the others': hooked now)
    calls = [n for n in rec.names() if n.startswith("dx_")]
    assert calls == ["dx_outer"] + ["dx_inner"] * 3 + ["dx_method", "dx_inner", "dx_unused"]
    rec.assert_exactly_once()


def test_a_filter_of_every_function_selects_them_by_their_registration(
        engine, tmp_path, monkeypatch):
    """A user whose filter takes every function (``*``) selects what the registry registers
    as it is registered, with no id of it copied anywhere by the engine: each is hooked at
    its first call like the functions of a module-wide filter, those never called cost
    nothing, and rethook's own functions, registered when they first run, are disabled
    there, not hooked."""
    from rethook.engine import registry as registry_module

    with _recorded_module(engine, tmp_path, monkeypatch, OUTER_INNER_UNUSED,
                          filt="*") as (mod, rec):
        assert engine._unarmed == {}  # (nothing selected a function at a time)
        selected = {i.code.co_name for i, _, _ in engine.enabled_functions()
                    if i.module == mod.__name__}
        assert {"dx_outer", "dx_inner", "dx_unused"} <= selected
        assert engine.stats()["hooked_functions"] >= 3
        assert mod.dx_outer(2) == [0, 2]
        assert _armed(engine, mod.dx_outer.__code__) and _armed(engine, mod.dx_inner.__code__)
        assert not _armed(engine, mod.dx_unused.__code__)
        own = registry_module._file_stamp  # (rethook's: never hooked)
        assert own(str(tmp_path)) is not None
        assert not _armed(engine, own.__code__)
    calls = [n for n in rec.names() if n.startswith("dx_")]
    assert calls == ["dx_outer", "dx_inner", "dx_inner"]
    assert not any("_file_stamp" in n for n in rec.names())
    rec.assert_exactly_once()


def test_the_c_core_arms_every_functions_first_calls_itself(engine, tmp_path, monkeypatch):
    """Under ``*`` alone the C core hooks a first call itself, as Engine._arm would (the
    engine hands it the users' shared dispatch: _arm_in_core); the pure core asks _arm.
    The same calls are recorded either way, a generator's too."""
    asked = []
    real = type(engine)._arm
    monkeypatch.setattr(type(engine), "_arm", lambda self, code: asked.append(code.co_name)
                        or real(self, code))
    c_core = hasattr(engine.core, "set_fast_arm")
    with _recorded_module(engine, tmp_path, monkeypatch, OUTER_INNER_UNUSED + """
        def dx_gen(n):
            yield from range(n)
    """, filt="*") as (mod, rec):
        assert mod.dx_outer(2) == [0, 2] and list(mod.dx_gen(2)) == [0, 1]
        assert _armed(engine, mod.dx_outer.__code__) and _armed(engine, mod.dx_gen.__code__)
        mine = [n for n in asked if n.startswith("dx_")]
        assert mine == ([] if c_core else ["dx_outer", "dx_inner", "dx_gen"])
        assert not _armed(engine, mod.dx_unused.__code__)
    calls = [n for n in rec.names() if n.startswith("dx_")]
    assert calls == ["dx_outer", "dx_inner", "dx_inner", "dx_gen"]
    rec.assert_exactly_once()


def test_a_forked_childs_threads_arm_their_first_calls(engine, tmp_path, monkeypatch):
    """In a fork's child the engine's lock is a new one (forklocks.py): a first call in a
    thread the child starts is hooked there as in the parent, whichever core arms it."""
    import os
    import threading
    import warnings

    with _recorded_module(engine, tmp_path, monkeypatch, OUTER_INNER_UNUSED,
                          filt="*") as (mod, rec):
        assert mod.dx_outer(1) == [0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
            pid = os.fork()
        if pid == 0:
            done = []
            t = threading.Thread(target=lambda: done.append(mod.dx_unused()))
            t.start()
            t.join()
            os._exit(0 if done == [0] and _armed(engine, mod.dx_unused.__code__) else 1)
        assert os.waitpid(pid, 0)[1] == 0
        assert not _armed(engine, mod.dx_unused.__code__)  # (the parent never called it)
    rec.assert_exactly_once()


def test_every_function_and_a_module_filter_together(engine, tmp_path, monkeypatch):
    """An implicit selection (``*``) and an explicit one (a module's ``*:mod:``) side by
    side: each function is hooked once, at its first call, for the users that select it."""
    with _recorded_module(engine, tmp_path, monkeypatch, """
        def dx_a():
            return dx_b() + 1

        def dx_b():
            return 2
    """, filt="*") as (mod, every):
        only = Recorder(f"dx_b:mod:{mod.__name__}")
        engine.register_ftrace_graph(only)
        try:
            assert mod.dx_a() == 3 and mod.dx_a() == 3
        finally:
            engine.unregister_ftrace_graph(only)
    assert [n for n in every.names() if n.startswith("dx_")] == ["dx_a", "dx_b"] * 2
    assert only.names() == ["dx_b"] * 2
    every.assert_exactly_once()
    only.assert_exactly_once()


def test_a_function_first_run_in_rethooks_work_is_hooked_when_the_program_calls_it(
        engine, tmp_path, monkeypatch):
    """A selected function not hooked yet, first run inside rethook's own work (a notrace
    section), is neither recorded nor disabled there: the program's first call hooks it."""
    from rethook.engine import core

    with _recorded_module(engine, tmp_path, monkeypatch, """
        def dx_late(x):
            return x + 1
    """) as (mod, rec):
        with core.notrace():
            assert mod.dx_late(1) == 2
        assert id(mod.dx_late.__code__) not in engine.core.disabled()
        assert not _armed(engine, mod.dx_late.__code__)
        assert [mod.dx_late(i) for i in range(3)] == [1, 2, 3]
    assert rec.names() == ["dx_late"] * 3
    rec.assert_exactly_once()


def test_a_filter_change_hooks_the_functions_left_for_their_first_call(
        engine, tmp_path, monkeypatch):
    """Writing a filter rebuilds every hooked function's dispatch: the ones left for their
    first call are hooked then, with the rest."""
    with _recorded_module(engine, tmp_path, monkeypatch, """
        def dx_a():
            return 1

        def dx_b():
            return 2
    """) as (mod, rec):
        assert not _armed(engine, mod.dx_a.__code__)
        rec.set_filter(f"*:mod:{mod.__name__} fib")
        assert _armed(engine, mod.dx_a.__code__) and _armed(engine, mod.dx_b.__code__)
        assert mod.dx_a() + mod.dx_b() == 3
    assert rec.names() == ["dx_a", "dx_b"]
    rec.assert_exactly_once()
