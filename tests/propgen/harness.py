"""Runs a generated program under random users and records one interleaved log.

The log (one list, in the order things happened) holds the program's own ground truth (see
:mod:`propgen.program`), every handler call of every user, and the live steps:

* ``("F", uid, cid, name)``                         an entry user's ``func``;
* ``("E", uid, cid, name, data_or_None, depth)``    a graph user's ``entryfunc`` (None: declined);
* ``("R", uid, name, data, retval, exc_id, exc_type, exc_tok, flags, frame_id, depth, t0, t1,
  sleep)``                                          a graph user's ``retfunc``;
* ``("op", what, uid, selection, by)`` ... ``("opdone", what, uid)`` around each engine call
  made by a step (``register``, ``unregister``, ``filter`` for set_filter/set_notrace,
  ``restart`` for ``sys.monitoring.restart_events()``); ``selection`` is the model's prediction
  of the user's hooked functions after the op; ``by`` is ``(uid, "entry"|"ret")`` when a
  handler performed the step, else None.

Nothing in the log holds a frame or an exception (ids and type names only), so generators and
frames die exactly when the program drops them; the cyclic GC is off while the program runs.
The engine's stderr reports (handlers that fail on purpose) are captured into the outcome.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.util
import io
import itertools
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from propgen import known
from propgen.program import Program, render
from propgen.users import Action, FilterModel, UserSpec, pattern_text
from rethook.engine.engine import FgraphOps, FtraceOps, get_engine

#: Calls a program may make before every function takes its base case.
CALL_BUDGET = 120

_tmpdir: str | None = None
_modules = itertools.count()


class Err(Exception):
    """What generated programs raise; ``tok`` is unique per raise."""

    def __init__(self, tok: int) -> None:
        super().__init__(tok)
        self.tok = tok


class E0(Err):
    pass


class E1(Err):
    pass


class Data:
    """A graph user's entry data: unique per accepted entry."""

    __slots__ = ("uid", "cid", "name", "frame_id", "depth")

    def __init__(self, uid: int, cid: Any, name: str, frame_id: int, depth: int) -> None:
        self.uid = uid
        self.cid = cid
        self.name = name
        self.frame_id = frame_id
        self.depth = depth

    def __repr__(self) -> str:
        return f"<Data u{self.uid} cid={self.cid} {self.name}>"


class FalsyData(Data):
    """Entry data that is false: accepting is ``not None and not False``, not truthiness."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0


def _frame_cid(frame: Any) -> Any:
    try:
        return frame.f_locals["cid"]
    except Exception:  # a wrong frame is reported by the checker
        return None


class User:
    """One random user: its spec, its ops object (reused across re-registrations), its model."""

    def __init__(self, uid: int, spec: UserSpec, module: str, names: list[str],
                 log: list) -> None:
        self.uid = uid
        self.runner: Any = None  # the Runner, for handler steps
        self.spec = spec
        self.model = FilterModel(module, names)
        ok = self.model.write(tuple((p, False) for p in spec.filter), append=False)
        assert ok
        self.notrace_model = FilterModel(module, names)
        self.notrace_model.write(tuple((("name", n), False) for n in spec.notrace), append=False,
                                 allow_empty=True)
        self.registered = False
        text = " ".join(pattern_text(p, module) for p in spec.filter)
        notrace = " ".join(f"{module}.{n}" for n in spec.notrace)
        if spec.kind == "graph":
            self.ops = FgraphOps(self._entry(log), self._ret(log), filter=text, notrace=notrace,
                                 name=f"u{uid}")
        else:
            self.ops = FtraceOps(self._func(log), filter=text, notrace=notrace, name=f"u{uid}")

    @property
    def notrace(self) -> frozenset[str]:
        return self.notrace_model.selection()

    def selection(self) -> frozenset[str]:
        return self.model.selection() - self.notrace

    def _entry(self, log: list):
        uid, spec = self.uid, self.spec
        data_cls = FalsyData if spec.falsy_data else Data
        decline = spec.decline_value

        def entryfunc(code, frame, depth, t):
            cid = _frame_cid(frame)
            if spec.raises_in("entry", cid):
                log.append(("E", uid, cid, code.co_name, None, depth))
                raise RuntimeError(f"u{uid}'s entry handler fails (on purpose)")
            if isinstance(cid, int) and spec.accepts(cid):
                data = data_cls(uid, cid, code.co_name, id(frame), depth)
                log.append(("E", uid, cid, code.co_name, data, depth))
            else:
                data = decline
                log.append(("E", uid, cid, code.co_name, None, depth))
            self.runner.note_entry(uid, cid, code.co_name, data is not decline)
            if spec.steps_in("entry", cid):
                self.runner.step(by=(uid, "entry"))
            return data

        return entryfunc

    def _ret(self, log: list):
        uid, spec = self.uid, self.spec

        def retfunc(code, frame, depth, data, retval, exc, t0, t1, sleep, flags):
            log.append((
                "R", uid, code.co_name, data, retval,
                None if exc is None else id(exc),
                None if exc is None else type(exc).__name__,
                getattr(exc, "tok", None), flags,
                None if frame is None else id(frame), depth, t0, t1, sleep,
            ))
            # (only on ordinary exits: not inside the deliveries of an unregister)
            cid = getattr(data, "cid", None)
            if not flags and spec.steps_in("ret", cid):
                self.runner.step(by=(uid, "ret"))
            if spec.raises_in("ret", cid):
                raise RuntimeError(f"u{uid}'s return handler fails (on purpose)")

        return retfunc

    def _func(self, log: list):
        uid = self.uid

        def func(code, frame):
            log.append(("F", uid, _frame_cid(frame), code.co_name))

        return func


@dataclass
class Outcome:
    """What one run produced, for the checker."""

    program: Program
    module: str
    users: list[User]
    log: list
    errors: list[str] = field(default_factory=list)
    top: str | None = None  # type name of the exception that left the program, if any
    stats_before: dict = field(default_factory=dict)
    stats_after: dict = field(default_factory=dict)
    running_after: bool = False
    source: str = ""
    stderr: str = ""


class Runner:
    """Performs the live steps (``_step()`` in the program) and the engine ops, logging each."""

    def __init__(self, users: list[User], actions: tuple[Action, ...], log: list,
                 errors: list[str]) -> None:
        self.users = users
        self.actions = actions
        self.next = 0
        self.calls = 0
        self.log = log
        self.errors = errors
        self.engine = get_engine()
        self.by: tuple | None = None
        self.live = True
        self.infos: list | None = None
        self.entering: tuple[Any, str, set[int]] = (None, "", set())  # cid, name, accepted by
        for u in users:
            u.runner = self

    def over(self) -> bool:
        self.calls += 1
        return self.calls > CALL_BUDGET

    def step(self, by: tuple | None = None) -> None:
        """Perform the next action; ``by`` is ``(uid, "entry"|"ret")`` from inside a handler."""
        if not self.live or self.next >= len(self.actions):
            return
        a = self.actions[self.next]
        self.next += 1
        outer, self.by = self.by, by
        try:
            self.perform(a)
        except Exception as e:  # reported by the checker, never to the program
            self.errors.append(f"step {a!r} raised {e!r}")
        finally:
            self.by = outer

    def note_entry(self, uid: int, cid: Any, name: str, accepted: bool) -> None:
        if self.entering[0] != cid:
            self.entering = (cid, name, set())
        if accepted:
            self.entering[2].add(uid)

    def may_unregister(self, u: User) -> bool:
        """False for the situations of known engine bugs (see propgen.known), while they last."""
        if self.by is None or self.by[1] != "entry":
            return True
        if u.uid != self.by[0] and u.uid in self.entering[2] \
                and known.other_entry_unregister_loses_claim():
            return False
        if [x for x in self.users if x.registered] == [u] \
                and known.last_user_entry_unregister_leaks_record():
            return False
        return True

    def may_refilter(self, u: User, selection: frozenset[str]) -> bool:
        """False for a known engine bug's situation (see propgen.known), while it lasts."""
        if self.by is None or self.by[1] != "entry":
            return True
        name = self.entering[1]
        suspends = not name.startswith("f")  # g*, b*: generators; a*: coroutines
        if not (known.entry_filter_drop_loses_generator_return() if suspends
                else known.entry_filter_drop_loses_return()):
            return True
        return any(name in (selection if x is u else x.selection()) for x in self.users
                   if x.registered and x.spec.kind == "graph")

    def perform(self, a: Action) -> None:
        u = self.users[a.uid]
        if a.kind == "toggle":
            if u.registered:
                if self.may_unregister(u):
                    self.unregister(u)
            else:
                self.register(u)
        elif a.kind == "swap":
            if u.registered:
                if not self.may_unregister(u):
                    return
                self.unregister(u)
            other = self.users[a.other]
            if not other.registered:
                self.register(other)
        elif a.kind == "filter":
            model = u.model.copy()
            if not model.write(a.patterns, a.append):
                return  # would empty the hash (= every function in the process): skip
            if not self.may_refilter(u, model.selection() - u.notrace):
                return
            text = " ".join(("!" if remove else "") + pattern_text(p, u.model.module)
                            for p, remove in a.patterns)
            u.model = model
            self.log.append(("op", "filter", u.uid, u.selection(), self.by))
            u.ops.set_filter(text, append=a.append)
            self.log.append(("opdone", "filter", u.uid))
            self.check_filter(u)
        elif a.kind == "notrace":
            model = u.notrace_model.copy()
            model.write(a.patterns, a.append, allow_empty=True)
            if not self.may_refilter(u, u.model.selection() - model.selection()):
                return
            text = " ".join(("!" if remove else "") + pattern_text(p, u.model.module)
                            for p, remove in a.patterns)
            u.notrace_model = model
            self.log.append(("op", "filter", u.uid, u.selection(), self.by))
            u.ops.set_notrace(text, append=a.append)
            self.log.append(("opdone", "filter", u.uid))
            self.check_filter(u)
        elif a.kind == "restart":
            self.log.append(("op", "restart", u.uid, None, self.by))
            sys.monitoring.restart_events()
            self.log.append(("opdone", "restart", u.uid))
        else:  # pragma: no cover
            raise ValueError(a.kind)

    def register(self, u: User) -> None:
        self.log.append(("op", "register", u.uid, u.selection(), self.by))
        if u.spec.kind == "graph":
            self.engine.register_ftrace_graph(u.ops)
        else:
            self.engine.register_ftrace_function(u.ops)
        u.registered = True
        self.log.append(("opdone", "register", u.uid))

    def unregister(self, u: User) -> None:
        self.log.append(("op", "unregister", u.uid, None, self.by))
        u.registered = False
        if u.spec.kind == "graph":
            self.engine.unregister_ftrace_graph(u.ops)
        else:
            self.engine.unregister_ftrace_function(u.ops)
        self.log.append(("opdone", "unregister", u.uid))

    def check_filter(self, u: User) -> None:
        """The filter model and the engine's filter agree (else the test itself is wrong)."""
        if self.infos is None:
            self.infos = [i for i in self.engine.registry.functions()
                          if i.module == u.model.module]
        got = {i.qualname for i in self.infos if u.ops.filter.matches(i)}
        if got != set(u.selection()):
            self.errors.append(f"filter model disagrees for u{u.uid}: model "
                               f"{sorted(u.selection())}, engine {sorted(got)}")


def _kept_helper(keep: list, log: list, nc: Any):
    """``_kept(action)`` of the generated programs (see propgen.program.Kept)."""

    def kept(action: str) -> None:
        if not keep:
            return
        cid, g = keep[-1]
        bare = g.gi_code.co_name.startswith("b")
        if action == "next":
            try:
                next(g)
            except StopIteration:
                keep.pop()
            return
        keep.pop()
        if action == "close":
            if bare:
                log.append(("bclose", cid))
            g.close()
        elif action == "throw":
            tok = nc()
            if bare:
                log.append(("bthrow", cid, tok))
            try:
                g.throw(E0(tok))
            except StopIteration:
                pass
        elif bare:  # drop: the last reference goes with this frame
            log.append(("bdrop", cid))

    return kept


async def _quiet(coro: Any) -> Any:
    """Run ``coro`` on a loop that keeps "exception never retrieved" reports to itself (tasks
    orphaned by a failed gather are part of the programs)."""
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
    return await coro


def _module_dir() -> str:
    global _tmpdir
    if _tmpdir is None:
        _tmpdir = tempfile.mkdtemp(prefix="rethook_propgen_")
        sys.path.insert(0, _tmpdir)
    return _tmpdir


_loaded: dict[str, Any] = {}  # source -> module: a program seen again (shrinking) is reused


def load(program: Program) -> tuple[Any, str, str]:
    """Write the program as a module in a temp dir and import it for real. A program seen
    again (hypothesis replays and shrinks) reuses its module, unless the module's last run
    left a call that can still run (then a new module: a new one per run makes each example
    slower, as filters are checked against every function imported so far)."""
    source = render(program)
    mod = _loaded.get(source)
    if mod is None or _calls_left_open(mod._LOG, program):
        name, _ = _write(source)
        mod = _loaded[source] = importlib.import_module(name)
    return mod, mod.__name__, source


def _calls_left_open(log: list, program: Program) -> bool:
    """Whether a call logged in ``log`` (a run's) has no exit yet, so its frame is alive.

    The generated code reaches ``_LOG``, ``_nc``, ``_step`` through its module's globals, which
    :func:`bind` points at the current run. A generator suspended by an earlier run, alive
    because the GC has not collected it yet (it is off while programs run), runs its except
    and finally blocks when finalised: during a later run of the same module it would log its
    exit (and make calls and steps) in that run, "exit of call N that is not open". Every
    started func, gen or coro logs its exit; a bare generator runs no code when closed."""
    bare = {f.name for f in program.funcs if f.kind == "bare"}
    open_calls = set()
    for ev in log or ():
        if ev[0] == "call" and ev[1] not in bare:
            open_calls.add(ev[2])
        elif ev[0] in ("ret", "raise"):
            open_calls.discard(ev[2])
    return bool(open_calls)


def _write(source: str) -> tuple[str, str]:
    name = f"rh_prop_{os.getpid()}_{next(_modules)}"
    path = os.path.join(_module_dir(), name + ".py")
    with open(path, "w") as f:
        f.write(source)
    importlib.invalidate_caches()
    return name, path


def load_past_import_hook(name: str, path: str) -> Any:
    """Load a written program the way plugin loaders do, past every import hook
    (``spec_from_file_location(...).loader.exec_module``): the engine meets its code only
    when it runs (discovery)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def bind(mod: Any, runner: Runner, log: list, keep: list, tasks: list) -> Any:
    """Give a loaded program the helpers it calls; returns its call-id counter."""
    cids = itertools.count(1)
    mod._LOG = log
    mod._nc = cids.__next__
    mod._step = runner.step
    mod._over = runner.over
    mod._KEEP = keep
    mod._kept = _kept_helper(keep, log, cids.__next__)
    mod._E0 = E0
    mod._E1 = E1
    mod._sleep0 = lambda: asyncio.sleep(0)
    mod._gather = asyncio.gather
    mod._spawn = lambda coro: tasks.append(asyncio.ensure_future(coro))
    return cids


def run_entry(mod: Any, program: Program, cids: Any) -> str | None:
    """Call the program's entry point (on an event loop if it is async); the name of the
    exception it ended with, its own business, or None."""
    entry = getattr(mod, program.entry)
    try:
        if program.is_async:
            asyncio.run(_quiet(entry(cids.__next__(), program.depth)))
        else:
            entry(cids.__next__(), program.depth)
    except Exception as e:  # the program's own exception
        return type(e).__name__
    return None


def run(program: Program, specs: list[UserSpec], actions: tuple[Action, ...],
        late: bool = False) -> Outcome:
    """Import the program, register the initial users, run it with the live steps, tear down.
    ``late``: load the program only once the initial users are registered, past the import
    hook (:func:`load_past_import_hook`).

    Every user is unregistered in a ``finally`` (so a failing example leaves a clean engine)."""
    eng = get_engine()
    known.probe_all()  # now, not from inside a handler
    if late:
        mod = None
        source = render(program)
        name, path = _write(source)
    else:
        mod, name, source = load(program)
    log: list = []
    errors: list[str] = []
    keep: list = []
    tasks: list = []
    users = [User(i, s, name, program.names(), log) for i, s in enumerate(specs)]
    runner = Runner(users, actions, log, errors)
    out = Outcome(program, name, users, log, errors, source=source)
    if eng.running:
        errors.append(f"engine running before the example: {eng.users}")
    ts = eng.core.current_thread_state()
    if ts is not None and ts.stack or eng.core.parked():
        # An earlier run (which failed for it) left records: report, and don't let them
        # disturb this run too.
        errors.append(f"records left by an earlier run: stack {ts and ts.stack}, parked "
                      f"{dict(eng.core.parked())}")
        if ts is not None:
            ts.stack.clear()
        eng.core.parked().clear()
    if mod is not None:
        cids = bind(mod, runner, log, keep, tasks)
    out.stats_before = eng.stats()
    gc_was = gc.isenabled()
    gc.disable()
    # A generator finalised with an exception (a finally that raises during close) is the
    # program's business: keep "Exception ignored in" reports out of the output.
    unraisable, sys.unraisablehook = sys.unraisablehook, lambda hook_args: None
    # The engine reports failing handlers (some users fail on purpose) on stderr: keep it.
    stderr, sys.stderr = sys.stderr, io.StringIO()
    try:
        try:
            for u in users:
                if u.spec.registered:
                    runner.register(u)
            if mod is None:
                mod = load_past_import_hook(name, path)
                cids = bind(mod, runner, log, keep, tasks)

            out.top = run_entry(mod, program, cids)
            log.append(("end",))
            runner.live = False  # the teardown below is the harness', not the program's
            runner.by = None
            for u in users:
                if u.registered:
                    runner.unregister(u)
        finally:
            for u in users:  # after a failure above: leave nothing registered
                if u.registered:
                    u.registered = False
                    try:
                        if u.spec.kind == "graph":
                            eng.unregister_ftrace_graph(u.ops)
                        else:
                            eng.unregister_ftrace_function(u.ops)
                    except Exception as e:
                        errors.append(f"emergency unregister of u{u.uid}: {e!r}")
            if eng.running:
                errors.append("engine still running after every user left")
                eng.stop()
    finally:
        out.log = list(log)  # later finalisers (kept generators) may still append
        out.running_after = eng.running
        out.stats_after = eng.stats()
        keep.clear()
        tasks.clear()
        sys.unraisablehook = unraisable
        out.stderr, sys.stderr = sys.stderr.getvalue(), stderr
        # The module stays in sys.modules: the registry notices imports made while no engine
        # runs by the number of modules, which a removal would cancel out.
        if gc_was:
            gc.enable()  # (cyclic garbage of the run goes at the next collection, when no
            # engine runs: no gc.collect() here, its cost grows with the session's heap)
    return out
