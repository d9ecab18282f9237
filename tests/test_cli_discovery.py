"""Every function that runs is traceable, run the way users run programs (the command line, in
a subprocess): code made at run time counted against cProfile, pytest's rewritten test
modules traced and probed, a plugin loaded with ``exec_module``, generated functions named in
``-l``. The engine-level side is tests/test_discovery.py.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from test_cli import PROGRAMS, rethook, run, strip_summary


def report_lines(path: Path, *flags: str) -> list[str]:
    rep = rethook("report", "-i", str(path), *flags)
    assert rep.returncode == 0, rep.stderr
    return rep.stdout.splitlines()


def calls_of(lines: list[str], name: str) -> int:
    """Calls of ``name`` in a function_graph report (leaves and nesting entries)."""
    return sum(1 for line in lines if re.search(rf"\|\s+{re.escape(name)}\(\)( {{|;)", line))


# --- code made at run time, against cProfile ------------------------------------------------
#: cProfile's name for each generated function of generated.py (file "<string>") -> rethook's
GENERATED = {
    "__init__": "__main__.Point.__init__",
    "__eq__": "__main__.Point.__eq__",
    "__hash__": "__main__.Point.__hash__",
    "__repr__": "__main__.Point.__repr__",
    "<lambda>": "__main__.Pair.__new__",  # namedtuple's __new__ is an eval'd lambda
    "scale": "__main__.scale",
    "shift": "__main__.shift",
}
#: dataclasses' helper: one code object per class (3.13) or per method (3.12), all with the
#: key ("<string>", 1, "__create_fn__"), under which pstats keeps only one of them
CREATE_FN = "__main__.__create_fn__"


def test_generated_code_counted_like_cprofile(tmp_path: Path) -> None:
    plain = run("generated.py")
    prof = run("-m", "cProfile", "-o", str(tmp_path / "prof.out"), "generated.py")
    assert prof.returncode == 0, prof.stderr
    import pstats

    theirs: dict[str, int] = {}
    for (filename, _line, func), (_cc, nc, *_rest) in pstats.Stats(
            str(tmp_path / "prof.out")).stats.items():
        if filename == "<string>" and func in GENERATED:
            theirs[GENERATED[func]] = theirs.get(GENERATED[func], 0) + nc
        elif filename.endswith("generated.py") and func in ("main", "norm"):
            theirs["__main__.main" if func == "main" else "__main__.Point.norm"] = nc
    assert len(theirs) == len(GENERATED) + 2, theirs

    traced = rethook("profile", "generated.py")  # the default filter: the script's own code
    assert traced.returncode == plain.returncode == 0, traced.stderr
    ours = {m.group(1): int(m.group(2)) for m in
            re.finditer(r"^\s+(__main__\.\S+)\s+(\d+)\s", traced.stdout, re.MULTILINE)}
    helpers = {name: n for name, n in ours.items() if name.startswith(CREATE_FN)}
    assert set(helpers.values()) == {1}  # each called once: __create_fn__, @1, @1#1...
    assert {k: v for k, v in ours.items() if k not in helpers} == theirs
    assert traced.stdout.startswith(plain.stdout)  # the program's output, then the profile
    assert traced.stderr == plain.stderr


def test_every_function_counted_alike_however_selected(tmp_path: Path) -> None:
    """``-l '*'`` selects functions by their registration (no set of ids kept by the engine);
    with a notrace pattern of a function never called, the same functions are selected one by one
    as their modules load. Both count every call of every function the same."""
    counts = []
    for extra in ((), ("-n", "os.fwalk")):  # (never called here)
        r = rethook("profile", "-l", "*", *extra, "generated.py")
        assert r.returncode == 0, r.stderr
        # (less a name's @LINE suffix: a property's getter and setter share a qualname, and
        # a listing that registers their whole module first names both apart; -n lists one)
        seen: dict[str, int] = {}
        for m in re.finditer(r"^\s+(\S+\.\S+)\s+(\d+)\s", r.stdout, re.MULTILINE):
            name = re.sub(r"@\d+(#\d+)?$", "", m.group(1))
            seen[name] = seen.get(name, 0) + int(m.group(2))
        counts.append(seen)
    implicit, explicit = counts
    assert implicit == explicit
    assert implicit["__main__.Point.__init__"] == 80 and len(implicit) > len(GENERATED)


def test_a_filter_naming_generated_functions_before_they_exist(tmp_path: Path) -> None:
    """``__main__.Point.__init__`` names nothing until the script runs: kept, then hooked."""
    out = tmp_path / "t.dat"
    r = rethook("record", "-o", str(out), "-l", "__main__.Point.__init__ __main__.Pair.__new__",
                "generated.py")
    assert r.returncode == 0, r.stderr
    lines = report_lines(out)
    assert calls_of(lines, "__main__.Point.__init__") == 80
    assert calls_of(lines, "__main__.Pair.__new__") == 40
    assert sum(1 for line in lines if "()" in line) == 120  # nothing else


# --- a plugin loaded past the import hook ---------------------------------------------------
def test_plugin_loaded_with_exec_module(tmp_path: Path) -> None:
    """Also a zipimported module and a frozen one (``__hello__``)."""
    plain = run("plugin_host.py")
    out = tmp_path / "t.dat"
    traced = rethook("record", "-o", str(out), "-l",
                     "*:mod:greet_plugin *:mod:zipped_mod *:mod:__hello__", "plugin_host.py")
    assert traced.stdout == plain.stdout
    assert strip_summary(traced.stderr)[0] == plain.stderr
    assert traced.returncode == plain.returncode == 0
    lines = report_lines(out)
    for name, n in (("greet_plugin.greet", 3), ("greet_plugin.shout", 3),
                    ("zipped_mod.zipped", 2), ("__hello__.main", 1)):
        assert calls_of(lines, name) == n, (name, lines)


# --- pytest: test modules imported by its assertion-rewriting hook --------------------------
SUITE = '''
    import dataclasses


    @dataclasses.dataclass
    class Item:
        name: str
        qty: int = 1


    def helper(x):
        return x * 2


    def test_add():
        assert helper(2) == 4


    def test_items():
        items = [Item("a"), Item("b", 3)]
        assert sum(i.qty for i in items) == 4


    def test_rewritten():
        assert "@py_builtins" in globals()  # pytest's assertion rewriting is on
'''


def test_pytest_test_functions_traced_and_probed(tmp_path: Path) -> None:
    (tmp_path / "test_mod.py").write_text(textwrap.dedent(SUITE))
    out = tmp_path / "t.dat"
    traced = rethook("record", "-o", str(out), "-l", "test_mod.*",
                     "-e", "r:tadd test_mod.test_add ret=$retval",
                     "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mod.py", cwd=tmp_path)
    assert traced.returncode == 0, traced.stderr + traced.stdout
    dots, summary = traced.stdout.splitlines()  # what the same run prints untraced
    assert dots.startswith("... ") and dots.endswith(" [100%]")
    assert re.fullmatch(r"3 passed in \d+\.\d+s", summary)
    lines = report_lines(out)
    for name, n in (("test_mod.test_add", 1), ("test_mod.test_items", 1),
                    ("test_mod.test_rewritten", 1), ("test_mod.helper", 1),
                    ("test_mod.Item.__init__", 2)):
        assert calls_of(lines, name) == n, (name, "\n".join(lines))
    probes = [line for line in lines if "/* tadd:" in line]
    assert len(probes) == 1 and "ret=None" in probes[0]


def test_a_glob_for_test_modules_names_the_pattern_that_selects_them(tmp_path: Path) -> None:
    """-l 'test_*' under -m pytest matches nothing when the filter is written (pytest imports
    the test modules later): a usage error that says what to write instead, and what it
    says records the suite's functions."""
    (tmp_path / "test_mod.py").write_text(textwrap.dedent(SUITE))
    out = tmp_path / "t.dat"
    args = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mod.py")
    refused = rethook("record", "-o", str(out), "-l", "test_*", *args, cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "no function matches 'test_*'" in refused.stderr
    hint = re.search(r"for modules the program imports later: '([^']+)'", refused.stderr)
    assert hint is not None and hint.group(1) == "*:mod:test_*", refused.stderr
    traced = rethook("record", "-o", str(out), "-l", hint.group(1), *args, cwd=tmp_path)
    assert traced.returncode == 0, traced.stderr
    lines = report_lines(out)
    assert calls_of(lines, "test_mod.test_add") == 1 and calls_of(lines, "test_mod.helper") == 1
    refused = rethook("record", "-o", str(out), "-l", "*.test_*", *args, cwd=tmp_path)
    assert refused.returncode == 2 and "'test_*:mod:MODULE'" in refused.stderr
    traced = rethook("record", "-o", str(out), "-l", "test_*:mod:test_mod", *args, cwd=tmp_path)
    assert traced.returncode == 0, traced.stderr
    lines = report_lines(out)
    assert calls_of(lines, "test_mod.test_items") == 1  # (and helper: 'test_mod.helper')


def test_a_filter_nothing_ran_under_is_said(tmp_path: Path) -> None:
    """A pattern for a module not imported yet is taken (as the kernel's ':mod:'); when no
    function it selects ran, the summary says so rather than leave an empty trace
    unexplained."""
    (tmp_path / "test_mod.py").write_text(textwrap.dedent(SUITE))
    traced = rethook("record", "-o", str(tmp_path / "t.dat"), "-l", "nothing_*:mod:test_mod",
                     "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mod.py",
                     cwd=tmp_path)
    assert traced.returncode == 0, traced.stderr
    assert "0 events (0 lost)" in traced.stderr
    assert "no function the filter selects ('nothing_*:mod:test_mod') ran" in traced.stderr


def test_programs_still_run_unchanged(tmp_path: Path) -> None:
    """Discovery sees every code object of a program that generates code while it runs; the
    program's behaviour is untouched (``-l '*'``: everything, the stdlib included)."""
    plain = run("generated.py")
    traced = rethook("record", "-o", str(tmp_path / "t.dat"), "-l", "*", "generated.py")
    assert traced.stdout == plain.stdout
    assert strip_summary(traced.stderr)[0] == plain.stderr
    assert traced.returncode == plain.returncode
    lines = report_lines(tmp_path / "t.dat")
    assert calls_of(lines, "__main__.Point.__init__") == 80
    assert calls_of(lines, "__main__.scale") == 40


assert PROGRAMS.is_dir()
