"""The ftrace event-filter language, compiled once into a fast predicate over event records.

Grammar (the kernel's ``trace_events_filter.c``)::

    filter    := or
    or        := and ( '||' and )*
    and       := unary ( '&&' unary )*          # '&&' binds tighter than '||'
    unary     := '!' unary | '(' or ')' | predicate
    predicate := FIELD OP VALUE

``FIELD`` is ``[A-Za-z0-9_]+``: one of the event's fields, or a common field (``common_pid``,
the thread id; ``comm`` and its alias ``COMM``, the thread name). ``OP`` and ``VALUE`` depend on
the field's type, as in the kernel:

- numeric fields (``u64``, ``s64``, ``bool``; ``f64`` below): ``==  !=  <  <=  >  >=  &``, with
  an integer value written as the kernel's ``kstrtoll``/``kstrtoull`` read it (decimal,
  ``0x`` hex, leading-``0`` octal, ``-`` only for signed fields, within 64 bits). ``&`` is a bit
  test: true when ``field & value`` is non-zero.
- ``f64`` fields (a Python addition, the kernel has no floats): ``==  !=  <  <=  >  >=`` with an
  integer or a decimal/exponent literal (``1.5``, ``-2e-3``).
- string fields (``str``): ``==  !=  ~`` with a value in double or single quotes (no escapes,
  as in the kernel). ``~`` is a glob: ``*``, ``?``, ``[a-z]``/``[!a-z]`` classes and ``\\``
  escapes (the kernel's ``glob_match``); a pattern starting with ``!`` negates the match.
  Unquoted words are rejected ("Invalid value (did you forget quotes)?"), like current kernels.

Values records and faults
-------------------------
``EventFilter.match(values)`` takes a ``Mapping[str, Any]`` from field name to Python value
(``comm``/``common_pid`` under those names; ``COMM`` reads ``values["comm"]``). A predicate whose
field value is *not of the field's Python type* -- ``int`` (``bool`` included) for
``u64``/``s64``/``bool``, ``int`` or ``float`` for ``f64``, ``str`` for ``str`` -- is false,
whatever the operator (``!=`` included), exactly as the kernel treats a string it could not
fetch. So a fetch fault needs no special protocol: any marker object (a singleton, an exception
instance, ``None``), or a missing key, never matches. Callers whose fault marker *is* an
``int``/``str`` subclass pass ``is_fault=`` to ``compile_filter``. ``!`` still inverts a
predicate's result (kernel semantics): ``!(len == 3)`` is true for a faulted ``len``.

Errors raise ``FilterSyntaxError`` (a ``ValueError``) whose ``str()`` is the kernel's
``error_log`` entry: ``LOCATION: error: MESSAGE``, ``  Command: TEXT`` and a caret under the
0-based position of the offending character.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rethook.limits import S64_MAX, S64_MIN, U64_MAX, parse_digits, range_text

__all__ = [
    "COMMON_FIELDS",
    "EventFilter",
    "FilterSyntaxError",
    "compile_filter",
    "glob_matcher",
    "kstrtoll",
    "kstrtoull",
    "normalize_type",
    "resolve_field",
]

MAX_FILTER_STR_VAL = 256  # the kernel's limit on a string operand (and on a hist string key)
_NUM_BUF = 24  # the kernel's num_buf: a numeric operand of 24+ characters is "too long"
_MAX_NESTING = 50  # parentheses/"!" nesting: keeps the generated code inside CPython's limits

# Messages, as the kernel words them (trace_events_filter.c err_text[]).
E_INVALID_OP = "Invalid operator"
E_TOO_MANY_OPEN = "Too many '('"
E_TOO_MANY_CLOSE = "Too few '('"
E_MISSING_QUOTE = "Missing matching quote"
E_OPERAND_TOO_LONG = "Operand too long"
E_EXPECT_STRING = "Expecting string field"
E_EXPECT_DIGIT = "Expecting numeric field"
E_ILLEGAL_FIELD_OP = "Illegal operation for field type"
E_FIELD_NOT_FOUND = "Field not found"
E_ILLEGAL_INTVAL = "Illegal integer value"
E_TOO_MANY_PREDS = "Too many terms in predicate expression"
E_INVALID_VALUE = "Invalid value (did you forget quotes)?"
E_NO_FILTER = "No filter found"
# Older kernels' wording for a predicate with no field name (current kernels print "Error: (-1)").
E_MISSING_FIELD = "Missing field name and/or value"
# Python additions (the kernel has no floats, and no nesting limit short of its stack).
E_ILLEGAL_FLOAT = "Illegal floating point value"
E_TOO_DEEP = "Parentheses nested too deeply"

FILTER_ERROR_LOCATION = "event filter parse error"
_CMD_PREFIX = "  Command: "


class FilterSyntaxError(ValueError):
    """A filter, trigger or hist command the kernel would reject.

    ``message`` is the kernel's error text, ``text`` the command as written, ``position`` the
    0-based index of the offending character in ``text`` and ``location`` the error_log
    location (``event filter parse error``, ``hist:GRP:EVENT``, ``trigger``).
    ``str()`` renders the error_log entry without its timestamp::

        event filter parse error: error: Field not found
          Command: ret > 0 && nme == "x"
                             ^
    """

    def __init__(self, message: str, text: str, position: int,
                 location: str = FILTER_ERROR_LOCATION) -> None:
        super().__init__(message)
        self.message = message
        self.text = text
        self.position = max(0, min(int(position), len(text)))
        self.location = location

    def _line(self) -> str:
        # One column per character: tabs and newlines would move the caret.
        return self.text.replace("\t", " ").replace("\n", " ").replace("\r", " ")

    def error_log(self, timestamp: float | None = None) -> str:
        """The entry as the ``error_log`` file shows it (``[ secs.usecs] `` when given a time)."""
        head = f"{self.location}: error: {self.message}"
        if timestamp is not None:
            usecs = int(round(timestamp * 1_000_000))
            head = f"[{usecs // 1_000_000:5d}.{usecs % 1_000_000:06d}] {head}"
        return f"{head}\n{_CMD_PREFIX}{self._line()}\n{' ' * (len(_CMD_PREFIX) + self.position)}^\n"

    def filter_file_text(self) -> str:
        """What the event's ``filter`` file reads after this error (the kernel keeps the text)."""
        return f"{self._line()}\n{' ' * self.position}^\nparse_error: {self.message}\n"

    def shifted(self, text: str, offset: int, location: str | None = None) -> FilterSyntaxError:
        """The same error re-based into a longer command (a filter inside a trigger)."""
        return FilterSyntaxError(self.message, text, self.position + offset,
                                 self.location if location is None else location)

    def __str__(self) -> str:
        return self.error_log().rstrip("\n")

    def __reduce__(self):  # picklable despite the custom __init__
        return (FilterSyntaxError, (self.message, self.text, self.position, self.location))


# ---------------------------------------------------------------------------------------------
# Field types

_TYPE_ALIASES: dict[str, str] = {
    "u64": "u64", "u32": "u64", "u16": "u64", "u8": "u64",
    "x64": "u64", "x32": "u64", "x16": "u64", "x8": "u64", "len": "u64",
    "s64": "s64", "s32": "s64", "s16": "s64", "s8": "s64", "int": "s64",
    "f64": "f64", "float": "f64",
    "str": "str", "string": "str", "symbol": "str", "repr": "str", "type": "str",
    "bool": "bool",
}

#: Fields every event has besides its own (the kernel's common/generic fields that map here).
COMMON_FIELDS: Mapping[str, str] = {"common_pid": "s64", "comm": "str"}
_ALIASES = {"COMM": "comm"}  # generic-field alias, read from the same record key

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "u64": (int,), "s64": (int,), "bool": (int,), "f64": (int, float), "str": (str,),
}


def normalize_type(type_name: str) -> str:
    """Map a field type to one of ``u64 s64 f64 str bool`` (``u8``..``x64``, ``string``... too)."""
    try:
        return _TYPE_ALIASES[type_name]
    except KeyError:
        raise ValueError(f"unknown event field type {type_name!r}") from None


def resolve_field(name: str, fields: Mapping[str, str]) -> tuple[str, str] | None:
    """``(record key, normalized type)`` of a field name, or None. Event fields come first."""
    if name in fields:
        return name, normalize_type(fields[name])
    key = _ALIASES.get(name, name)
    if key in COMMON_FIELDS:
        return key, COMMON_FIELDS[key]
    return None


def python_types(kind: str) -> tuple[type, ...]:
    """The Python types a value of a normalized field type may have (anything else: a fault)."""
    return _PY_TYPES[kind]


# ---------------------------------------------------------------------------------------------
# Kernel number parsing (kstrtoull / kstrtoll with base 0)

_HEX = frozenset("0123456789abcdefABCDEF")


def _kstrtoull_nosign(s: str) -> int | None:
    if not s:
        return None
    if s[0] == "0" and len(s) > 2 and s[1] in "xX" and s[2] in _HEX:
        return parse_digits(s[2:], 16, U64_MAX)
    return parse_digits(s, 8 if s[0] == "0" else 10, U64_MAX)


def kstrtoull(s: str) -> int | None:
    """The kernel's ``kstrtoull(s, 0)``: an optional ``+``, then hex/octal/decimal; else None."""
    return _kstrtoull_nosign(s[1:] if s.startswith("+") else s)


def kstrtoll(s: str) -> int | None:
    """The kernel's ``kstrtoll(s, 0)``: like ``kstrtoull`` plus a leading ``-``; s64 range."""
    if s.startswith("-"):
        v = _kstrtoull_nosign(s[1:])
        return -v if v is not None and v <= -S64_MIN else None
    v = kstrtoull(s)
    return v if v is not None and v <= S64_MAX else None


#: What kstrtoll would read as a number, whatever its size.
_NUMBER = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_FLOAT_RE = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


# ---------------------------------------------------------------------------------------------
# Globs (lib/glob.c semantics, with filter_parse_regex's fast cases and leading '!')

def _glob_class(pat: str, i: int) -> tuple[str, int] | None:
    """Regex for a class starting after '[' at ``i``; None when malformed (then '[' is literal)."""
    n = len(pat)
    inverted = i < n and pat[i] == "!"
    j = i + inverted
    if j >= n:
        return None
    spans: list[str] = []
    a = pat[j]
    j += 1
    while True:
        b = a
        if j + 1 < n and pat[j] == "-" and pat[j + 1] != "]":
            b = pat[j + 1]
            j += 2
        elif j + 1 >= n and j < n and pat[j] == "-":
            return None  # "[a-" runs off the end: malformed
        if a <= b:
            spans.append(re.escape(a) if a == b else f"{re.escape(a)}-{re.escape(b)}")
        if j >= n:
            return None  # no closing ']'
        a = pat[j]
        j += 1
        if a == "]":
            break
    if not spans:
        return ("(?s:.)" if inverted else "(?!)"), j
    return f"[{'^' if inverted else ''}{''.join(spans)}]", j


def _glob_regex(pat: str) -> str:
    out: list[str] = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        i += 1
        if c == "*":
            out.append("(?s:.*)")
        elif c == "?":
            out.append("(?s:.)")
        elif c == "[":
            cls = _glob_class(pat, i)
            if cls is None:
                out.append(re.escape("["))
            else:
                out.append(cls[0])
                i = cls[1]
        elif c == "\\" and i < n:
            out.append(re.escape(pat[i]))
            i += 1
        else:
            out.append(re.escape(c))
    return "".join(out)


def glob_matcher(pattern: str) -> Callable[[str], bool]:
    """A ``str -> bool`` full-string matcher for a kernel glob (no leading-``!`` handling)."""
    body = pattern
    if not any(c in body for c in "?[\\"):
        inner = body.strip("*")
        if "*" not in inner:
            front, back = body.startswith("*"), body.endswith("*") and len(body) > 1
            if not front and not back:
                return inner.__eq__
            if front and back:
                return lambda s: inner in s
            if back:
                return lambda s: s.startswith(inner)
            return lambda s: s.endswith(inner)
    rx = re.compile(_glob_regex(body))
    return lambda s: rx.fullmatch(s) is not None


# ---------------------------------------------------------------------------------------------
# Syntax tree

@dataclass(frozen=True, slots=True)
class Pred:
    """``field op value``: ``key`` is the record key, ``kind`` the normalized field type."""

    field: str
    key: str
    kind: str
    op: str
    value: Any
    position: int


@dataclass(frozen=True, slots=True)
class Not:
    child: Node


@dataclass(frozen=True, slots=True)
class And:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    items: tuple[Node, ...]


Node = Pred | Not | And | Or


def _walk(node: Node) -> Iterator[Pred]:
    if isinstance(node, Pred):
        yield node
    elif isinstance(node, Not):
        yield from _walk(node.child)
    else:
        for item in node.items:
            yield from _walk(item)


# ---------------------------------------------------------------------------------------------
# Parsing

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_OPS = ("~", "!=", "==", "<=", "<", ">=", ">", "&")  # kernel order: '<=' before '<'
_STRING_OPS = frozenset({"==", "!=", "~"})


def _check_structure(text: str) -> None:
    """The kernel's calc_stack pass: quotes and parentheses, before anything else is parsed."""
    quote = ""
    last_quote = 0
    opens: list[int] = []
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = ""
            continue
        if c in "'\"":
            quote, last_quote = c, i
        elif c == "(":
            opens.append(i)
        elif c == ")":
            if not opens:
                raise FilterSyntaxError(E_TOO_MANY_CLOSE, text, i)
            opens.pop()
    if quote:
        raise FilterSyntaxError(E_MISSING_QUOTE, text, last_quote)
    if opens:
        raise FilterSyntaxError(E_TOO_MANY_OPEN, text, opens[-1])


class _Parser:
    def __init__(self, text: str, fields: Mapping[str, str]) -> None:
        self.text = text
        self.n = len(text)
        self.i = 0
        self.fields = fields
        self.depth = 0

    def error(self, message: str, pos: int) -> FilterSyntaxError:
        return FilterSyntaxError(message, self.text, pos)

    def skip_ws(self) -> None:
        t, i, n = self.text, self.i, self.n
        while i < n and t[i].isspace():
            i += 1
        self.i = i

    def peek2(self) -> str:
        return self.text[self.i:self.i + 2]

    def parse(self) -> Node:
        self.skip_ws()
        if self.i >= self.n:
            raise self.error(E_NO_FILTER, self.i)
        node = self.parse_or()
        self.skip_ws()
        if self.i < self.n:
            # ')' without '(' was caught by the structure pass: anything left is junk.
            raise self.error(E_TOO_MANY_PREDS, self.i)
        return node

    def parse_or(self) -> Node:
        items = [self.parse_and()]
        while True:
            self.skip_ws()
            if self.peek2() != "||":
                break
            self.i += 2
            items.append(self.parse_and())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def parse_and(self) -> Node:
        items = [self.parse_unary()]
        while True:
            self.skip_ws()
            if self.peek2() != "&&":
                break
            self.i += 2
            items.append(self.parse_unary())
        return items[0] if len(items) == 1 else And(tuple(items))

    def after_term(self) -> None:
        """After a predicate or a group only ')', '&&', '||' or the end may follow."""
        self.skip_ws()
        i, t = self.i, self.text
        if i >= self.n or t[i] == ")" or t[i:i + 2] in ("&&", "||"):
            return
        raise self.error(E_TOO_MANY_PREDS, i)

    def parse_unary(self) -> Node:
        self.skip_ws()
        t, i = self.text, self.i
        if i < self.n and t[i] == "!" and t[i + 1:i + 2] not in ("=", "~"):
            self.i += 1
            self.enter(i)
            node: Node = Not(self.parse_unary())
            self.depth -= 1
            return node
        if i < self.n and t[i] == "(":
            self.i += 1
            self.enter(i)
            node = self.parse_or()
            self.skip_ws()
            if self.i >= self.n or t[self.i] != ")":
                raise self.error(E_TOO_MANY_PREDS, self.i)
            self.i += 1
            self.depth -= 1
            self.after_term()
            return node
        node = self.parse_pred()
        self.after_term()
        return node

    def enter(self, pos: int) -> None:
        self.depth += 1
        if self.depth > _MAX_NESTING:
            raise self.error(E_TOO_DEEP, pos)

    def parse_pred(self) -> Pred:
        t, n = self.text, self.n
        start = i = self.i
        while i < n and t[i] in _NAME_CHARS:
            i += 1
        if i == start:
            raise self.error(E_MISSING_FIELD, start)
        name = t[start:i]
        resolved = resolve_field(name, self.fields)
        if resolved is None:
            raise self.error(E_FIELD_NOT_FOUND, start)
        key, kind = resolved
        while i < n and t[i].isspace():
            i += 1
        for op in _OPS:
            if t.startswith(op, i):
                break
        else:
            raise self.error(E_INVALID_OP, i)
        i += len(op)
        while i < n and t[i].isspace():
            i += 1
        vpos = i
        c = t[i] if i < n else ""
        value: Any
        if c in ("'", '"') and c:
            if op not in _STRING_OPS:
                raise self.error(E_ILLEGAL_FIELD_OP, vpos)
            if kind != "str":
                raise self.error(E_EXPECT_DIGIT, vpos)
            end = t.find(c, i + 1)
            if end < 0:
                raise self.error(E_MISSING_QUOTE, vpos)
            value = t[i + 1:end]
            if len(value) >= MAX_FILTER_STR_VAL:
                raise self.error(E_OPERAND_TOO_LONG, vpos)
            i = end + 1
        elif c and (c.isdigit() or c == "-" or (kind == "f64" and c == ".")):
            if kind == "str":
                raise self.error(E_EXPECT_STRING, vpos)
            if op == "~" or (op == "&" and kind == "f64"):
                raise self.error(E_ILLEGAL_FIELD_OP, vpos)
            value, i = self.number(kind, i, vpos)
        else:
            raise self.error(E_INVALID_VALUE, vpos)
        self.i = i
        return Pred(name, key, kind, op, value, start)

    def number(self, kind: str, i: int, vpos: int) -> tuple[int | float, int]:
        t, n = self.text, self.n
        j = i + 1 if t[i] == "-" else i
        while j < n and t[j].isalnum():
            j += 1
        if kind == "f64":
            m = _FLOAT_RE.match(t, i)
            if m is not None and m.end() > j:
                j = m.end()
                while j < n and t[j].isalnum():
                    j += 1
        token = t[i:j]
        if len(token) >= _NUM_BUF:
            raise self.error(E_OPERAND_TOO_LONG, vpos)
        if kind == "f64":
            if j < n and t[j] == ".":
                raise self.error(E_ILLEGAL_FLOAT, vpos)
            as_int = kstrtoll(token)
            if as_int is not None:
                return as_int, j
            if _FLOAT_RE.fullmatch(token):
                return float(token), j
            raise self.error(E_ILLEGAL_FLOAT, vpos)
        if j < n and t[j] == "." and j + 1 < n and t[j + 1].isdigit():
            raise self.error(E_ILLEGAL_INTVAL, vpos)  # a float for an integer field
        value = kstrtoll(token) if kind == "s64" else kstrtoull(token)
        if value is None:
            if _NUMBER.fullmatch(token):  # a number, out of the field's range: say the range
                lo, hi = (S64_MIN, S64_MAX) if kind == "s64" else (0, U64_MAX)
                raise self.error(f"{E_ILLEGAL_INTVAL} ({range_text(lo, hi)})", vpos)
            raise self.error(E_ILLEGAL_INTVAL, vpos)
        return value, j


def parse_filter(text: str, fields: Mapping[str, str]) -> Node:
    """The syntax tree of a filter (raises ``FilterSyntaxError``)."""
    _check_structure(text)
    return _Parser(text, fields).parse()


# ---------------------------------------------------------------------------------------------
# Compilation: one generated function per filter, predicates inlined, constants bound once.

_PY_OPS = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


class _Codegen:
    def __init__(self, is_fault: Callable[[Any], bool] | None) -> None:
        self.ns: dict[str, Any] = {"__builtins__": {}, "_isinstance": isinstance}
        self.n = 0
        if is_fault is not None:
            self.ns["_fault"] = is_fault
        self.with_fault = is_fault is not None

    def const(self, value: Any) -> str:
        name = f"_c{self.n}"
        self.n += 1
        self.ns[name] = value
        return name

    def expr(self, node: Node) -> str:
        if isinstance(node, Pred):
            return self.pred(node)
        if isinstance(node, Not):
            return f"(not {self.expr(node.child)})"
        joiner = " and " if isinstance(node, And) else " or "
        return "(" + joiner.join(self.expr(item) for item in node.items) + ")"

    def pred(self, p: Pred) -> str:
        types = self.const(_PY_TYPES[p.kind])
        fetch = f"_isinstance(_x := _g({p.key!r}), {types})"
        if self.with_fault:
            fetch = f"not _fault(_x := _g({p.key!r})) and _isinstance(_x, {types})"
        if p.op == "~":
            pattern, negate = p.value, False
            if pattern.startswith("!"):
                pattern, negate = pattern[1:], True
            m = self.const(glob_matcher(pattern))
            test = f"{'not ' if negate else ''}{m}(_x)"
        elif p.op == "&":
            test = f"_x & {self.const(p.value)} != 0"
        else:
            test = f"_x {_PY_OPS[p.op]} {self.const(p.value)}"
        return f"({fetch} and {test})"


def _compile(node: Node, is_fault: Callable[[Any], bool] | None) -> Callable[[Mapping], bool]:
    gen = _Codegen(is_fault)
    body = gen.expr(node)
    src = f"def _match(_v):\n    _g = _v.get\n    return {body}\n"
    exec(compile(src, "<event filter>", "exec"), gen.ns)  # noqa: S102 - generated, no user code
    return gen.ns["_match"]


class EventFilter:
    """A compiled event filter: ``match(values) -> bool`` (also callable), ``text`` as written.

    ``fields_used`` names the record keys the filter reads, so a caller can skip fetching
    the rest (``comm``, say) when no filter needs them.
    """

    __slots__ = ("text", "match", "tree", "fields_used", "__weakref__")

    def __init__(self, text: str, tree: Node,
                 match: Callable[[Mapping[str, Any]], bool]) -> None:
        self.text = text
        self.tree = tree
        self.match = match
        self.fields_used = frozenset(p.key for p in _walk(tree))

    def __call__(self, values: Mapping[str, Any]) -> bool:
        return self.match(values)

    def __repr__(self) -> str:
        return f"EventFilter({self.text!r})"


def compile_filter(text: str, fields: Mapping[str, str], *,
                   is_fault: Callable[[Any], bool] | None = None) -> EventFilter:
    """Compile ``text`` for an event with ``fields`` (name -> ``u64``/``s64``/``f64``/``str``/
    ``bool``). Trailing whitespace is dropped (the kernel strips it); positions in errors index
    the text that remains. Clearing a filter (the kernel's ``echo 0 > filter``) is the caller's
    business: ``"0"`` is not a filter here.
    """
    text = text.rstrip()
    tree = parse_filter(text, fields)
    return EventFilter(text, tree, _compile(tree, is_fault))
