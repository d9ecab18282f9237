"""Dynamic event definitions: the kernel's ``dynamic_events`` grammar for Python functions.

::

    p[:[GRP/][EVENT]] FUNC[%return] [FETCHARGS]           entry probe (kprobe)
    r[MAXACTIVE][:[GRP/][EVENT]] FUNC [FETCHARGS]         return probe (kretprobe)
    f[MAXACTIVE][:[GRP/][EVENT]] FUNC[%return] [FETCHARGS] fprobe; FUNC may be a glob
    -:[GRP/]EVENT [FETCHARGS...]                          delete

:func:`parse_definition` turns one line into a :class:`ProbeDefinition` or a
:class:`DeleteDefinition`; nothing else happens (nothing is resolved, registered or
half-created). A rejected line raises :class:`ProbeSyntaxError`, which renders like the
kernel's ``error_log`` entry with a caret under the mistake. ``canonical()`` gives the line as
``cat dynamic_events`` shows it, and parsing it back gives an equal definition.
``docs/probe-definitions.md`` is the user's reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rethook.limits import parse_digits, range_text
from rethook.probes.fetch import (
    MAX_FETCH_ARGS,
    RESERVED_NAMES,
    FetchArg,
    ProbeSyntaxError,
    _ArgError,
    _is_good_name,
    _parse_arg,
    _scan_string,
)

__all__ = [
    "DEFAULT_FPROBE_GROUP",
    "DEFAULT_KPROBE_GROUP",
    "MAX_EVENT_NAME_LEN",
    "DeleteDefinition",
    "ProbeDefinition",
    "ProbeSyntaxError",
    "event_name_for",
    "parse_definition",
    "sanitize_event_name",
]

DEFAULT_KPROBE_GROUP = "kprobes"
DEFAULT_FPROBE_GROUP = "fprobes"
#: Group and event names are shorter than this (the kernel's ``MAX_EVENT_NAME_LEN``).
MAX_EVENT_NAME_LEN = 64
#: The largest MAXACTIVE (an unsigned 32-bit number, as the kernel parses it).
MAX_MAXACTIVE = 0xFFFFFFFF

_GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # the kernel's "system" names allow '-'
_NOT_NAME_CHAR = re.compile(r"[^A-Za-z0-9_]")
_GLOB_CHARS = frozenset("*?[")
# Characters a FUNC may hold besides letters, digits and '_': those of rethook's function
# names (docs/functions.md: dots, <locals>, @LINE, #N) and of ftrace globs.
_FUNC_PUNCT = frozenset(".<>@#*?[]!^-")

E_UNKNOWN_TYPE = "Unknown probe type"
E_MAXACT_TYPE = "Maxactive is only for function exit"
E_BAD_MAXACT = "Invalid maxactive number"
E_NO_GROUP_NAME = "Group name is not specified"
E_GROUP_TOO_LONG = "Group name is too long"
E_BAD_GROUP_NAME = "Group name must follow the same rules as C identifiers"
E_NO_EVENT_NAME = "Event name is not specified"
E_EVENT_TOO_LONG = "Event name is too long"
E_BAD_EVENT_NAME = "Event name must follow the same rules as C identifiers"
E_GLOB_NEEDS_EVENT = "Event name is not specified (a glob FUNC needs one)"
E_NO_FUNC = "Function name is not specified"
E_BAD_FUNC = "Invalid probed address or symbol"
E_BAD_SUFFIX = "Invalid probed address suffix"
E_TOO_MANY_ARGS = "Too many arguments are specified"
E_USED_ARG_NAME = "This argument name is already used"
E_EMPTY = "Empty command"
E_BAD_DELETE = "Delete command must be -:[GRP/]EVENT"


@dataclass(frozen=True, slots=True)
class ProbeDefinition:
    """A parsed ``p:``/``r:``/``f:`` definition.

    ``kind`` is ``'p'`` (entry kprobe), ``'r'`` (kretprobe; also ``p ... FUNC%return``) or
    ``'f'`` (fprobe, entry or exit by ``is_return``). ``group``/``event`` are filled with the
    kernel's defaults when not written. ``maxactive`` is None when not written. ``text`` is
    the command as written (words joined by single spaces); it does not take part in equality.
    """

    kind: str
    group: str
    event: str
    func: str
    is_return: bool
    maxactive: int | None
    args: tuple[FetchArg, ...]
    text: str = field(default="", compare=False)

    @property
    def is_glob(self) -> bool:
        """FUNC is a glob (``*``, ``?``, ``[``) rather than one name."""
        return any(c in _GLOB_CHARS for c in self.func)

    @property
    def full_name(self) -> str:
        """``GROUP/EVENT``, the event's directory under ``events/``."""
        return f"{self.group}/{self.event}"

    def canonical(self) -> str:
        """The definition as ``cat dynamic_events`` shows it::

            p:kprobes/p_json_loads_0 json.loads s=$arg1
            r16:kprobes/slow mod.f ret=$retval
            f:fprobes/send *.send%return ret=$retval:s32

        The group and event are always shown, MAXACTIVE when set, ``%return`` on fprobe
        exits, and every argument as ``NAME=FETCHARG[:TYPE]`` with the type as written.
        """
        head = self.kind
        if self.maxactive is not None:
            head += str(self.maxactive)
        func = self.func + ("%return" if self.kind == "f" and self.is_return else "")
        parts = [f"{head}:{self.group}/{self.event}", func]
        parts.extend(a.text for a in self.args)
        return " ".join(parts)

    def __str__(self) -> str:
        return self.canonical()


@dataclass(frozen=True, slots=True)
class DeleteDefinition:
    """A parsed ``-:[GRP/]EVENT [ARGS...]``. ``group`` None means any group; ``args`` (as
    written) must then match the probe's command line, word for word, as in the kernel."""

    group: str | None
    event: str
    args: tuple[str, ...] = ()
    text: str = field(default="", compare=False)

    def canonical(self) -> str:
        name = self.event if self.group is None else f"{self.group}/{self.event}"
        return " ".join((f"-:{name}", *self.args))

    def __str__(self) -> str:
        return self.canonical()


def sanitize_event_name(name: str) -> str:
    """Map every character outside ``[A-Za-z0-9_]`` to ``_`` (the kernel maps ``.``, ``:`` and
    ``*``; Python names hold more), prefix ``_`` if it would start with a digit, and cut it to
    63 characters as the kernel's ``snprintf`` into ``MAX_EVENT_NAME_LEN`` does."""
    out = _NOT_NAME_CHAR.sub("_", name)
    if out[:1].isdigit():
        out = "_" + out
    return out[:MAX_EVENT_NAME_LEN - 1]


def event_name_for(kind: str, func: str, is_return: bool) -> str:
    """The default event name: ``p_FUNC_0`` / ``r_FUNC_0`` for k(ret)probes (the kernel's
    ``%c_%s_%ld`` with offset 0), ``FUNC__entry`` / ``FUNC__exit`` for fprobes, sanitized."""
    if kind == "f":
        return sanitize_event_name(f"{func}__{'exit' if is_return else 'entry'}")
    return sanitize_event_name(f"{'r' if is_return else 'p'}_{func}_0")


# --- tokens --------------------------------------------------------------------------------------
def _tokens(text: str) -> list[str]:
    """Split on whitespace, keeping quoted strings (``"..."``, ``'...'``) whole."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        start = i
        while i < n and not text[i].isspace():
            if text[i] in "\"'":
                j = _scan_string(text, i)
                i = n if j < 0 else j
            else:
                i += 1
        out.append(text[start:i])
    return out


class _Command:
    """The command's words, the echoed command and each word's column in it."""

    def __init__(self, text: str) -> None:
        self.words = _tokens(text)
        self.text = " ".join(self.words)
        self.starts: list[int] = []
        pos = 0
        for w in self.words:
            self.starts.append(pos)
            pos += len(w) + 1
        self.location = "dynamic_events"

    def error(self, message: str, word: int, offset: int = 0) -> ProbeSyntaxError:
        """An error at ``offset`` into word ``word``; a missing word points one column past
        the end of the command (after the space that would precede it), as the kernel does."""
        if word >= len(self.words):
            pos = len(self.text) + 1
        else:
            pos = self.starts[word] + offset
        return ProbeSyntaxError(message, self.text, pos, location=self.location)


# --- parsing -------------------------------------------------------------------------------------
def parse_definition(text: str) -> ProbeDefinition | DeleteDefinition:
    """Parse one ``dynamic_events`` line. Raises :class:`ProbeSyntaxError` (a ValueError)."""
    cmd = _Command(text)
    if not cmd.words:
        raise ProbeSyntaxError(E_EMPTY, "", 0)
    head = cmd.words[0]
    kind = head[0]
    if kind == "-":
        return _parse_delete(cmd)
    if kind not in "prf":
        raise cmd.error(E_UNKNOWN_TYPE, 0)
    cmd.location = "trace_fprobe" if kind == "f" else "trace_kprobe"

    # p/r/f, then MAXACTIVE digits, then ':' and the names, or nothing.
    i = 1
    while i < len(head) and head[i].isascii() and head[i].isdigit():
        i += 1
    digits = head[1:i]
    if i < len(head) and head[i] != ":":
        raise cmd.error(E_UNKNOWN_TYPE, 0)
    maxactive: int | None = None
    if digits:
        if kind == "p":
            raise cmd.error(E_MAXACT_TYPE, 0, 1)
        maxactive = parse_digits(digits, 10, MAX_MAXACTIVE)
        if not maxactive:
            raise cmd.error(f"{E_BAD_MAXACT} ({range_text(1, MAX_MAXACTIVE)})", 0, 1)
    group: str | None = None
    event: str | None = None
    if i < len(head):  # head[i] == ':'
        group, event = _parse_names(cmd, head[i + 1:], i + 1)

    if len(cmd.words) < 2:
        raise cmd.error(E_NO_FUNC, 1)
    func, is_return = _parse_func(cmd, kind)
    if kind == "p" and is_return:
        kind = "r"  # the kernel: 'p FUNC%return' is a return probe
    elif kind == "r":
        is_return = True

    args = _parse_args(cmd, kind, is_return)
    if kind == "f" and not is_return and any(a.source in ("retval", "duration") for a in args):
        is_return = True  # the kernel: an fprobe fetching $retval probes the exit
    if maxactive is not None and not is_return:
        raise cmd.error(E_MAXACT_TYPE, 0, 1)

    if event is None:
        if any(c in _GLOB_CHARS for c in func):
            raise cmd.error(E_GLOB_NEEDS_EVENT, 0, len(head))
        event = event_name_for(kind, func, is_return)
    if group is None:
        group = DEFAULT_FPROBE_GROUP if kind == "f" else DEFAULT_KPROBE_GROUP
    return ProbeDefinition(kind, group, event, func, is_return, maxactive, args, cmd.text)


def _parse_names(cmd: _Command, spec: str, at: int) -> tuple[str | None, str | None]:
    """``[GRP/][EVENT]`` (or the kernel's ``GRP.EVENT``) starting at column ``at`` of word 0.

    Returns (group or None, event or None); an event is required unless a group is given."""
    slash = spec.find("/")
    if slash < 0:
        slash = spec.find(".")
    group: str | None = None
    ev_at = at
    if slash >= 0:
        group = spec[:slash]
        if not group:
            raise cmd.error(E_NO_GROUP_NAME, 0, at)
        if len(group) >= MAX_EVENT_NAME_LEN:
            raise cmd.error(E_GROUP_TOO_LONG, 0, at)
        if not _GROUP_NAME.fullmatch(group):
            raise cmd.error(E_BAD_GROUP_NAME, 0, at)
        spec = spec[slash + 1:]
        ev_at = at + slash + 1
    if not spec:
        if group is not None:
            return group, None
        raise cmd.error(E_NO_EVENT_NAME, 0, ev_at)
    if len(spec) >= MAX_EVENT_NAME_LEN:
        raise cmd.error(E_EVENT_TOO_LONG, 0, ev_at)
    if not _is_good_name(spec):
        raise cmd.error(E_BAD_EVENT_NAME, 0, ev_at)
    return group, spec


def _parse_func(cmd: _Command, kind: str) -> tuple[str, bool]:
    word = cmd.words[1]
    pct = word.find("%")
    is_return = False
    func = word
    if pct >= 0:
        if word[pct:] != "%return":
            raise cmd.error(E_BAD_SUFFIX, 1, pct)
        func, is_return = word[:pct], True
    if not func:
        raise cmd.error(E_BAD_FUNC, 1)
    for k, c in enumerate(func):
        if not (c.isalnum() or c == "_" or c in _FUNC_PUNCT):
            raise cmd.error(E_BAD_FUNC, 1, k)
    _check_glob(cmd, func)
    return func, is_return


def _check_glob(cmd: _Command, func: str) -> None:
    """Every ``[`` opens a class that closes (ftrace's glob rule, as in the filters)."""
    i, n = 0, len(func)
    while i < n:
        if func[i] == "[":
            j = i + 1
            if j < n and func[j] in "!^":
                j += 1
            if j < n and func[j] == "]":
                j += 1
            while j < n and func[j] != "]":
                j += 1
            if j >= n:
                raise cmd.error("Unbalanced '[' in function glob", 1, i)
            i = j
        i += 1


def _parse_args(cmd: _Command, kind: str, is_return: bool) -> tuple[FetchArg, ...]:
    words = cmd.words[2:]
    if len(words) > MAX_FETCH_ARGS:
        raise cmd.error(E_TOO_MANY_ARGS, 2 + MAX_FETCH_ARGS)
    # An fprobe becomes an exit probe when it fetches $retval: parse as if it were one and let
    # the caller decide; p and r know already.
    allow_return = is_return or kind == "f"
    args: list[FetchArg] = []
    seen: set[str] = set()
    for k, word in enumerate(words):
        w = 2 + k
        try:
            arg = _parse_arg(word, k, allow_return, cmd.starts[w])
        except _ArgError as e:
            raise cmd.error(e.message, w, e.position) from None
        if arg.name in seen or arg.name in RESERVED_NAMES:
            raise cmd.error(E_USED_ARG_NAME, w)
        seen.add(arg.name)
        args.append(arg)
    return tuple(args)


def _parse_delete(cmd: _Command) -> DeleteDefinition:
    head = cmd.words[0]
    if head[1:2] != ":":
        raise cmd.error(E_BAD_DELETE, 0, 1)
    spec = head[2:]
    group, event = _parse_names(cmd, spec, 2)
    if event is None:
        raise cmd.error(E_NO_EVENT_NAME, 0, len(head))
    return DeleteDefinition(group, event, tuple(cmd.words[1:]), cmd.text)
