"""Tests for ftrace-style filters: syntax, hash semantics, commands, errors and speed."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rethook.engine.filters import (
    FilterCommand,
    FilterError,
    FunctionFilter,
    Pattern,
    compile_glob,
    parse_filter_text,
)
from rethook.engine.registry import FunctionInfo, Registry

FIXTURES = Path(__file__).parent / "fixtures"

SAMPLE = '''\
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def fib_memo(n):
    return fib(n)

def helper():
    return 0

class Session:
    def send(self):
        return 1

    def get(self):
        return 2

    def _private(self):
        return 3

class Other:
    def send(self):
        return 4

def outer():
    def inner():
        return 5
    return inner

key = lambda x: x

def gen():
    yield 1
'''

EXTRA = '''\
def fib():
    return 0

def send():
    return 1
'''


@pytest.fixture(scope="module")
def reg() -> Registry:
    r = Registry()
    r.add_code(compile(SAMPLE, "/virtual/flt/sample.py", "exec"), "flt.sample")
    r.add_code(compile(EXTRA, "/virtual/flt/extra.py", "exec"), "flt.extra")
    return r


@pytest.fixture(autouse=True)
def fixtures_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def ours(reg: Registry, f: FunctionFilter) -> set[str]:
    """What ``f`` selects among the sample modules."""
    return {i.name for i in reg.functions() if i.module.startswith("flt.") and f.matches(i)}


ALL = {
    "flt.sample.fib", "flt.sample.fib_memo", "flt.sample.helper", "flt.sample.Session.send",
    "flt.sample.Session.get", "flt.sample.Session._private", "flt.sample.Other.send",
    "flt.sample.outer", "flt.sample.outer.<locals>.inner", "flt.sample.<lambda>@29",
    "flt.sample.gen", "flt.extra.fib", "flt.extra.send",
}


def test_sample_names(reg: Registry) -> None:
    assert {i.name for i in reg.functions() if i.module.startswith("flt.")} == ALL


# --- pattern forms ------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "expected"), [
    # exact: full name or qualname
    ("fib", {"flt.sample.fib", "flt.extra.fib"}),
    ("flt.sample.fib", {"flt.sample.fib"}),
    ("Session.send", {"flt.sample.Session.send"}),
    # prefix, suffix, substring
    ("fib*", {"flt.sample.fib", "flt.sample.fib_memo", "flt.extra.fib"}),
    ("flt.extra.*", {"flt.extra.fib", "flt.extra.send"}),
    ("*.send", {"flt.sample.Session.send", "flt.sample.Other.send", "flt.extra.send"}),
    ("*memo*", {"flt.sample.fib_memo"}),
    ("*", ALL),
    # full globs
    ("Session.?e?", {"flt.sample.Session.get"}),
    ("[SO]*.send", {"flt.sample.Session.send", "flt.sample.Other.send"}),
    ("Session.[!_]*", {"flt.sample.Session.send", "flt.sample.Session.get"}),
    ("Session.[^_g]*", {"flt.sample.Session.send"}),
    ("flt.*.f?b", {"flt.sample.fib", "flt.extra.fib"}),
    ("*<locals>*", {"flt.sample.outer.<locals>.inner"}),
    # the disambiguation suffix is optional
    ("<lambda>", {"flt.sample.<lambda>@29"}),
    ("flt.sample.<lambda>@29", {"flt.sample.<lambda>@29"}),
    ("flt.sample.<lambda>", {"flt.sample.<lambda>@29"}),
    # modules
    ("*:mod:flt.extra", {"flt.extra.fib", "flt.extra.send"}),
    ("fib:mod:flt.sample", {"flt.sample.fib"}),
    ("*:mod:flt", ALL),  # a literal module includes its submodules
    ("send:mod:flt.e*", {"flt.extra.send"}),
    ("*:mod:flt.ex[t]ra", {"flt.extra.fib", "flt.extra.send"}),
    # several patterns in one write, any whitespace
    ("helper\tgen\n  outer", {"flt.sample.helper", "flt.sample.gen", "flt.sample.outer"}),
])
def test_pattern_forms(reg: Registry, text: str, expected: set[str]) -> None:
    f = FunctionFilter(registry=reg)
    f.write_filter(text)
    assert ours(reg, f) == expected


def test_module_glob(reg: Registry) -> None:
    f = FunctionFilter(registry=reg)
    # A module glob matches whole module names: no module is named "fl" plus one character,
    # so this waits for such a module to be imported.
    f.write_filter("*:mod:fl?")
    assert ours(reg, f) == set() and f.pending() == ["*:mod:fl?"]
    # But a glob that names loaded modules must select something.
    with pytest.raises(FilterError, match="no function matches 'nope:mod:flt.s\\*'"):
        f.write_filter("nope:mod:flt.s*")


def test_empty_filter_matches_everything(reg: Registry) -> None:
    f = FunctionFilter(registry=reg)
    assert f.is_empty
    assert ours(reg, f) == ALL
    assert f.read_filter() == "#### all functions enabled ####\n"
    assert f.read_notrace() == "#### no functions disabled ####\n"
    assert len(f.select()) <= len(reg.functions()) == len(f.select_by_id())


def test_replace_append_and_clear(reg: Registry) -> None:
    f = FunctionFilter(registry=reg)
    f.write_filter("fib")
    f.write_filter("helper", append=True)
    assert f.read_filter() == "fib\nhelper\n"
    assert ours(reg, f) == {"flt.sample.fib", "flt.extra.fib", "flt.sample.helper"}
    f.write_filter("gen")  # '>' replaces
    assert f.read_filter() == "gen\n"
    f.write_filter("gen", append=True)  # writing a pattern again does not duplicate it
    assert f.filter_patterns == ["gen"]
    f.write_filter("   \n ")  # an empty write clears
    assert f.is_empty and ours(reg, f) == ALL
    f.write_filter("gen")
    f.write_filter("", append=True)  # an empty append changes nothing
    assert f.filter_patterns == ["gen"]


def test_remove_a_written_pattern(reg: Registry) -> None:
    f = FunctionFilter(["fib", "helper"], registry=reg)
    f.write_filter("!fib", append=True)
    assert f.read_filter() == "helper\n"
    assert ours(reg, f) == {"flt.sample.helper"}
    f.write_filter("!nothing_like_this", append=True)  # absent: silently ignored
    f.write_filter("!gen", append=True)  # not selected: nothing to remove
    assert f.read_filter() == "helper\n"
    f.write_filter("!helper", append=True)  # the last one: the hash is empty again
    assert f.is_empty
    f.write_filter("!helper", append=True)  # removing from an empty hash does nothing
    assert f.is_empty


def test_remove_functions_from_a_glob(reg: Registry) -> None:
    f = FunctionFilter(registry=reg)
    f.write_filter("*:mod:flt.sample")
    f.write_filter("!Session.*", append=True)  # like the kernel: out of the hash
    assert f.read_filter() == "*:mod:flt.sample\n!Session.*\n"
    assert ours(reg, f) == ALL - {
        "flt.sample.Session.send", "flt.sample.Session.get", "flt.sample.Session._private",
        "flt.extra.fib", "flt.extra.send"}
    # Adding back after a removal wins (the last entry that matches decides).
    f.write_filter("Session.get", append=True)
    assert "flt.sample.Session.get" in ours(reg, f)
    assert "flt.sample.Session.send" not in ours(reg, f)
    # One write is applied in order too.
    f.write_filter("fib* !fib_memo")
    assert ours(reg, f) == {"flt.sample.fib", "flt.extra.fib"}
    # Removing a pattern that another pattern still covers leaves an exclusion.
    f.write_filter("fib fib*")
    f.write_filter("!fib", append=True)
    assert ours(reg, f) == {"flt.sample.fib_memo"}


def test_notrace_wins(reg: Registry) -> None:
    f = FunctionFilter(["fib*"], ["fib_memo"], registry=reg)
    assert ours(reg, f) == {"flt.sample.fib", "flt.extra.fib"}
    assert not f.is_empty
    g = FunctionFilter(notrace=["*:mod:flt.sample"], registry=reg)
    assert ours(reg, g) == {"flt.extra.fib", "flt.extra.send"}
    g.write_notrace("!*:mod:flt.sample", append=True)
    assert g.is_empty
    g.write_notrace("Session.send Other.send")
    g.write_notrace("!Other.send", append=True)
    assert g.read_notrace() == "Session.send\n"


@pytest.mark.parametrize("filt, notrace", [
    ([], []), (["*"], []), (["*", "fib"], []), (["*"], ["fib*"]), (["fib*"], []),
    (["*:mod:flt.extra"], []), ([], ["*:mod:flt.sample"]), (["!fib"], []),
])
def test_matching_takes_what_matches_takes(reg: Registry, filt: list[str],
                                           notrace: list[str]) -> None:
    """matching() (a module's new functions at once, as the engine hooks them) takes exactly
    what matches() takes one by one, in order: at once only where the filter takes all."""
    f = FunctionFilter(filt, notrace, registry=reg)
    infos = [i for i in reg.functions() if i.module.startswith("flt.")]
    assert f.matching(infos) == [i for i in infos if f.matches(i)]


def test_a_module_of_exec_code_is_found_without_an_earlier_scan() -> None:
    """Code exec'd with a module name not in sys.modules: ``*:mod:NAME`` selects it whether or
    not anything scanned the heap before (it was refused on a registry that had not)."""
    ns = {"__name__": "flt_exec_only"}
    exec("def f():\n    return 1\n", ns)
    fresh = Registry()
    f = FunctionFilter(["*:mod:flt_exec_only"], registry=fresh)
    assert [i.name for i in f.select_infos()] == ["flt_exec_only.f"]


def test_select_keeps_equal_code_objects_apart(reg: Registry) -> None:
    # Code objects compare by value; two identical definitions on the same line of two files
    # are equal but distinct, and both must be selected.
    r = Registry()
    r.add_code(compile("def twin():\n    return 1\n", "/v/a.py", "exec"), "twins.a")
    r.add_code(compile("def twin():\n    return 1\n", "/v/b.py", "exec"), "twins.b")
    a, b = (i.code for i in r.functions() if i.module.startswith("twins."))
    assert a == b and a is not b
    f = FunctionFilter(["twin"], registry=r)
    assert set(f.select_by_id()) == {id(a), id(b)}
    assert len(f.select_infos()) == 2


# --- commands -------------------------------------------------------------------------------------
def test_commands_parse() -> None:
    items = parse_filter_text(
        "fib:traceon fib:traceoff:3 *:mod:flt.sample:stacktrace:count=2 gen:dump "
        "helper:enable_event:sched:sched_switch:5 helper:disable_event:irq:irq_handler_entry "
        "!fib:traceoff plain !gone:mod:m")
    assert items == [
        FilterCommand("fib", None, "traceon"),
        FilterCommand("fib", None, "traceoff", count=3),
        FilterCommand("*", "flt.sample", "stacktrace", count=2),
        FilterCommand("gen", None, "dump"),
        FilterCommand("helper", None, "enable_event", ("sched", "sched_switch"), 5),
        FilterCommand("helper", None, "disable_event", ("irq", "irq_handler_entry")),
        FilterCommand("fib", None, "traceoff", remove=True),
        Pattern("plain"),
        Pattern("gone", "m", remove=True),
    ]
    assert [i.position for i in items] == [0, 12, 27, 63, 72, 113, 156, 170, 176]


def test_commands_are_kept_apart(reg: Registry) -> None:
    f = FunctionFilter(registry=reg)
    f.write_filter("fib:traceoff:3 helper:enable_event:sched:sched_switch gen")
    assert f.filter_patterns == ["gen"]  # commands do not change what is traced
    assert [c.command for c in f.commands] == ["traceoff", "enable_event"]
    assert f.read_filter() == (
        "gen\nfib:traceoff:count=3\nhelper:enable_event:sched:sched_switch:unlimited\n")
    f.write_filter("fib:traceoff:5", append=True)  # written again: the count is updated
    assert [(c.command, c.count) for c in f.commands] == [("traceoff", 5), ("enable_event", None)]
    f.write_filter("")  # '>' empties the hash, but the commands stay (as in the kernel)
    assert f.read_filter() == (
        "#### all functions enabled ####\n"
        "fib:traceoff:count=5\nhelper:enable_event:sched:sched_switch:unlimited\n")
    f.write_filter("!fib:traceoff:5 !helper:enable_event:sched:sched_switch", append=True)
    assert f.commands == [] and f.is_empty


def test_cat_output_can_be_written_back(reg: Registry) -> None:
    f = FunctionFilter(registry=reg)
    f.write_filter("*:mod:flt.sample !Session.* fib:traceon:2 gen:stacktrace")
    g = FunctionFilter(registry=reg)
    g.write_filter(f.read_filter())
    assert g.read_filter() == f.read_filter()
    assert ours(reg, g) == ours(reg, f)
    h = FunctionFilter(registry=reg)
    h.write_filter(FunctionFilter(registry=reg).read_filter())  # the banner is a comment
    assert h.is_empty


# --- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "position", "message"), [
    ("nosuchfunction", 0, "no function matches 'nosuchfunction'"),
    ("fib  nosuch*", 5, "no function matches 'nosuch*'"),
    ("fib\n  zz?", 6, "no function matches 'zz?'"),
    ("nope:mod:flt.sample", 0, "no function matches 'nope:mod:flt.sample'"),
    ("fib nope:traceon", 4, "no function matches 'nope'"),
    ("fib:bogus", 4, "unknown command 'bogus'"),
    ("fib fib:", 8, "missing command after ':'"),
    ("fib:traceon:0", 12, "bad count '0'"),
    ("fib:traceon:-1", 12, "bad count '-1'"),
    ("fib:traceon:x", 12, "bad count 'x'"),
    ("fib:traceon:count=", 12, "bad count 'count='"),
    ("fib:traceon:2:3", 13, "unexpected ':3'"),
    ("fib:enable_event:sched", 22, "enable_event needs SYSTEM:EVENT"),
    ("fib:enable_event::ev", 17, "enable_event needs SYSTEM:EVENT"),
    (":mod:flt", 0, "missing function glob before ':mod:'"),
    ("  !:mod:flt", 3, "missing function glob before ':mod:'"),
    (":traceon", 0, "missing function glob before ':'"),
    ("fib:mod:", 8, "missing module name after ':mod:'"),
    ("fib:mod::traceon", 8, "missing module name after ':mod:'"),
    ("fib [abc", 4, "unbalanced '['"),
    ("fi[b", 2, "unbalanced '['"),
    ("*:mod:flt.[x", 10, "unbalanced '['"),
    ("fib x[z-a]", 5, "bad character class"),
    ("fib !", 4, "empty pattern after '!'"),
])
def test_errors_point_at_the_mistake(reg: Registry, text: str, position: int,
                                     message: str) -> None:
    f = FunctionFilter(["helper"], registry=reg)
    with pytest.raises(FilterError) as exc:
        f.write_filter(text)
    e = exc.value
    assert e.position == position
    assert e.message.startswith(message)
    assert e.text == text
    assert f.filter_patterns == ["helper"]  # a rejected write changes nothing


def test_error_rendering(reg: Registry) -> None:
    f = FunctionFilter(registry=reg)
    with pytest.raises(FilterError) as exc:
        f.write_filter("fib\nhelper fbi gen")
    assert str(exc.value) == (
        "no function matches 'fbi'\n"
        "  Command: helper fbi gen\n"
        "                  ^")
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize(("text", "hint"), [
    ("nosuch*", " (among the modules loaded so far; for modules the program imports later:"
                " '*:mod:nosuch*')"),
    ("*.nosuch_*", " (among the modules loaded so far; for a module the program imports"
                   " later, name it: 'nosuch_*:mod:MODULE')"),
    ("nosuchfunction", ""),  # an exact name: nothing to suggest
])
def test_a_glob_that_matches_nothing_yet_says_how_to_name_a_later_module(
        reg: Registry, text: str, hint: str) -> None:
    f = FunctionFilter(registry=reg)
    with pytest.raises(FilterError) as exc:
        f.write_filter(text)
    assert exc.value.message == f"no function matches '{text}'{hint}"


def test_commands_not_allowed_in_notrace(reg: Registry) -> None:
    f = FunctionFilter(registry=reg)
    with pytest.raises(FilterError) as exc:
        f.write_notrace("helper fib:traceoff")
    assert exc.value.position == 11


def test_constructor_validates(reg: Registry) -> None:
    with pytest.raises(FilterError):
        FunctionFilter(["fib", "typo_here"], registry=reg)


# --- patterns for modules that are not imported yet -----------------------------------------------
def test_mod_pattern_for_a_module_not_loaded(reg: Registry) -> None:
    r = Registry()
    f = FunctionFilter(["run:mod:flt_later"], registry=r)
    assert f.pending() == ["run:mod:flt_later"]
    assert f.select() == set()  # nothing yet, and not "everything"
    new = r.add_code(compile("def run(): pass\ndef stop(): pass\n", "/v/later.py", "exec"),
                     "flt_later")
    assert [i.name for i in new if f.matches(i)] == ["flt_later.run"]
    assert f.pending() == []


def test_dotted_pattern_for_a_findable_module() -> None:
    sys.modules.pop("rh_unimported", None)
    r = Registry()
    f = FunctionFilter(["rh_unimported.thing", "rh_unimported.*"], registry=r)
    assert "rh_unimported" not in sys.modules  # checking imported nothing
    with pytest.raises(FilterError, match="no function matches 'rh_not_a_module.thing'"):
        f.write_filter("rh_not_a_module.thing", append=True)
    with pytest.raises(FilterError):
        f.write_filter("thingamajig", append=True)  # undotted: nothing says which module
    unsubscribe = r.subscribe(lambda infos: None)
    try:
        mod = importlib.import_module("rh_unimported")
    finally:
        unsubscribe()
    assert f.select() == {mod.thing.__code__}


def test_dotted_pattern_for_a_submodule() -> None:
    importlib.import_module("rh_pkg")
    sys.modules.pop("rh_pkg.sub", None)
    r = Registry()
    f = FunctionFilter(["rh_pkg.sub.func"], registry=r)
    assert "rh_pkg.sub" not in sys.modules
    with pytest.raises(FilterError):
        f.write_filter("rh_pkg.nosub.func", append=True)
    with pytest.raises(FilterError):
        f.write_filter("rh_pkg.top.nothing", append=True)  # rh_pkg.top is a function
    unsubscribe = r.subscribe(lambda infos: None)
    try:
        sub = importlib.import_module("rh_pkg.sub")
    finally:
        unsubscribe()
    assert f.select() == {sub.func.__code__}


# --- glob translation -----------------------------------------------------------------------------
@pytest.mark.parametrize(("glob", "yes", "no"), [
    ("a*b", ["ab", "a.x.b"], ["abc", "ba"]),
    ("a?c", ["abc", "a.c"], ["ac", "abbc"]),
    ("[]x]", ["]", "x"], ["y"]),
    ("[!]x]", ["y"], ["]", "x"]),
    ("[a-c-]", ["b", "-"], ["d"]),
    ("a.b", ["a.b"], ["axb"]),
    ("(x)+", ["(x)+"], ["x", "xx"]),
    ("<lambda>@1#2", ["<lambda>@1#2"], ["<lambda>@1"]),
])
def test_compile_glob(glob: str, yes: list[str], no: list[str]) -> None:
    rx = compile_glob(glob)
    for s in yes:
        assert rx.fullmatch(s), s
    for s in no:
        assert not rx.fullmatch(s), s


# --- properties -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool(reg: Registry) -> list[str]:
    return _valid_patterns(reg)


def _valid_patterns(reg: Registry) -> list[str]:
    out: set[str] = set()
    for i in reg.functions():
        if not i.module.startswith("flt."):
            continue
        q = i.base_qualname
        out |= {i.name, q, q + "*", "*" + q[-3:], f"*{q[1:-1]}*" if len(q) > 2 else q,
                f"{q}:mod:{i.module}", f"*:mod:{i.module}", f"[{q[0]}]{q[1:]}"}
    out |= {f"absent{n}:mod:flt_absent_module" for n in range(5)}
    return sorted(out)


@settings(max_examples=150, deadline=None,  # (a scan of the heap: slow on a busy machine)
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_valid_patterns_round_trip(reg: Registry, pool: list[str], data: st.DataObject) -> None:
    patterns = data.draw(st.lists(st.sampled_from(pool), unique=True, max_size=12))
    seps = data.draw(st.lists(st.sampled_from([" ", "\t", "\n", "  \n\t"]),
                              min_size=len(patterns), max_size=len(patterns)))
    text = "".join(p + s for p, s in zip(patterns, seps, strict=True))
    f = FunctionFilter(registry=reg)
    f.write_filter(text)
    expected = patterns or ["#### all functions enabled ####"]
    assert f.read_filter().splitlines() == expected
    f.write_notrace(text)
    assert f.notrace_patterns == patterns
    # Appending one at a time gives the same hash.
    g = FunctionFilter(registry=reg)
    for p in patterns:
        g.write_filter(p, append=True)
    assert g.read_filter() == f.read_filter()


GARBAGE = st.text(
    alphabet=st.one_of(st.sampled_from(list("ab.*?[]!^-:#@<> \t\nfimodtraceon0123")),
                       st.characters()),
    max_size=40)


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=GARBAGE, append=st.booleans())
def test_garbage_raises_only_filter_error(reg: Registry, text: str, append: bool) -> None:
    f = FunctionFilter(["helper"], registry=reg)
    for write in (f.write_filter, f.write_notrace):
        try:
            write(text, append=append)
        except FilterError as e:
            assert 0 <= e.position <= len(text)
            assert e.text == text
            assert str(e).endswith("^")
    f.read_filter()
    f.read_notrace()


GLOBISH = st.text(alphabet=st.sampled_from(list("fibsendhlpr_.*?[]!-<>@9:modSt")), min_size=1,
                  max_size=12)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(glob=GLOBISH)
def test_validation_agrees_with_matching(reg: Registry, glob: str) -> None:
    # Writes validate through a search index; matches() runs compiled tests. They must agree.
    try:
        (item,) = parse_filter_text(glob)
    except (FilterError, ValueError):
        return
    if not isinstance(item, Pattern) or item.remove:
        return
    rx = compile_glob(item.glob)
    mod_rx = compile_glob(item.module) if item.module else None

    def brute(i: FunctionInfo) -> bool:
        if item.module is not None:
            if mod_rx is not None and any(c in item.module for c in "*?["):
                if not mod_rx.fullmatch(i.module):
                    return False
            elif not (i.module == item.module or i.module.startswith(item.module + ".")):
                return False
        keys = {i.name, i.qualname, i.base_name, i.base_qualname}
        return any(rx.fullmatch(k) for k in keys)

    expected = {id(i.code) for i in reg.functions() if brute(i)}
    f = FunctionFilter(registry=reg)
    try:
        f.write_filter(glob)
    except FilterError as e:
        assert e.message.startswith("no function matches")
        assert not expected
        return
    assert set(f.select_by_id()) == expected
    assert bool(expected) != bool(f.pending())


COMMAND = st.builds(
    FilterCommand,
    glob=st.sampled_from(["fib", "*", "Session.*", "[fg]*"]),
    module=st.sampled_from([None, "flt", "flt.s*"]),
    command=st.sampled_from(["traceon", "traceoff", "stacktrace", "dump", "enable_event"]),
    count=st.one_of(st.none(), st.integers(1, 10**6)),
)


@given(cmd=COMMAND)
def test_command_text_parses_back(cmd: FilterCommand) -> None:
    if cmd.command.endswith("_event"):
        cmd = FilterCommand(cmd.glob, cmd.module, cmd.command, ("sys", "ev"), cmd.count)
    (parsed,) = parse_filter_text(cmd.text)
    assert parsed == cmd


# --- speed ----------------------------------------------------------------------------------------
def test_matching_20k_functions() -> None:
    lines = []
    for c in range(4000):
        lines.append(f"class C{c}:")
        for m in ("get", "put", "send", "close", "_helper"):
            lines.append(f"    def {m}{c % 7}(self): pass")
    r = Registry()
    r.add_code(compile("\n".join(lines), "/v/big.py", "exec"), "big")
    infos = [i for i in r.functions() if i.module == "big"]
    assert len(infos) == 20000
    f = FunctionFilter(["*:mod:big", "get* *send3 C1??.*", "[a-z]*.close[0-3]", "C12.put5"],
                       ["*._helper*", "C3*"], registry=r)
    chosen = [i for i in infos if f.matches(i)]
    assert chosen and all(not i.qualname.startswith("C3") for i in chosen)
    assert not any(i.qualname.endswith("._helper" + str(int(i.qualname[1:].split(".")[0]) % 7))
                   for i in chosen)
    assert {id(i.code) for i in chosen} <= {id(c) for c in f.select()}


def test_matches_uses_compiled_state(reg: Registry) -> None:
    f = FunctionFilter(["fib"], registry=reg)
    info: FunctionInfo = next(i for i in reg.functions() if i.name == "flt.sample.fib")
    assert f.matches(info)
    gen = f.generation
    f.write_filter("helper")
    assert f.generation == gen + 1 and not f.matches(info)
