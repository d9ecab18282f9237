"""Event filters (the ftrace filter language) and event triggers: semantics, errors, read-back."""

from __future__ import annotations

import fnmatch
import pickle
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rethook.probes.evfilter import (
    EventFilter,
    FilterSyntaxError,
    compile_filter,
    glob_matcher,
    kstrtoll,
    kstrtoull,
    normalize_type,
)
from rethook.probes.hist import HistTrigger
from rethook.probes.triggers import (
    CommandTrigger,
    TriggerActions,
    TriggerRemoval,
    apply_trigger_write,
    parse_trigger,
    render_trigger_file,
)

FIELDS = {"len": "u64", "ret": "s64", "dur": "f64", "name": "str", "ok": "bool"}
U64_MAX = (1 << 64) - 1


class Fault:
    """A fetch-fault marker, as the probe layer would pass it."""

    def __repr__(self) -> str:
        return "<fault>"


FAULT = Fault()


def match(text: str, values: dict, fields: dict = FIELDS) -> bool:
    return compile_filter(text, fields).match(values)


def err(text: str, fields: dict = FIELDS) -> FilterSyntaxError:
    with pytest.raises(FilterSyntaxError) as info:
        compile_filter(text, fields)
    return info.value


# ---------------------------------------------------------------------------------------------
# Operators, one type at a time: exact truth tables

@pytest.mark.parametrize("op,expect", [
    ("==", [False, True, False]),
    ("!=", [True, False, True]),
    ("<", [True, False, False]),
    ("<=", [True, True, False]),
    (">", [False, False, True]),
    (">=", [False, True, True]),
])
def test_numeric_comparisons_truth_table(op, expect):
    f = compile_filter(f"len {op} 5", FIELDS)
    assert [f.match({"len": v}) for v in (4, 5, 6)] == expect
    g = compile_filter(f"ret {op} -5", FIELDS)
    assert [g.match({"ret": v}) for v in (-6, -5, -4)] == expect
    h = compile_filter(f"dur {op} 0.5", FIELDS)
    assert [h.match({"dur": v}) for v in (0.25, 0.5, 0.75)] == expect


def test_bitwise_and_is_a_bit_test():
    f = compile_filter("len & 0x6", FIELDS)
    assert [f.match({"len": v}) for v in range(9)] == [
        False, False, True, True, True, True, True, True, False]
    g = compile_filter("ret & 1", FIELDS)
    assert g.match({"ret": -1}) and not g.match({"ret": -2})
    b = compile_filter("ok & 1", FIELDS)
    assert b.match({"ok": True}) and not b.match({"ok": False})


def test_integer_literals_follow_kstrtoll():
    assert match("len == 0x1f", {"len": 31})
    assert match("len == 0X1F", {"len": 31})
    assert match("len == 017", {"len": 15})  # leading 0: octal, like the kernel
    assert match("len == 0", {"len": 0})
    assert match("ret == -0x10", {"ret": -16})
    assert match("ret == -9223372036854775808", {"ret": -(1 << 63)})
    assert match(f"len == {U64_MAX}", {"len": U64_MAX})
    assert match("len==5", {"len": 5})  # no spaces needed


def test_kernel_integer_parsers():
    assert kstrtoull("+12") == 12
    assert kstrtoull("0x") is None and kstrtoull("08") is None and kstrtoull("") is None
    assert kstrtoull(str(U64_MAX + 1)) is None
    assert kstrtoll("-1") == -1 and kstrtoll("-+1") is None
    assert kstrtoll(str(1 << 63)) is None and kstrtoll(str(-(1 << 63))) == -(1 << 63)


def test_float_literals_for_f64_fields():
    assert match("dur > 1.5", {"dur": 1.6})
    assert not match("dur > 1.5", {"dur": 1.5})
    assert match("dur < -2e-3", {"dur": -0.01})
    assert match("dur == .5", {"dur": 0.5})
    assert match("dur == 3", {"dur": 3.0}) and match("dur == 3", {"dur": 3})
    assert match("dur > 0x10", {"dur": 16.5})


def test_bool_fields_compare_as_integers():
    assert match("ok == 1", {"ok": True}) and match("ok == 0", {"ok": False})
    assert match("ok != 0", {"ok": True}) and not match("ok == 1", {"ok": False})


def test_string_equality_and_single_quotes():
    assert match('name == "json"', {"name": "json"})
    assert not match('name == "json"', {"name": "json.loads"})
    assert match("name != 'json'", {"name": "xml"})
    assert match('name == "a*b"', {"name": "a*b"})  # '==' never globs
    assert not match('name == "a*b"', {"name": "axb"})
    assert match('name == ""', {"name": ""})


@pytest.mark.parametrize("pattern,yes,no", [
    ("json*", ["json", "json.loads"], ["xjson", "jso"]),
    ("*loads", ["loads", "json.loads"], ["loadsx"]),
    ("*on.l*", ["json.loads", "on.l"], ["json"]),
    ("j*n.*s", ["json.loads", "jn.s"], ["json.load"]),
    ("j?on", ["json", "jxon"], ["jsson", "jon"]),
    ("[jk]son", ["json", "kson"], ["lson"]),
    ("[!jk]son", ["lson"], ["json", "kson"]),
    ("[a-c]x", ["ax", "bx", "cx"], ["dx"]),
    ("[]]x", ["]x"], ["ax"]),
    ("a[b", ["a[b"], ["ab"]),  # no closing ']': the '[' is literal
    ("a\\*", ["a*"], ["ab"]),  # backslash escapes
    ("*", ["", "anything"], []),
    ("", [""], ["x"]),
])
def test_glob_operator(pattern, yes, no):
    f = compile_filter(f'name ~ "{pattern}"', FIELDS)
    for s in yes:
        assert f.match({"name": s}), (pattern, s)
    for s in no:
        assert not f.match({"name": s}), (pattern, s)


def test_glob_with_leading_bang_negates():
    f = compile_filter('name ~ "!json*"', FIELDS)
    assert f.match({"name": "xml"}) and not f.match({"name": "json.loads"})


def test_glob_matcher_agrees_with_fnmatch_on_simple_patterns():
    for pat in ["a*", "*a", "*a*", "a?c", "a*c*", "**", "?", "[ab]*"]:
        m = glob_matcher(pat)
        for s in ["", "a", "abc", "bca", "ac", "cab", "b"]:
            assert m(s) == fnmatch.fnmatchcase(s, pat), (pat, s)


# ---------------------------------------------------------------------------------------------
# Combinations: precedence, '!', parentheses

REC = {"len": 5, "ret": -1, "name": "json", "dur": 0.5, "ok": True}


@pytest.mark.parametrize("text,expect", [
    ("len == 5 && ret == -1", True),
    ("len == 5 && ret == 0", False),
    ("len == 0 || ret == -1", True),
    ("len == 0 || ret == 0", False),
    # '&&' binds tighter than '||'
    ("len == 5 || len == 0 && ret == 0", True),
    ("(len == 5 || len == 0) && ret == 0", False),
    ("ret == 0 && len == 0 || len == 5", True),
    ("ret == 0 && (len == 0 || len == 5)", False),
    # '!' applies to the next predicate or group only
    ("!len == 5", False),
    ("!len == 0", True),
    ("!len == 5 || ret == -1", True),
    ("!(len == 5 || ret == 0)", False),
    ("!(len == 0 || ret == 0)", True),
    ("!(len == 5 && ret == 0)", True),
    ("!!len == 5", True),
    ("! ( ! (len == 5) )", True),
    ("!(len == 5) && ret == -1", False),
    ("(((len == 5)))", True),
    ('((ret >= -10 && ret < 15) || ret == 17) && name != "bash"', True),
    ("len==5&&ret==-1||ok==0", True),
    ("len == 5 && (ret == 0 || (name ~ \"js*\" && !ok == 0))", True),
])
def test_combinations(text, expect):
    assert match(text, REC) is expect


def test_and_or_truth_tables():
    f = compile_filter("len == 1 && ret == 1 || ok == 1", FIELDS)
    table = {}
    for a in (0, 1):
        for b in (0, 1):
            for c in (0, 1):
                table[a, b, c] = f.match({"len": a, "ret": b, "ok": bool(c)})
    assert table == {(a, b, c): bool((a and b) or c)
                     for a in (0, 1) for b in (0, 1) for c in (0, 1)}


def test_common_fields_comm_and_common_pid():
    assert match('comm == "worker"', {"comm": "worker"})
    assert match('COMM ~ "work*"', {"comm": "worker"})
    assert match("common_pid == 1234", {"common_pid": 1234})
    f = compile_filter('ret > 0 && comm == "worker"', FIELDS)
    assert f.fields_used == {"ret", "comm"}


def test_event_fields_shadow_common_ones():
    f = compile_filter("comm == 3", {"comm": "u64"})
    assert f.match({"comm": 3})


def test_field_type_aliases():
    assert normalize_type("x32") == "u64" and normalize_type("string") == "str"
    assert match("n > 3", {"n": 4}, {"n": "u8"})
    with pytest.raises(ValueError):
        normalize_type("char[16]")


def test_text_and_repr():
    f = compile_filter("len > 3   \n", FIELDS)
    assert f.text == "len > 3" and repr(f) == "EventFilter('len > 3')"
    assert isinstance(f, EventFilter) and f({"len": 4})


# ---------------------------------------------------------------------------------------------
# Faults never match

@pytest.mark.parametrize("text", [
    "len == 5", "len != 5", "len < 5", "len <= 5", "len > 5", "len >= 5", "len & 5",
    "dur != 1.0", "ok != 0",
])
@pytest.mark.parametrize("bad", [FAULT, None, "5", 5.0j, ValueError("x")])
def test_faulted_numbers_compare_false(text, bad):
    assert not match(text, {"len": bad, "dur": bad, "ok": bad})


@pytest.mark.parametrize("text", ['name == "a"', 'name != "a"', 'name ~ "*"', 'name ~ "!a"'])
@pytest.mark.parametrize("bad", [FAULT, None, 7, b"a"])
def test_faulted_strings_compare_false(text, bad):
    assert not match(text, {"name": bad})


def test_missing_field_is_a_fault():
    assert not match("len != 5", {})
    assert not match('comm != "x"', {})


def test_not_inverts_a_faulted_predicate_like_the_kernel():
    assert match("!(len == 5)", {"len": FAULT})
    assert not match("len != 5", {"len": FAULT})


def test_is_fault_for_markers_of_the_field_type():
    class IntFault(int):
        pass

    marker = IntFault(0)
    f = compile_filter("len == 0", FIELDS, is_fault=lambda v: v is marker)
    assert f.match({"len": 0}) and not f.match({"len": marker})


# ---------------------------------------------------------------------------------------------
# Errors: message, exact caret position, error_log rendering

@pytest.mark.parametrize("text,message,pos", [
    # field and operator
    ("nme == 1", "Field not found", 0),
    ("len == 1 && nme == 1", "Field not found", 12),
    ("len = 1", "Invalid operator", 4),
    ("len", "Invalid operator", 3),
    ("len !~ 1", "Invalid operator", 4),
    ("== 1", "Missing field name and/or value", 0),
    ("len == 1 &&", "Missing field name and/or value", 11),
    ("len == 1 || ()", "Missing field name and/or value", 13),
    # value and type rules
    ("len ==", "Invalid value (did you forget quotes)?", 6),
    ("name == bash", "Invalid value (did you forget quotes)?", 8),
    ('name < "x"', "Illegal operation for field type", 7),
    ('name & "x"', "Illegal operation for field type", 7),
    ('len == "x"', "Expecting numeric field", 7),
    ('len < "x"', "Illegal operation for field type", 6),
    ("name == 5", "Expecting string field", 8),
    ("name ~ 5", "Expecting string field", 7),
    ("len ~ 5", "Illegal operation for field type", 6),
    ("dur & 1", "Illegal operation for field type", 6),
    ("len > -1", "Illegal integer value (must be 0 to 18446744073709551615)", 6),
    ("len > 12abc", "Illegal integer value", 6),
    ("len > 08", "Illegal integer value", 6),
    ("ret > 1.5", "Illegal integer value", 6),
    (f"len > {U64_MAX + 1}", "Illegal integer value (must be 0 to 18446744073709551615)", 6),
    (f"ret > {1 << 63}",
     "Illegal integer value (must be -9223372036854775808 to 9223372036854775807)", 6),
    ("ret == -", "Illegal integer value", 7),
    ("dur > 1.5.5", "Illegal floating point value", 6),
    ("len > 1" + "0" * 23, "Operand too long", 6),
    ('name == "' + "x" * 256 + '"', "Operand too long", 8),
    # structure
    ("(len == 1", "Too many '('", 0),
    ("(len == 1) && ((ret == 1)", "Too many '('", 14),
    ("len == 1)", "Too few '('", 8),
    ('name == "abc', "Missing matching quote", 8),
    ("name == 'a\" && len == 1", "Missing matching quote", 8),
    ("len == 1 ret == 2", "Too many terms in predicate expression", 9),
    ("len == 1 & ret == 2", "Too many terms in predicate expression", 9),
    ("len == 1 | ret == 2", "Too many terms in predicate expression", 9),
    ("(len == 1) ret == 2", "Too many terms in predicate expression", 11),
    ("len == 1.", "Too many terms in predicate expression", 8),
    ("", "No filter found", 0),
    ("   ", "No filter found", 0),
    ("(" * 60 + "len == 1" + ")" * 60, "Parentheses nested too deeply", 50),
])
def test_error_messages_and_caret_positions(text, message, pos):
    e = err(text)
    assert (e.message, e.position) == (message, pos), str(e)
    assert isinstance(e, ValueError)


def test_error_renders_like_error_log():
    e = err('((sig >= 10 && sig < 15) || dsig == 17) && comm != "bash"', {"sig": "s64"})
    assert str(e) == (
        "event filter parse error: error: Field not found\n"
        '  Command: ((sig >= 10 && sig < 15) || dsig == 17) && comm != "bash"\n'
        "                                       ^"
    )
    assert e.error_log(12.5) == (
        "[   12.500000] event filter parse error: error: Field not found\n"
        '  Command: ((sig >= 10 && sig < 15) || dsig == 17) && comm != "bash"\n'
        "                                       ^\n"
    )
    assert e.filter_file_text() == (
        '((sig >= 10 && sig < 15) || dsig == 17) && comm != "bash"\n'
        "                            ^\n"
        "parse_error: Field not found\n"
    )


def test_error_caret_counts_tabs_as_one_column():
    e = err("len ==\t\tbash")
    assert e.position == 8
    assert str(e).splitlines()[1:] == ["  Command: len ==  bash", " " * 19 + "^"]


def test_error_pickles():
    e = pickle.loads(pickle.dumps(err("nope == 1")))
    assert (e.message, e.text, e.position, e.location) == (
        "Field not found", "nope == 1", 0, "event filter parse error")


# ---------------------------------------------------------------------------------------------
# Property: random well-typed filters evaluate as a reference evaluator does

PFIELDS = {"a": "u64", "b": "s64", "c": "f64", "s": "str", "t": "str", "ok": "bool"}
ALPHA = "ab"
WS = st.sampled_from(["", " ", "  ", "\t"])


@st.composite
def int_lit(draw, signed):
    v = draw(st.integers(-12 if signed else 0, 12))
    form = draw(st.sampled_from(["dec", "hex", "oct"]))
    mag = abs(v)
    text = str(mag) if form == "dec" else hex(mag) if form == "hex" else (
        "0" + oct(mag)[2:] if mag else "0")
    return v, ("-" if v < 0 else "") + text


@st.composite
def predicate(draw):
    field = draw(st.sampled_from(sorted(PFIELDS)))
    kind = PFIELDS[field]
    if kind == "str":
        op = draw(st.sampled_from(["==", "!=", "~"]))
        if op == "~":
            value = draw(st.text(alphabet=ALPHA + "*?", max_size=4))
            if draw(st.booleans()):
                value = "!" + value
        else:
            value = draw(st.text(alphabet=ALPHA, max_size=3))
        q = draw(st.sampled_from(['"', "'"]))
        lit = f"{q}{value}{q}"
    elif kind == "f64":
        op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))
        value = draw(st.sampled_from([0.5, -1.25, 2.0, 3, -2, 0.0]))
        lit = repr(value)
    else:
        ops = ["==", "!=", "<", "<=", ">", ">=", "&"]
        op = draw(st.sampled_from(ops))
        value, lit = draw(int_lit(kind == "s64"))
        if kind == "bool":
            value, lit = draw(st.sampled_from([(0, "0"), (1, "1"), (2, "2")]))
    text = f"{field}{draw(WS)}{op}{draw(WS)}{lit}"
    return ("pred", field, kind, op, value), text


def tree(max_leaves=12):
    def extend(children):
        return st.one_of(
            st.tuples(st.just("not"), children),
            st.tuples(st.just("and"), st.lists(children, min_size=2, max_size=3)),
            st.tuples(st.just("or"), st.lists(children, min_size=2, max_size=3)),
        )
    return st.recursive(predicate(), extend, max_leaves=max_leaves)


def render(node, draw_bool) -> tuple[object, str, bool]:
    """(reference node, text, whether the text is one parenthesized group), with parentheses
    where precedence needs them and sometimes more."""
    def wrap(ref, text, atomic):
        return (ref, f"({text})", True) if draw_bool() else (ref, text, atomic)

    if isinstance(node[0], tuple):
        ref, text = node
        return wrap(ref, text, True)
    if node[0] == "not":
        ref, text, atomic = render(node[1], draw_bool)
        return wrap(("not", ref), "!" + (text if atomic else f"({text})"), True)
    parts, refs = [], []
    for child in node[1]:
        ref, text, atomic = render(child, draw_bool)
        if node[0] == "and" and ref[0] == "or" and not atomic:
            text = f"({text})"
        parts.append(text)
        refs.append(ref)
    sep = " && " if node[0] == "and" else " || "
    if not draw_bool():
        sep = sep.strip()
    return wrap((node[0], refs), sep.join(parts), False)


def reference(ref, values) -> bool:
    kind = ref[0]
    if kind == "not":
        return not reference(ref[1], values)
    if kind == "and":
        return all(reference(r, values) for r in ref[1])
    if kind == "or":
        return any(reference(r, values) for r in ref[1])
    _, field, ftype, op, value = ref
    v = values.get(field)
    if ftype == "str":
        if not isinstance(v, str):
            return False
        if op == "~":
            neg = value.startswith("!")
            hit = fnmatch.fnmatchcase(v, value[1:] if neg else value)
            return hit != neg
        return (v == value) if op == "==" else (v != value)
    ok_types = (int, float) if ftype == "f64" else (int,)
    if not isinstance(v, ok_types):
        return False
    return {
        "==": v == value, "!=": v != value, "<": v < value, "<=": v <= value,
        ">": v > value, ">=": v >= value,
    }[op] if op != "&" else (v & value) != 0


def values_strategy():
    fault = st.sampled_from([FAULT, None, "x", 1.5j])
    return st.fixed_dictionaries({}, optional={
        "a": st.one_of(st.integers(0, 14), fault),
        "b": st.one_of(st.integers(-14, 14), fault),
        "c": st.one_of(st.sampled_from([0.5, -1.25, 2.0, 3.0, 0.0, 7.5]), st.integers(-3, 3),
                       fault),
        "s": st.one_of(st.text(alphabet=ALPHA, max_size=4), fault),
        "t": st.one_of(st.text(alphabet=ALPHA, max_size=4), fault),
        "ok": st.one_of(st.booleans(), fault),
    })


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_filters_match_reference(data):
    node = data.draw(tree())
    ref, text, _ = render(node, lambda: data.draw(st.booleans()))
    f = compile_filter(text, PFIELDS)
    for _ in range(8):
        values = data.draw(values_strategy())
        assert f.match(values) is reference(ref, values), (text, values)


# ---------------------------------------------------------------------------------------------
# Triggers

class Actions:
    """A tracing instance for the tests: state plus a log of what the triggers did."""

    def __init__(self, on: bool = True) -> None:
        self.on = on
        self.log: list[str] = []

    def is_tracing_on(self) -> bool:
        return self.on

    def traceon(self) -> None:
        self.on = True
        self.log.append("on")

    def traceoff(self) -> None:
        self.on = False
        self.log.append("off")

    def stacktrace(self) -> None:
        self.log.append("stack")


def test_actions_protocol():
    assert isinstance(Actions(), TriggerActions)


@pytest.mark.parametrize("text,readback", [
    ("traceon", "traceon:unlimited"),
    ("traceoff:2", "traceoff:count=2"),
    ("stacktrace:5 if len >= 65536", "stacktrace:count=5 if len >= 65536"),
    ("traceoff if ret > 0", "traceoff:unlimited if ret > 0"),
    ("traceoff:if ret > 0", "traceoff:unlimited if ret > 0"),
    ("traceon:0x10", "traceon:count=16"),
    ("traceon 3", "traceon:count=3"),
    ("traceon:", "traceon:unlimited"),
    ("  traceoff:1   if   ret > 0  ", "traceoff:count=1 if ret > 0"),
    ('stacktrace if name ~ "json*" && comm == "w"',
     'stacktrace:unlimited if name ~ "json*" && comm == "w"'),
])
def test_trigger_readback(text, readback):
    t = parse_trigger(text, FIELDS)
    assert isinstance(t, CommandTrigger) and t.text == readback


def test_traceoff_count_consumed_only_on_state_change():
    t = parse_trigger("traceoff:2", FIELDS)
    a = Actions(on=True)
    t.fire({}, a)
    assert a.log == ["off"] and t.count == 1
    t.fire({}, a)  # already off: nothing, count kept
    t.fire({}, a)
    assert a.log == ["off"] and t.count == 1
    a.on = True
    t.fire({}, a)
    assert a.log == ["off", "off"] and t.count == 0
    a.on = True
    t.fire({}, a)  # count exhausted
    assert a.log == ["off", "off"] and a.on and t.text == "traceoff:count=0"


def test_traceon_unlimited_acts_only_when_off():
    t = parse_trigger("traceon", FIELDS)
    a = Actions(on=True)
    t.fire({}, a)
    assert a.log == []
    a.on = False
    t.fire({}, a)
    t.fire({}, a)
    assert a.log == ["on"] and t.count is None


def test_stacktrace_count_decrements_every_time():
    t = parse_trigger("stacktrace:3", FIELDS)
    a = Actions()
    for _ in range(5):
        t.fire({}, a)
    assert a.log == ["stack"] * 3 and t.text == "stacktrace:count=0"


def test_filter_is_checked_before_the_count():
    t = parse_trigger("stacktrace:2 if len > 10", FIELDS)
    a = Actions()
    for v in [1, 20, 2, 3, FAULT, 30, 40]:
        t.fire({"len": v}, a)
    assert a.log == ["stack", "stack"] and t.count == 0
    off = parse_trigger("traceoff:1 if ret < 0", FIELDS)
    a = Actions(on=True)
    off.fire({"ret": 1}, a)
    assert a.on and off.count == 1
    off.fire({"ret": -1}, a)
    assert not a.on and off.count == 0


def test_counted_triggers_are_exact_under_threads():
    t = parse_trigger("stacktrace:1000", FIELDS)

    class Counting(Actions):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0
            self.lock = threading.Lock()

        def stacktrace(self) -> None:
            with self.lock:
                self.n += 1

    a = Counting()

    def worker():
        for _ in range(500):
            t.fire({}, a)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert a.n == 1000 and t.count == 0


@pytest.mark.parametrize("text,message,pos,location", [
    ("", "Empty trigger command", 0, "trigger"),
    ("tracen", "Unknown trigger command", 0, "trigger"),
    ("!tracen", "Unknown trigger command", 1, "trigger"),
    ("snapshot", "Trigger command not supported", 0, "trigger"),
    ("enable_event:sched:sched_switch", "Trigger command not supported", 0, "trigger"),
    ("traceon:5x", "Invalid count", 8, "trigger"),
    ("traceon:5 fi len > 1", "Expected 'if FILTER'", 10, "trigger"),
    ("traceon:abc", "Expected 'if FILTER'", 8, "trigger"),
    ("traceon if", "Missing filter after 'if'", 10, "trigger"),
    ("traceon:3 if nme > 1", "Field not found", 13, "event filter parse error"),
    ("stacktrace if len > -1", "Illegal integer value (must be 0 to 18446744073709551615)",
     20, "event filter parse error"),
])
def test_trigger_errors(text, message, pos, location):
    with pytest.raises(FilterSyntaxError) as info:
        parse_trigger(text, FIELDS)
    e = info.value
    assert (e.message, e.position, e.location) == (message, pos, location), str(e)
    assert e.text == text.strip()


def test_trigger_filter_error_caret_is_in_the_whole_command():
    with pytest.raises(FilterSyntaxError) as info:
        parse_trigger("traceoff:2 if ret > 0 && nme == 1", FIELDS)
    assert str(info.value) == (
        "event filter parse error: error: Field not found\n"
        "  Command: traceoff:2 if ret > 0 && nme == 1\n"
        "                                    ^"
    )


def test_removal_parsing():
    r = parse_trigger("!traceoff:1 if ret > 0", FIELDS)
    assert isinstance(r, TriggerRemoval) and r.command == "traceoff"
    h = parse_trigger("!hist:keys=len", FIELDS)
    assert isinstance(h, TriggerRemoval) and isinstance(h.hist, HistTrigger)


def test_apply_trigger_write_rules():
    ts = apply_trigger_write([], "traceoff:2 if ret > 0", FIELDS)
    ts = apply_trigger_write(ts, "stacktrace", FIELDS)
    ts = apply_trigger_write(ts, "hist:keys=len", FIELDS)
    ts = apply_trigger_write(ts, "hist:keys=name if len > 1", FIELDS)
    with pytest.raises(FilterSyntaxError) as info:  # matching ignores the filter
        apply_trigger_write(ts, "hist:keys=len if len > 1", FIELDS)
    assert info.value.message == "Hist trigger already exists"
    ts = apply_trigger_write(ts, "hist:keys=len:vals=ret if len > 1", FIELDS)
    assert render_trigger_file(ts) == (
        "stacktrace:unlimited\n"
        "traceoff:count=2 if ret > 0\n"
        "hist:keys=len:vals=hitcount:sort=hitcount:size=2048 [active]\n"
        "hist:keys=name:vals=hitcount:sort=hitcount:size=2048 if len > 1 [active]\n"
        "hist:keys=len:vals=hitcount,ret:sort=hitcount:size=2048 if len > 1 [active]\n"
    )
    # one traceon/traceoff per event (one trigger type), one stacktrace
    for dup in ("traceon", "traceoff:5", "stacktrace:1"):
        with pytest.raises(FilterSyntaxError) as info:
            apply_trigger_write(ts, dup, FIELDS)
        assert info.value.message == "Trigger already exists"
    with pytest.raises(FilterSyntaxError) as info:
        apply_trigger_write(ts, "hist:keys=len:size=4096", FIELDS)
    assert (info.value.message, info.value.location) == ("Hist trigger already exists", "hist")
    # removal: by type, count and filter ignored (kernel); hist by full match
    after = apply_trigger_write(ts, "!traceon", FIELDS)
    assert [t.text for t in after][:1] == ["stacktrace:unlimited"] and len(after) == 4
    assert apply_trigger_write(after, "!hist:keys=len:vals=ret", FIELDS) == after  # filter
    after = apply_trigger_write(after, "!hist:keys=len:vals=ret if len > 1", FIELDS)
    assert [t.text.split(" [")[0] for t in after if isinstance(t, HistTrigger)] == [
        "hist:keys=len:vals=hitcount:sort=hitcount:size=2048",
        "hist:keys=name:vals=hitcount:sort=hitcount:size=2048 if len > 1",
    ]
    assert apply_trigger_write(after, "!traceoff", FIELDS) == after  # absent: not an error
    assert len(ts) == 5  # the input list is never modified
    assert render_trigger_file([]) == (
        "# Available triggers:\n# traceon traceoff stacktrace hist\n")


def test_hist_pause_cont_clear_through_writes():
    ts = apply_trigger_write([], "hist:keys=len", FIELDS)
    h = ts[0]
    h.fire({"len": 1})
    assert apply_trigger_write(ts, "hist:keys=len:pause", FIELDS) == ts
    assert h.paused and h.text.endswith(" [paused]")
    h.fire({"len": 1})
    assert h.hits == 1
    apply_trigger_write(ts, "hist:keys=len:cont", FIELDS)
    h.fire({"len": 1})
    assert h.hits == 2 and h.text.endswith(" [active]")
    apply_trigger_write(ts, "hist:keys=len:clear", FIELDS)
    assert (h.hits, h.entries) == (0, 0)
    with pytest.raises(FilterSyntaxError) as info:
        apply_trigger_write(ts, "hist:keys=name:clear", FIELDS, event="kprobes:p_loads")
    assert (info.value.message, info.value.location) == (
        "Can't clear or continue a nonexistent hist trigger", "hist:kprobes:p_loads")
    paused = apply_trigger_write([], "hist:keys=len:pause", FIELDS)[0]
    assert paused.paused


def test_named_hist_triggers_share_a_table():
    named: dict = {}
    a = apply_trigger_write([], "hist:name=foo:keys=len", FIELDS, named=named)[0]
    b = apply_trigger_write([], "hist:name=foo:keys=len if len > 2", FIELDS, named=named)[0]
    a.fire({"len": 1})
    b.fire({"len": 1})
    b.fire({"len": 3})
    assert a.hits == b.hits == 2 and a.rows() == b.rows()
    assert a.text.startswith("hist:name=foo:keys=len:")
    with pytest.raises(FilterSyntaxError) as info:
        apply_trigger_write([], "hist:name=foo:keys=name", FIELDS, named=named)
    assert info.value.message.startswith("Named hist trigger doesn't match")
