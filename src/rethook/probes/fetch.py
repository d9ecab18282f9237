"""Fetch arguments of dynamic probe events: ``[NAME=]FETCHARG[:TYPE]``.

This module parses one fetch argument into a :class:`FetchArg`, compiles it into a
:class:`Fetch` (or a whole argument list into a :class:`FetchPlan`) that extracts the value on
a probe hit, and renders values the way the kernel prints probe event fields. It is pure: no
engine, no trace buffer. ``docs/probe-definitions.md`` is the user's reference.

FETCHARG (Python counterparts of the kernel's forms)::

    $argN          N-th parameter of the probed function (1-based, signature order)
    NAME           the parameter (or any local bound at entry: closure cells) called NAME
    $retval        the return value (return probes only)
    $duration      wall time of the call in ns (return probes only)
    $comm          the thread's name
    $stackN        the N-th caller's function name ($stack0 is the direct caller)
    $stack         every caller's name, innermost first ($stack0, $stack1, ...)
    @MOD.NAME      a module global (the module must already be imported)
    \\123 \\"text"   immediates: an integer, a string

each followed by any chain of ``.attr``, ``->attr`` (a synonym), ``[int]``, ``["key"]`` or
``['key']``.

Each argument list compiles (:func:`compile_plan`) into plain generated functions, once per
definition. On a hit the engine calls ``plan.at_entry(frame)`` in the entry handler (it takes
the parameters the arguments start from, nothing else) and ``plan.values(ctx)`` when the event
is recorded (at entry for entry probes, at return for return probes): a return probe
therefore sees the parameters *as passed*, and follows the access chain on them at return, as
the kernel dereferences entry arguments at return. A fetch that fails (missing attribute, key
or index, a value that does not fit the TYPE) gives :data:`FAULT` and is counted in
``Fetch.faults``; it never raises into the program.
Values are converted when fetched (ints, bounded strings, bools), so the trace never keeps
a reference to the program's objects.
"""

from __future__ import annotations

import ast
import keyword
import operator
import re
import reprlib
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

from rethook.engine import clock
from rethook.limits import IMMEDIATE, parse_digits, range_text

__all__ = [
    "DEFAULT_TYPE",
    "FAULT",
    "MAX_ARG_NAME_LEN",
    "MAX_FETCH_ARGS",
    "MAX_STACK_DEPTH",
    "MAX_STRING_LEN",
    "TYPES",
    "Fetch",
    "FetchArg",
    "FetchContext",
    "FetchPlan",
    "ProbeSyntaxError",
    "Raised",
    "compile_fetch",
    "compile_plan",
    "default_type",
    "field_type",
    "format_args",
    "format_value",
    "is_marked",
    "param_names",
    "parse_fetch_arg",
]

#: At most this many fetch arguments per event (the kernel's ``MAX_TRACE_ARGS``).
MAX_FETCH_ARGS = 128
#: Highest ``$argN`` (the kernel's).
MAX_ARG_NUM = 65535
#: Longest argument name (the kernel's ``MAX_ARG_NAME_LEN``).
MAX_ARG_NAME_LEN = 32
#: Longest access chain (the kernel allows 16 fetch instructions per argument).
MAX_STEPS = 16
#: ``string`` and ``repr`` values are cut to this many characters (then end with ``...``).
MAX_STRING_LEN = 256
#: ``$stack`` holds at most this many callers; ``$stackN`` takes N below it.
MAX_STACK_DEPTH = 128
#: The type of an argument written without ``:TYPE`` (see :func:`default_type`).
DEFAULT_TYPE = "repr"

# The kernel's reserved field names: an argument may not be called any of these.
RESERVED_NAMES = frozenset({
    "common_type", "common_flags", "common_preempt_count", "common_pid", "common_tgid",
    "__probe_ip", "__probe_ret_ip", "__probe_func",
})


# --- errors --------------------------------------------------------------------------------------
class ProbeSyntaxError(ValueError):
    """A rejected definition, fetch argument or type, rendered like a kernel ``error_log`` entry::

        [  123.456789] trace_kprobe: error: Invalid $-variable specified
          Command: p:myprobe mod.f x=$argX
                                     ^

    ``command`` is the command as echoed (its words joined by single spaces, as the kernel
    rebuilds it), ``position`` the 0-based column of the mistake in it (it may be one past the
    end, when something is missing), ``location`` the subsystem (``trace_kprobe``,
    ``trace_fprobe``, ``dynamic_events``), ``timestamp_ns`` when it was raised
    (``rethook.engine.clock.now_ns``, the trace clock).
    """

    def __init__(self, message: str, text: str, position: int, *,
                 location: str = "dynamic_events", timestamp_ns: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.text = text
        self.position = position
        self.location = location
        self.timestamp_ns = clock.now_ns() if timestamp_ns is None else timestamp_ns

    @property
    def command(self) -> str:
        return self.text

    def log_entry(self, timestamp_ns: int | None = None) -> str:
        """The three ``error_log`` lines (``timestamp_ns`` overrides the time shown)."""
        ts = self.timestamp_ns if timestamp_ns is None else timestamp_ns
        sec, ns = divmod(max(0, ts), 1_000_000_000)
        prefix = "  Command: "
        return (f"[{sec:5d}.{ns // 1000:06d}] {self.location}: error: {self.message}\n"
                f"{prefix}{self.text}\n{' ' * (len(prefix) + self.position)}^")

    def __str__(self) -> str:
        return self.log_entry()


class _ArgError(Exception):
    """Raised inside the argument parser with a position relative to the argument."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.message = message
        self.position = position


# Messages: the kernel's wording where the kernel has the error (trace_probe.h), else ours.
E_NO_ARG_NAME = "Argument name is not specified"
E_ARG_NAME_TOO_LONG = "Argument name is too long"
E_BAD_ARG_NAME = "Argument name must follow the same rules as C identifiers"
E_USED_ARG_NAME = "This argument name is already used"
E_NO_ARG_BODY = "No argument expression"
E_RETVAL_ON_PROBE = "$retval is not available on probe"
E_DURATION_ON_PROBE = "$duration is not available on probe"
E_BAD_STACK_NUM = "Invalid stack number"
E_BAD_ARG_NUM = "Invalid argument number"
E_BAD_VAR = "Invalid $-variable specified"
E_BAD_IMM = "Invalid immediate value"
E_IMMSTR_NO_CLOSE = "String is not closed with '\"'"
E_STR_NO_CLOSE = "String is not closed with its quote"
E_BAD_FETCH_ARG = "Invalid fetch argument"
E_BAD_TYPE = "Unknown type is specified"
E_NEED_STRING_TYPE = "$comm and immediate-string only accepts string type"
E_TOO_MANY_OPS = "Dereference is too much nested"
E_BAD_HYPHEN = "Failed to parse single hyphen. Forgot '>'?"
E_NO_FIELD = "Field name is not specified"
E_BAD_FIELD = "Field name must follow the same rules as Python identifiers"
E_NO_KEY = "Subscript is empty"
E_BAD_KEY = "Subscript must be an integer or a quoted string"
E_KEY_NO_CLOSE = "Subscript is not closed with ']'"
E_BAD_GLOBAL = "Global variable must be written @MODULE.NAME"


# --- markers -------------------------------------------------------------------------------------
class _Fault:
    """The value of a fetch that failed (the kernel prints ``(fault)``)."""

    __slots__ = ()
    _instance: _Fault | None = None

    def __new__(cls) -> _Fault:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "(fault)"

    __str__ = __repr__

    def __reduce__(self) -> str:
        return "FAULT"


#: The marked value of a failed fetch. Printed ``(fault)``; a singleton (test with ``is``).
FAULT = _Fault()


@dataclass(frozen=True, slots=True)
class Raised:
    """``$retval`` of a call that raised: the exception's type name and (bounded) message.

    Not a fault (nothing failed to fetch); printed ``(raised TYPE: message)``."""

    type_name: str
    message: str = ""

    @classmethod
    def of(cls, exc: BaseException) -> Raised:
        try:
            msg = str(exc)
        except Exception:
            msg = ""
        if len(msg) > MAX_STRING_LEN:
            msg = msg[:MAX_STRING_LEN - 3] + "..."
        return cls(type(exc).__qualname__, msg)

    def __str__(self) -> str:
        return f"(raised {self.type_name}: {self.message})" if self.message else \
            f"(raised {self.type_name})"


def is_marked(value: Any) -> bool:
    """True for :data:`FAULT` and :class:`Raised`: values that are not of the field's type."""
    return value is FAULT or type(value) is Raised


# --- types ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _TypeSpec:
    name: str
    kind: str          # 'u', 's', 'x', 'string', 'symbol', 'repr', 'len', 'type', 'bool'
    bits: int = 0
    field: str = "str"  # trace-buffer field type


def _int_types() -> dict[str, _TypeSpec]:
    out = {}
    for bits in (8, 16, 32, 64):
        out[f"u{bits}"] = _TypeSpec(f"u{bits}", "u", bits, "u64")
        out[f"s{bits}"] = _TypeSpec(f"s{bits}", "s", bits, "s64")
        out[f"x{bits}"] = _TypeSpec(f"x{bits}", "x", bits, "u64")
    return out


#: Every TYPE a fetch argument may name.
TYPES: dict[str, _TypeSpec] = {
    **_int_types(),
    "string": _TypeSpec("string", "string"),
    "symbol": _TypeSpec("symbol", "symbol"),
    "repr": _TypeSpec("repr", "repr"),
    "len": _TypeSpec("len", "len", 0, "u64"),
    "type": _TypeSpec("type", "type"),
    "bool": _TypeSpec("bool", "bool", 0, "bool"),
}

# Types allowed on a bare $comm or string immediate (they hold a str, nothing else fits).
_STRING_SOURCE_TYPES = frozenset({"string", "repr", "len", "type", "bool"})


def field_type(type_name: str) -> str:
    """The trace-buffer field type of a TYPE: ``u64``, ``s64``, ``str`` or ``bool``.

    u/x types and ``len`` are ``u64``, s types ``s64``, ``bool`` is ``bool``, the rest ``str``.
    A field may still hold :data:`FAULT` or a :class:`Raised` marker (see :func:`is_marked`).
    """
    try:
        return TYPES[type_name].field
    except KeyError:
        raise ValueError(f"unknown fetch type {type_name!r}") from None


# --- the argument ------------------------------------------------------------------------------
#: One access step: (True, "attr") for ``.attr``/``->attr``, (False, key) for ``[key]``.
Step = tuple[bool, Any]


@dataclass(frozen=True, slots=True)
class FetchArg:
    """One parsed fetch argument.

    ``source`` is what it starts from and ``param`` the detail:

    ============  ======================================================
    ``arg``       ``$argN``: param = N (1-based)
    ``param``     a parameter name: param = the name
    ``retval``    ``$retval``
    ``duration``  ``$duration``
    ``comm``      ``$comm``
    ``stack``     ``$stack``
    ``stackN``    ``$stackN``: param = N
    ``global``    ``@MOD.NAME``: param = the dotted path split on dots
    ``imm``       ``\\123`` / ``\\"text"``: param = the int or str
    ============  ======================================================

    ``steps`` is the access chain, ``expr`` the FETCHARG as written (without ``NAME=`` and
    ``:TYPE``), ``type`` the TYPE as written or None (then :attr:`effective_type` is
    :func:`default_type`). ``position`` is the column of the argument in its command.
    """

    name: str
    expr: str
    type: str | None
    source: str
    param: Any = None
    steps: tuple[Step, ...] = ()
    position: int = field(default=0, compare=False)

    @property
    def effective_type(self) -> str:
        return self.type if self.type is not None else default_type(self)

    @property
    def text(self) -> str:
        """The argument as ``dynamic_events`` shows it: ``NAME=FETCHARG[:TYPE]``."""
        return f"{self.name}={self.expr}" + (f":{self.type}" if self.type is not None else "")

    @property
    def needs_entry(self) -> bool:
        """Its value comes from the parameters, taken at entry."""
        return self.source in ("arg", "param")

    @property
    def needs_stack(self) -> bool:
        return self.source in ("stack", "stackN")


def default_type(arg: FetchArg) -> str:
    """The type of an argument written without ``:TYPE``.

    ``repr``, except for values whose kind is fixed: a bare ``$comm`` or string immediate is a
    ``string`` (as in the kernel), a bare ``$stackN`` a ``symbol``, ``$duration`` a ``u64``
    and an integer immediate an ``s64``. An access chain makes it ``repr`` again.
    """
    if arg.steps:
        return DEFAULT_TYPE
    src = arg.source
    if src == "comm":
        return "string"
    if src == "imm":
        return "string" if isinstance(arg.param, str) else "s64"
    if src == "stackN":
        return "symbol"
    if src == "duration":
        return "u64"
    return DEFAULT_TYPE


def _is_good_name(s: str) -> bool:
    """The kernel's rule for event, field and argument names: ``[A-Za-z_][A-Za-z0-9_]*``."""
    return _GOOD_NAME.fullmatch(s) is not None


_GOOD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IDENT = re.compile(r"[^\W\d]\w*")  # a Python identifier (Unicode letters allowed)
_DOLLAR_VAR = re.compile(r"\$(\w*)")
_INT_LIT = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|[0-9]+)(?![\w.])")


def _scan_string(s: str, i: int) -> int:
    """Index just past the quoted string starting at ``s[i]`` (a quote), or -1 if unclosed."""
    q = s[i]
    j = i + 1
    n = len(s)
    while j < n:
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == q:
            return j + 1
        j += 1
    return -1


def _string_value(lit: str, pos: int) -> str:
    """The value of a quoted Python string literal (escapes as in Python)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = ast.literal_eval(lit)
    except (SyntaxError, ValueError):
        raise _ArgError(E_BAD_IMM, pos) from None
    if not isinstance(value, str):
        raise _ArgError(E_BAD_IMM, pos)
    return value


def _int_value(lit: str, pos: int) -> int:
    """The value of an integer literal (as Python writes them, no underscores), which must
    lie in :data:`~rethook.limits.IMMEDIATE`."""
    sign = -1 if lit[:1] == "-" else 1
    body = lit.lstrip("+-")
    base = {"0x": 16, "0o": 8, "0b": 2}.get(body[:2].lower())
    lo, hi = IMMEDIATE
    value = parse_digits(body[2:] if base else body, base or 10, max(hi, -lo))
    if value is None or not lo <= sign * value <= hi:
        raise _ArgError(f"{E_BAD_IMM} ({range_text(lo, hi)})", pos)
    return sign * value


def _split_outside_strings(s: str, sep: str) -> int:
    """Index of the first ``sep`` outside quoted strings, or -1."""
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c in "\"'":
            j = _scan_string(s, i)
            if j < 0:
                return -1
            i = j
            continue
        if c == sep:
            return i
        i += 1
    return -1


def parse_fetch_arg(text: str, index: int = 0, is_return: bool = False,
                    *, position: int = 0) -> FetchArg:
    """Parse one ``[NAME=]FETCHARG[:TYPE]`` (``index`` is its 0-based place in the list, for
    the default name ``arg<index+1>``). Raises :class:`ProbeSyntaxError` pointing into
    ``text``. ``position`` is recorded as the argument's column in its command."""
    try:
        return _parse_arg(text, index, is_return, position)
    except _ArgError as e:
        raise ProbeSyntaxError(e.message, text, e.position) from None


def _parse_arg(text: str, index: int, is_return: bool, position: int) -> FetchArg:
    eq = _split_outside_strings(text, "=")
    body_at = 0
    name: str | None = None
    if eq >= 0:
        name = text[:eq]
        if not name:
            raise _ArgError(E_NO_ARG_NAME, 0)
        if len(name) > MAX_ARG_NAME_LEN:
            raise _ArgError(E_ARG_NAME_TOO_LONG, 0)
        if not _is_good_name(name):
            raise _ArgError(E_BAD_ARG_NAME, 0)
        body_at = eq + 1
    rest = text[body_at:]
    colon = _split_outside_strings(rest, ":")
    expr = rest if colon < 0 else rest[:colon]
    type_name = None if colon < 0 else rest[colon + 1:]
    if not expr:
        raise _ArgError(E_NO_ARG_BODY, body_at)
    source, param, steps = _parse_expr(expr, body_at, is_return)
    if type_name is not None:
        type_at = body_at + colon + 1
        if type_name not in TYPES:
            raise _ArgError(E_BAD_TYPE, type_at)
        if not steps and (source == "comm" or (source == "imm" and isinstance(param, str))) \
                and type_name not in _STRING_SOURCE_TYPES:
            raise _ArgError(E_NEED_STRING_TYPE, type_at)
    if name is None:
        # The kernel's rule: a FETCHARG that is itself a good name names the argument,
        # anything else is called arg<position>.
        name = expr if _is_good_name(expr) else f"arg{index + 1}"
    return FetchArg(name, expr, type_name, source, param, steps, position)


def _parse_expr(s: str, at: int, is_return: bool) -> tuple[str, Any, tuple[Step, ...]]:
    """Parse FETCHARG ``s`` (which starts at column ``at`` of the argument)."""
    c = s[0]
    param: Any = None
    if c == "$":
        m = _DOLLAR_VAR.match(s)
        assert m is not None
        var, i = m.group(1), m.end()
        if var == "retval":
            if not is_return:
                raise _ArgError(E_RETVAL_ON_PROBE, at)
            source = "retval"
        elif var == "duration":
            if not is_return:
                raise _ArgError(E_DURATION_ON_PROBE, at)
            source = "duration"
        elif var in ("comm", "COMM"):
            source = "comm"
        elif var == "stack":
            source = "stack"
        elif var.startswith("stack") and var[5:].isascii() and var[5:].isdigit():
            param = parse_digits(var[5:], 10, MAX_STACK_DEPTH - 1)
            if param is None:
                raise _ArgError(f"{E_BAD_STACK_NUM} ({range_text(0, MAX_STACK_DEPTH - 1)})", at)
            source = "stackN"
        elif var.startswith("arg") and var[3:].isascii() and var[3:].isdigit():
            param = parse_digits(var[3:], 10, MAX_ARG_NUM)
            if not param:
                raise _ArgError(f"{E_BAD_ARG_NUM} ({range_text(1, MAX_ARG_NUM)})", at)
            source = "arg"
        else:
            raise _ArgError(E_BAD_VAR, at)
    elif c == "@":
        path = []
        i = 1
        while True:
            m = _IDENT.match(s, i)
            if m is None:
                raise _ArgError(E_BAD_GLOBAL, at + i)
            path.append(m.group())
            i = m.end()
            if i < len(s) and s[i] == "." and not s.startswith("..", i):
                i += 1
                continue
            break
        if len(path) < 2:
            raise _ArgError(E_BAD_GLOBAL, at + i)
        source, param = "global", tuple(path)
    elif c == "\\":
        if s[1:2] == '"':
            j = _scan_string(s, 1)
            if j < 0:
                raise _ArgError(E_IMMSTR_NO_CLOSE, at + len(s))
            param = _string_value(s[1:j], at + 1)
            i = j
        else:
            m = _INT_LIT.match(s, 1)
            if m is None:
                raise _ArgError(E_BAD_IMM, at + 1)
            param = _int_value(m.group(), at + 1)
            i = m.end()
        source = "imm"
    elif c == "_" or c.isidentifier():
        m = _IDENT.match(s)
        if m is None:
            raise _ArgError(E_BAD_FETCH_ARG, at)
        source, param, i = "param", m.group(), m.end()
    else:
        raise _ArgError(E_BAD_FETCH_ARG, at)
    return source, param, _parse_steps(s, i, at)


def _parse_steps(s: str, i: int, at: int) -> tuple[Step, ...]:
    steps: list[Step] = []
    n = len(s)
    while i < n:
        c = s[i]
        start = i
        if c == "." or s.startswith("->", i):
            i += 1 if c == "." else 2
            if i >= n:
                raise _ArgError(E_NO_FIELD, at + i)
            m = _IDENT.match(s, i)
            if m is None:
                raise _ArgError(E_BAD_FIELD, at + i)
            steps.append((True, m.group()))
            i = m.end()
        elif c == "-":
            raise _ArgError(E_BAD_HYPHEN, at + i)
        elif c == "[":
            i += 1
            if i >= n or s[i] == "]":
                raise _ArgError(E_NO_KEY, at + i)
            if s[i] in "\"'":
                j = _scan_string(s, i)
                if j < 0:
                    raise _ArgError(E_STR_NO_CLOSE, at + n)
                key: Any = _string_value(s[i:j], at + i)
                i = j
            else:
                m = _INT_LIT.match(s, i)
                if m is None:
                    raise _ArgError(E_BAD_KEY, at + i)
                key = _int_value(m.group(), at + i)
                i = m.end()
            if i >= n or s[i] != "]":
                raise _ArgError(E_KEY_NO_CLOSE, at + i)
            i += 1
            steps.append((False, key))
        else:
            raise _ArgError(E_BAD_FETCH_ARG, at + i)
        if len(steps) > MAX_STEPS:
            raise _ArgError(E_TOO_MANY_OPS, at + start)
    return tuple(steps)


# --- run time ------------------------------------------------------------------------------------
class _Missing:
    """A parameter that could not be taken at entry."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


class _FetchFailed(Exception):
    """Raised by generated code for a value that is not there (a missing parameter)."""


def _default_name_of(code: CodeType) -> str:
    return code.co_qualname


class FetchContext:
    """What a fetch can read when an event is recorded.

    ``captured``: what :meth:`FetchPlan.at_entry` returned (one slot per argument).
    ``frame``: the probed call's frame when still available (entry probes), else None.
    ``retval``/``exc``: the return value, or the exception the call raised (return probes).
    ``thread_name``: the thread's name; computed on first use when not given.
    ``stack``: caller names, innermost first; when not given, computed on first use by
    ``stack_fn()`` or, failing that, by walking ``frame.f_back``.
    ``duration_ns``: the call's wall time (return probes).
    ``name_of(code) -> str``: the function name of a code object (``symbol``, ``$stack``);
    defaults to ``co_qualname``.

    Cheap to build (positional arguments in the order above); reusable with :meth:`reset`.
    """

    __slots__ = ("captured", "frame", "retval", "exc", "duration_ns", "name_of", "stack_fn",
                 "_thread_name", "_stack")

    def __init__(self, captured: Any = None, frame: FrameType | None = None,
                 retval: Any = None, exc: BaseException | None = None,
                 thread_name: str | None = None, stack: Iterable[str] | None = None,
                 duration_ns: int | None = None,
                 name_of: Callable[[CodeType], str] | None = None,
                 stack_fn: Callable[[], Iterable[str]] | None = None) -> None:
        self.captured = captured
        self.frame = frame
        self.retval = retval
        self.exc = exc
        self.duration_ns = duration_ns
        self.name_of = name_of
        self.stack_fn = stack_fn
        self._thread_name = thread_name
        self._stack = stack

    def reset(self) -> None:
        """Forget the per-hit values (keeps ``name_of``)."""
        self.captured = self.frame = self.retval = self.exc = None
        self.duration_ns = self.stack_fn = self._thread_name = self._stack = None

    @property
    def thread_name(self) -> str:
        name = self._thread_name
        if name is None:
            name = self._thread_name = threading.current_thread().name
        return name

    @thread_name.setter
    def thread_name(self, value: str | None) -> None:
        self._thread_name = value

    @property
    def stack(self) -> tuple[str, ...]:
        st = self._stack
        if type(st) is tuple:
            return st
        if st is not None:
            st = tuple(st)
        else:
            if self.stack_fn is not None:
                st = tuple(self.stack_fn())[:MAX_STACK_DEPTH]
            else:
                name_of = self.name_of or _default_name_of
                out: list[str] = []
                f = self.frame.f_back if self.frame is not None else None
                while f is not None and len(out) < MAX_STACK_DEPTH:
                    out.append(name_of(f.f_code))
                    f = f.f_back
                st = tuple(out)
        self._stack = st
        return st

    @stack.setter
    def stack(self, value: Iterable[str] | None) -> None:
        self._stack = None if value is None else tuple(value)


# Parameter names of a code object in signature order, cached by id (the entry keeps the code
# alive, so its id cannot be reused while cached).
_params_cache: dict[int, tuple[CodeType, tuple[str, ...]]] = {}
_CO_VARARGS = 0x04
_CO_VARKEYWORDS = 0x08


def param_names(code: CodeType) -> tuple[str, ...]:
    """The parameters of ``code`` in signature order: positional ones (``self`` first), then
    ``*args``, then keyword-only ones, then ``**kwargs``. ``$argN`` is the N-th of them."""
    ent = _params_cache.get(id(code))
    if ent is not None and ent[0] is code:
        return ent[1]
    names = code.co_varnames
    npos, nkw = code.co_argcount, code.co_kwonlyargcount
    out = list(names[:npos])
    k = npos + nkw
    if code.co_flags & _CO_VARARGS:
        out.append(names[k])
        k += 1
    out.extend(names[npos:npos + nkw])
    if code.co_flags & _CO_VARKEYWORDS:
        out.append(names[k])
    result = tuple(out)
    _params_cache[id(code)] = (code, result)
    return result


# Converters: conv(value, ctx) -> the stored value; they raise when the value does not fit.
_index = operator.index


def _cut(s: str) -> str:
    return s if len(s) <= MAX_STRING_LEN else s[:MAX_STRING_LEN - 3] + "..."


def _conv_int(v: Any, ctx: FetchContext) -> int:
    return v if type(v) is int else _index(v)


def _conv_string(v: Any, ctx: FetchContext) -> str:
    if type(v) is str:
        return v if len(v) <= MAX_STRING_LEN else v[:MAX_STRING_LEN - 3] + "..."
    if isinstance(v, str):
        return _cut(str.__str__(v))
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _cut(bytes(v[:MAX_STRING_LEN]).decode("utf-8", "backslashreplace"))
    raise TypeError("not a string")


_reprlib = reprlib.Repr()
_reprlib.maxlevel = 3
_reprlib.maxstring = MAX_STRING_LEN
_reprlib.maxother = MAX_STRING_LEN
_reprlib.maxlist = _reprlib.maxtuple = _reprlib.maxset = _reprlib.maxfrozenset = 16
_reprlib.maxdict = _reprlib.maxdeque = _reprlib.maxarray = 16
_SIMPLE = frozenset({int, float, bool, type(None), complex})
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})


def _conv_repr(v: Any, ctx: FetchContext) -> str:
    t = type(v)
    if t in _SIMPLE:
        r = repr(v)
    elif t is str:
        r = repr(v) if len(v) <= MAX_STRING_LEN else repr(v[:MAX_STRING_LEN]) + "..."
    elif t in _CONTAINERS:
        r = _reprlib.repr(v)
    else:
        r = repr(v)
        if type(r) is not str:
            raise TypeError("__repr__ returned a non-string")
    return r if len(r) <= MAX_STRING_LEN else r[:MAX_STRING_LEN - 3] + "..."


def _code_of(v: Any) -> CodeType | None:
    if isinstance(v, CodeType):
        return v
    for attr in ("__code__", "f_code", "gi_code", "cr_code", "ag_code"):
        code = getattr(v, attr, None)
        if isinstance(code, CodeType):
            return code
    func = getattr(v, "__func__", None)  # bound methods, classmethod, staticmethod
    if func is not None and func is not v:
        return _code_of(func)
    return None


def _conv_symbol(v: Any, ctx: FetchContext) -> str:
    if isinstance(v, str):
        return _cut(str.__str__(v))
    code = _code_of(v)
    if code is not None:
        if ctx.name_of is not None:
            return ctx.name_of(code)
        mod = getattr(v, "__module__", None)
        return f"{mod}.{code.co_qualname}" if isinstance(mod, str) else code.co_qualname
    qual = getattr(v, "__qualname__", None)
    if isinstance(qual, str):
        mod = getattr(v, "__module__", None)
        return f"{mod}.{qual}" if isinstance(mod, str) and mod != "builtins" else qual
    raise TypeError("not a function")


def _conv_len(v: Any, ctx: FetchContext) -> int:
    return len(v)


def _conv_type(v: Any, ctx: FetchContext) -> str:
    return type(v).__qualname__


def _conv_bool(v: Any, ctx: FetchContext) -> bool:
    return bool(v)


_CONVERTERS: dict[str, Callable[[Any, FetchContext], Any]] = {
    "string": _conv_string, "symbol": _conv_symbol, "repr": _conv_repr,
    "len": _conv_len, "type": _conv_type, "bool": _conv_bool,
}


# --- code generation -----------------------------------------------------------------------------
# Each plan compiles to two plain functions, generated once when the probe is defined:
# at_entry(frame) takes the parameters, values(ctx) computes every argument, each in its own
# try/except, with the access chain unrolled into attribute and item lookups.
_NAMESPACE: dict[str, Any] = {
    "__name__": __name__,  # the generated functions belong to rethook: the engine skips them
    "_MISSING": _MISSING, "_FetchFailed": _FetchFailed, "_index": _index, "_cut": _cut,
    "_SIMPLE": _SIMPLE, "_MAXS": MAX_STRING_LEN, "_conv_repr": _conv_repr,
    "_raised": None, "_getattr": getattr, "_param_names": param_names,
}


def _step_code(steps: tuple[Step, ...], ns: dict[str, Any], tag: str) -> list[str]:
    lines = []
    for j, (is_attr, key) in enumerate(steps):
        if is_attr:
            if key.isascii() and not keyword.iskeyword(key) and not key.startswith("__"):
                lines.append(f"v = v.{key}")
            else:
                ns[f"_k{tag}_{j}"] = key
                lines.append(f"v = _getattr(v, _k{tag}_{j})")
        else:
            lines.append(f"v = v[{key!r}]")
    return lines


def _value_code(f: Fetch, i: int, ns: dict[str, Any]) -> list[str]:
    """Statements setting ``r{i}`` for fetch ``f`` (no exception escapes them)."""
    arg, out = f.arg, f"r{i}"
    src = arg.source
    body: list[str] = []
    if src in ("arg", "param"):
        body += [f"v = cap[{f.index}]", "if v is _MISSING:", "    raise _FetchFailed"]
    elif src == "retval":
        body.append("v = ctx.retval")
    elif src == "duration":
        body += ["v = ctx.duration_ns", "if v is None:", "    raise _FetchFailed"]
    elif src == "comm":
        body.append("v = ctx.thread_name")
    elif src == "stack":
        body.append("v = ctx.stack")
    elif src == "stackN":
        body.append(f"v = ctx.stack[{arg.param}]")
    elif src == "imm":
        body.append(f"v = {arg.param!r}")
    elif src == "global":
        ns[f"_global{i}"] = f._global_value
        body.append(f"v = _global{i}()")
    body += _step_code(arg.steps, ns, str(i))
    spec = TYPES[f.type]
    if spec.kind in ("u", "x", "s"):
        mask = (1 << spec.bits) - 1
        body.append(f"v = (v if type(v) is int else _index(v)) & {mask:#x}")
        if spec.kind == "s":
            body.append(f"{out} = v - {1 << spec.bits:#x} if v & {1 << (spec.bits - 1):#x} else v")
        else:
            body.append(f"{out} = v")
    elif spec.kind == "repr":
        body += [
            "t = type(v)",
            "if t in _SIMPLE or (t is str and len(v) <= _MAXS):",
            f"    {out} = repr(v)",
            f"    if len({out}) > _MAXS:",
            f"        {out} = _cut({out})",
            "else:",
            f"    {out} = _conv_repr(v, ctx)",
        ]
    else:
        ns[f"_conv{i}"] = _CONVERTERS[spec.kind]
        body.append(f"{out} = _conv{i}(v, ctx)")
    ns[f"_fault{i}"] = f._fault
    lines = ["try:", *("    " + b for b in body), "except Exception:", f"    {out} = _fault{i}()"]
    if src == "retval":
        ns["_raised"] = Raised.of
        lines = ["if ctx.exc is not None:", f"    {out} = _raised(ctx.exc)", "else:",
                 *("    " + ln for ln in lines)]
    return lines


def _compile(src_lines: list[str], ns: dict[str, Any], name: str, label: str) -> Any:
    src = "\n".join(src_lines) + "\n"
    code = compile(src, f"<rethook fetch {label}>", "exec")
    exec(code, ns)
    fn = ns[name]
    fn.__source__ = src  # for debugging: print(plan.values.__source__)
    return fn


def _gen_values(fetches: tuple[Fetch, ...], label: str, single: bool) -> Any:
    ns = dict(_NAMESPACE)
    lines = ["def values(ctx):"]
    if any(f.needs_entry for f in fetches):
        lines.append("    cap = ctx.captured")
    for i, f in enumerate(fetches):
        lines += ["    " + ln for ln in _value_code(f, i, ns)]
    if single:
        lines.append("    return r0")
    else:
        lines.append("    return (" + "".join(f"r{i}, " for i in range(len(fetches))) + ")")
    return _compile(lines, ns, "values", label)


def _gen_at_entry(fetches: tuple[Fetch, ...], n: int, label: str, single: bool) -> Any:
    """at_entry(frame) -> a tuple with one slot per argument (or the value, when single)."""
    ns = dict(_NAMESPACE)
    ns["_last"] = [(None, ())]  # (code, param names) of the last frame seen
    caps = [(f.index, f.arg) for f in fetches if f.needs_entry]
    miss = [None] * n
    for k, _ in caps:
        miss[k] = _MISSING
    ns["_ALL_MISSING"] = miss[0] if single else tuple(miss)
    lines = ["def at_entry(frame):", "    try:", "        loc = frame.f_locals",
             "    except Exception:", "        return _ALL_MISSING"]
    if any(a.source == "arg" for _, a in caps):
        lines += ["    code = frame.f_code", "    ent = _last[0]", "    if ent[0] is code:",
                  "        pn = ent[1]", "    else:", "        pn = _param_names(code)",
                  "        _last[0] = (code, pn)"]
    for k, a in caps:
        key = f"pn[{a.param - 1}]" if a.source == "arg" else repr(a.param)
        lines += ["    try:", f"        c{k} = loc[{key}]", "    except Exception:",
                  f"        c{k} = _MISSING"]
    if single:
        lines.append(f"    return c{caps[0][0]}")
    else:
        slots = [f"c{k}" if miss[k] is _MISSING else "None" for k in range(n)]
        lines.append("    return (" + "".join(s + ", " for s in slots) + ")")
    return _compile(lines, ns, "at_entry", label)


def _no_capture(frame: FrameType) -> None:
    return None


class Fetch:
    """A compiled fetch argument.

    ``at_entry(frame)`` takes what must be taken at entry (the parameter the argument starts
    from, for ``$argN`` and names; None for the others). ``value(ctx)`` returns the converted
    value, :data:`FAULT` (counted in ``faults``) or a :class:`Raised` marker; it never raises.
    ``ctx.captured`` holds what ``at_entry`` returned, in slot ``index``.
    """

    __slots__ = ("arg", "index", "type", "faults", "needs_entry", "needs_stack", "needs_comm",
                 "_lock", "_global", "_value", "_at_entry")

    def __init__(self, arg: FetchArg, index: int = 0) -> None:
        self.arg = arg
        self.index = index
        self.type = arg.effective_type
        self.faults = 0
        self.needs_entry = arg.needs_entry
        self.needs_stack = arg.needs_stack
        self.needs_comm = arg.source == "comm"
        self._lock = threading.Lock()
        self._global: tuple[str, Any, tuple[str, ...]] | None = None
        self._value = _gen_values((self,), arg.text, single=True)
        self._at_entry = (_gen_at_entry((_Slot0(self),), 1, arg.text, single=True)
                          if self.needs_entry else _no_capture)

    def __repr__(self) -> str:
        return f"<Fetch {self.arg.text} faults={self.faults}>"

    def at_entry(self, frame: FrameType) -> Any:
        return self._at_entry(frame)

    def value(self, ctx: FetchContext) -> Any:
        return self._value(ctx)

    def _fault(self) -> _Fault:
        with self._lock:
            self.faults += 1
        return FAULT

    def _global_value(self) -> Any:
        """``@MOD.NAME``: resolved against the longest imported module prefix of the path
        (cached while ``sys.modules`` keeps the same module); never imports anything."""
        cached = self._global
        if cached is None or sys.modules.get(cached[0]) is not cached[1]:
            path = self.arg.param
            for k in range(len(path) - 1, 0, -1):
                name = ".".join(path[:k])
                mod = sys.modules.get(name)
                if mod is not None:
                    cached = self._global = (name, mod, tuple(path[k:]))
                    break
            else:
                raise LookupError("module not imported")
        v = cached[1]
        for a in cached[2]:
            v = getattr(v, a)
        return v


class _Slot0:
    """A view of a Fetch at slot 0, for generating its own one-argument at_entry."""

    def __init__(self, f: Fetch) -> None:
        self.arg = f.arg
        self.index = 0
        self.needs_entry = f.needs_entry


def compile_fetch(arg: FetchArg, is_return: bool = False, index: int = 0) -> Fetch:
    """Compile one argument. ``index`` is its slot in ``FetchContext.captured``.

    ``is_return`` says where the value is taken; an argument that needs a return (``$retval``,
    ``$duration``) is rejected for an entry probe."""
    if not is_return and arg.source in ("retval", "duration"):
        msg = E_RETVAL_ON_PROBE if arg.source == "retval" else E_DURATION_ON_PROBE
        raise ProbeSyntaxError(msg, arg.text, len(arg.name) + 1)
    return Fetch(arg, index)


class FetchPlan:
    """Every fetch argument of one event, compiled into two functions. A hit::

        captured = plan.at_entry(frame)     # entry handler: one slot per argument
        ctx = FetchContext(captured, None, retval, exc, None, None, duration_ns, name_of)
        values = plan.values(ctx)           # when the event is recorded: a tuple
        text = format_args(plan, values)    # 'a=1 b="x"' when the trace is printed

    ``needs_entry`` (some argument takes parameters: call ``at_entry``), ``needs_stack`` and
    ``needs_comm`` say what the engine must be ready to provide; ``faults`` sums the
    arguments' fault counts (``fetches[i].faults`` per argument).
    """

    __slots__ = ("fetches", "is_return", "names", "types", "needs_entry", "needs_stack",
                 "needs_comm", "at_entry", "values", "format")

    def __init__(self, args: Iterable[FetchArg], is_return: bool = False,
                 label: str = "plan") -> None:
        self.fetches = tuple(compile_fetch(a, is_return, i) for i, a in enumerate(args))
        self.is_return = is_return
        self.names = tuple(f.arg.name for f in self.fetches)
        self.types = tuple(f.type for f in self.fetches)
        self.needs_entry = any(f.needs_entry for f in self.fetches)
        self.needs_stack = any(f.needs_stack for f in self.fetches)
        self.needs_comm = any(f.needs_comm for f in self.fetches)
        n = len(self.fetches)
        #: at_entry(frame) -> tuple (one slot per argument), or None when nothing is needed.
        self.at_entry = (_gen_at_entry(self.fetches, n, label, single=False)
                         if self.needs_entry else _no_capture)
        #: values(ctx) -> tuple of the arguments' values.
        self.values = _gen_values(self.fetches, label, single=False)
        #: format(values) -> 'name=value ...' (see :func:`format_args`).
        self.format = _gen_format(self.names, self.types, label)

    def __len__(self) -> int:
        return len(self.fetches)

    @property
    def faults(self) -> int:
        return sum(f.faults for f in self.fetches)


def compile_plan(args: Iterable[FetchArg], is_return: bool = False,
                 label: str = "plan") -> FetchPlan:
    """Compile an event's argument list (``ProbeDefinition.args``); ``label`` names the
    generated code (``<rethook fetch LABEL>``), e.g. the event's ``GROUP/EVENT``."""
    return FetchPlan(args, is_return, label)


# --- rendering -----------------------------------------------------------------------------------
_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\t"): "\\t",
            ord("\r"): "\\r"}
for _c in range(32):
    _ESCAPES.setdefault(_c, f"\\x{_c:02x}")
_ESCAPES[0x7F] = "\\x7f"


def format_value(value: Any, type_name: str) -> str:
    """Render a fetched value as the kernel prints a probe field: u/s in decimal, x as
    ``0x%x``, ``string`` in double quotes (``"`` ``\\`` and control characters escaped),
    ``symbol`` as the bare name; ``repr``, ``len``, ``type`` and ``bool`` as Python text.
    :data:`FAULT` is ``(fault)``, a :class:`Raised` marker ``(raised TYPE: message)``."""
    if value is FAULT:
        return "(fault)"
    if type(value) is Raised:
        return str(value)
    kind = TYPES[type_name].kind
    if kind == "x":
        return f"0x{value:x}"
    if kind == "string":
        return '"' + str(value).translate(_ESCAPES) + '"'
    return str(value)


def _hex(v: Any) -> str:
    return f"0x{v:x}" if type(v) is int else str(v)


def _quote(v: Any) -> str:
    return '"' + v.translate(_ESCAPES) + '"' if type(v) is str else str(v)


def _gen_format(names: tuple[str, ...], types: tuple[str, ...], label: str) -> Any:
    """fmt(values) -> 'name=value ...', one f-string (markers print through ``str``)."""
    ns = dict(_NAMESPACE, _hex=_hex, _quote=_quote)
    parts = []
    for i, (name, t) in enumerate(zip(names, types, strict=True)):
        kind = TYPES[t].kind
        expr = f"_hex(r{i})" if kind == "x" else f"_quote(r{i})" if kind == "string" else f"r{i}"
        parts.append(f"{name}={{{expr}}}")
    unpack = "".join(f"r{i}, " for i in range(len(names)))
    lines = ["def fmt(vals):"]
    if names:
        lines.append(f"    ({unpack}) = vals")
    lines.append(f"    return f{' '.join(parts)!r}")
    return _compile(lines, ns, "fmt", label)


def format_args(plan: FetchPlan, values: Iterable[Any]) -> str:
    """``name=value`` for every argument, space separated (the kernel's field list), each
    value as :func:`format_value` renders it. Same as ``plan.format(values)``."""
    return plan.format(tuple(values))
