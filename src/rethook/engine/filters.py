"""ftrace's function filters: the ``set_ftrace_filter`` and ``set_ftrace_notrace`` hashes.

A :class:`FunctionFilter` is one user's pair of hashes (the kernel's ``ftrace_ops`` filter and
notrace), written with ftrace's syntax and resolved against the function registry:

* whitespace separates patterns; ``foo`` is exact, ``foo*`` a prefix, ``*foo`` a suffix,
  ``*foo*`` a substring, anything else with ``*``, ``?`` or ``[...]`` a full glob;
* a pattern matches a function when it matches its canonical name or its qualname, with or
  without the registry's ``@LINE`` disambiguation suffix (so ``fib``, ``Session.send`` and
  ``*.send`` work without the module);
* ``GLOB:mod:MODULE`` restricts to a module (and its submodules); MODULE may be a glob;
* a leading ``!`` removes: the pattern itself if it was written before, and (as the kernel
  removes functions from its hash) whatever it matches from what the other patterns select;
* ``GLOB:traceon[:COUNT]``, ``traceoff``, ``stacktrace``, ``dump``,
  ``enable_event:SYS:EVENT[:COUNT]`` and ``disable_event:...`` are function commands, parsed
  into :class:`FilterCommand` and kept apart (a tracer executes them);
* ``#`` at the start of a word comments out the rest of the line (so ``cat`` output, whose
  empty-hash banner is a comment, can be written back).

A function matches the pair when (the filter is empty or selects it) and the notrace hash does
not select it. A pattern that selects nothing is an error, unless it can only apply to a module
that is not imported yet: it is then kept and applies when the module loads.

Globs are compiled once per write; :meth:`FunctionFilter.matches` only runs the compiled tests.
"""

from __future__ import annotations

import sys
import threading
from _weakref import ref  # (as weakref.ref; weakref itself is ~0.5 ms of a start-up)
from types import CodeType

from rethook import limits
from rethook.engine.registry import (
    FunctionInfo,
    Registry,
    Within,
    default_registry,
    no_modules,
)
from rethook.frozen import Frozen, Row

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Callable, Iterable, Iterator

    from rethook.engine.registry import Scope

__all__ = [
    "COMMANDS",
    "FilterCommand",
    "FilterError",
    "FunctionFilter",
    "Pattern",
    "compile_glob",
    "parse_filter_text",
]

#: Function commands and how many ``:``-separated arguments each takes before the count.
COMMANDS: dict[str, int] = {
    "traceon": 0,
    "traceoff": 0,
    "stacktrace": 0,
    "dump": 0,
    "enable_event": 2,
    "disable_event": 2,
}

_GLOB_CHARS = frozenset("*?[")
_FILTER_EMPTY = "#### all functions enabled ####"
_NOTRACE_EMPTY = "#### no functions disabled ####"


class FilterError(ValueError):
    """A filter write the kernel would reject; renders the input with a caret, like error_log."""

    def __init__(self, message: str, text: str, position: int) -> None:
        super().__init__(message)
        self.message = message
        self.text = text
        self.position = position

    def __str__(self) -> str:
        text, pos = self.text, max(0, min(self.position, len(self.text)))
        start = text.rfind("\n", 0, pos) + 1
        end = text.find("\n", pos)
        line = text[start: end if end >= 0 else len(text)]
        # Tabs and carriage returns are separators: show them as one column each.
        line = line.replace("\t", " ").replace("\r", " ")
        prefix = "  Command: "
        return f"{self.message}\n{prefix}{line}\n{' ' * (len(prefix) + pos - start)}^"


def _has_glob(s: str) -> bool:
    return any(c in _GLOB_CHARS for c in s)


class Pattern(Frozen, compared=("glob", "module", "remove")):
    """One pattern of a write: ``[!]GLOB[:mod:MODULE]``. ``position`` (where it starts in the
    text written, for errors) is not compared."""

    __slots__ = ("glob", "module", "remove", "position")
    glob: str
    module: str | None
    remove: bool
    position: int

    def __init__(self, glob: str, module: str | None = None, remove: bool = False,
                 position: int = 0) -> None:
        object.__setattr__(self, "glob", glob)
        object.__setattr__(self, "module", module)
        object.__setattr__(self, "remove", remove)
        object.__setattr__(self, "position", position)

    @property
    def text(self) -> str:
        """The pattern as ``cat`` shows it (without the ``!``)."""
        return self.glob if self.module is None else f"{self.glob}:mod:{self.module}"

    @property
    def everything(self) -> bool:
        """A bare ``*``: every function, whatever its name or module."""
        return self.glob == "*" and self.module is None


class FilterCommand(Frozen, compared=("glob", "module", "command", "args", "count", "remove")):
    """A function command: ``[!]GLOB[:mod:MODULE]:COMMAND[:ARGS...][:COUNT]``.

    ``count`` is None for unlimited. ``key`` identifies the command for ``!`` removal.
    ``position`` is not compared.
    """

    __slots__ = ("glob", "module", "command", "args", "count", "remove", "position")
    glob: str
    module: str | None
    command: str
    args: tuple[str, ...]
    count: int | None
    remove: bool
    position: int

    def __init__(self, glob: str, module: str | None, command: str, args: tuple[str, ...] = (),
                 count: int | None = None, remove: bool = False, position: int = 0) -> None:
        object.__setattr__(self, "glob", glob)
        object.__setattr__(self, "module", module)
        object.__setattr__(self, "command", command)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "remove", remove)
        object.__setattr__(self, "position", position)

    @property
    def pattern(self) -> Pattern:
        return Pattern(self.glob, self.module, position=self.position)

    @property
    def key(self) -> tuple:
        return (self.glob, self.module, self.command, self.args)

    @property
    def text(self) -> str:
        """The command as ``cat set_ftrace_filter`` shows it (kernel format)."""
        parts = [self.pattern.text, self.command, *self.args]
        parts.append("unlimited" if self.count is None else f"count={self.count}")
        return ":".join(parts)


# --- parsing -------------------------------------------------------------------------------------
def compile_glob(glob: str, text: str = "", position: int = 0) -> re.Pattern[str]:
    """Translate an ftrace glob (``*``, ``?``, ``[...]`` with ``!``/``^`` negation) to a regex
    (use ``fullmatch``). ``text`` and ``position`` (where ``glob`` starts in it) locate errors.
    """
    import re  # (re is imported where a glob needs it: it costs ~7 ms of every start-up)

    return re.compile(_glob_regex(glob, text, position), re.DOTALL)


def _glob_regex(glob: str, text: str = "", position: int = 0) -> str:
    """The regex source of a glob. Negated classes never match a tab or newline (names hold
    neither), so the source also works line by line on the search index."""
    import re

    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            if not out or out[-1] != ".*":
                out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i + 1
            if j < n and glob[j] in "!^":
                j += 1
            if j < n and glob[j] == "]":  # a ']' right after '[' is a member
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:
                raise FilterError("unbalanced '[' in glob", text or glob, position + i)
            inner = glob[i + 1: j]
            negate = inner[:1] in ("!", "^")
            if negate:
                inner = inner[1:]
            last = len(inner) - 1
            members = "".join(
                "-" if ch == "-" and 0 < k < last else re.escape(ch) for k, ch in enumerate(inner)
            )
            cls = f"[^{members}\\t\\n]" if negate else f"[{members}]"
            try:
                re.compile(cls)
            except re.error as e:
                raise FilterError(f"bad character class: {e.msg}", text or glob,
                                  position + i) from None
            out.append(cls)
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _check_glob(glob: str, text: str, position: int) -> None:
    """Raise FilterError if ``glob`` is not one (a bad ``[...]`` class): compile_glob()'s
    checks, made only where a class may need them (most globs have none)."""
    if "[" in glob:
        compile_glob(glob, text, position)


def _parse_count(word: str, text: str, pos: int) -> int | None:
    if word == "unlimited":
        return None
    digits = word[6:] if word.startswith("count=") else word
    lo, hi = limits.COUNT
    count = limits.parse_digits(digits, 10, hi)
    if count is not None and count >= lo:
        return count
    raise FilterError(f"bad count {limits.shown(word)} (a number from {lo} to {hi})", text, pos)


def _parse_word(word: str, start: int, text: str) -> Pattern | FilterCommand:
    remove = word.startswith("!")
    body_start = start + 1 if remove else start
    body = word[1:] if remove else word
    if not body:
        raise FilterError("empty pattern after '!'", text, start)
    # Split on ':' keeping each field's position in text.
    fields: list[tuple[str, int]] = []
    pos = body_start
    for part in body.split(":"):
        fields.append((part, pos))
        pos += len(part) + 1
    glob = fields[0][0]
    if not glob:
        what = "':mod:'" if len(fields) > 1 and fields[1][0] == "mod" else "':'"
        raise FilterError(f"missing function glob before {what}", text, body_start)
    _check_glob(glob, text, body_start)
    module: str | None = None
    i = 1
    if len(fields) > 1 and fields[1][0] == "mod":
        if len(fields) < 3 or not fields[2][0]:
            at = fields[2][1] if len(fields) >= 3 else start + len(word)
            raise FilterError("missing module name after ':mod:'", text, at)
        module, mod_pos = fields[2]
        _check_glob(module, text, mod_pos)
        i = 3
    if i == len(fields):
        return Pattern(glob, module, remove, start)
    command, cmd_pos = fields[i]
    if not command:
        raise FilterError("missing command after ':'", text, cmd_pos)
    if command not in COMMANDS:
        raise FilterError(f"unknown command '{command}'", text, cmd_pos)
    nargs = COMMANDS[command]
    rest = fields[i + 1:]
    args: list[str] = []
    for k in range(nargs):
        if k >= len(rest) or not rest[k][0]:
            at = rest[k][1] if k < len(rest) else start + len(word)
            raise FilterError(f"{command} needs SYSTEM:EVENT", text, at)
        args.append(rest[k][0])
    rest = rest[nargs:]
    count: int | None = None
    if rest:
        count = _parse_count(rest[0][0], text, rest[0][1])
        if len(rest) > 1:
            raise FilterError(f"unexpected ':{rest[1][0]}'", text, rest[1][1] - 1)
    return FilterCommand(glob, module, command, tuple(args), count, remove, start)


def parse_filter_text(text: str) -> list[Pattern | FilterCommand]:
    """Parse one write into patterns and commands (syntax only; nothing is resolved)."""
    items: list[Pattern | FilterCommand] = []
    for word, start in _words(text):
        items.append(_parse_word(word, start, text))
    return items


def _words(text: str) -> Iterator[tuple[str, int]]:
    """The words of a write and where each starts, without its comments: a word that starts
    with '#' and the rest of its line."""
    line_start = 0
    for line in text.split("\n"):
        pos = 0
        for word in line.split():
            pos = line.find(word, pos)
            if word.startswith("#"):
                break
            yield word, line_start + pos
            pos += len(word)
        line_start += len(line) + 1


# --- matching ------------------------------------------------------------------------------------
def _keys(info: FunctionInfo) -> tuple[str, ...]:
    """The strings a pattern may match: name and qualname, with and without the suffix."""
    if info.suffix:
        n = len(info.suffix)
        return (info.name, info.qualname, info.name[:-n], info.qualname[:-n])
    return (info.name, info.qualname)


class _GlobSet:
    """Several globs tested together: exact names in a set, prefixes and suffixes through
    ``str.startswith``/``endswith`` with tuples, the rest as one alternation regex."""

    __slots__ = ("exact", "prefixes", "suffixes", "middles", "regex")

    def __init__(self, globs: Iterable[str]) -> None:
        exact: set[str] = set()
        prefixes: list[str] = []
        suffixes: list[str] = []
        middles: list[str] = []
        regexes: list[str] = []
        for g in globs:
            inner = g.strip("*")
            if not _has_glob(g):
                exact.add(g)
            elif _has_glob(inner):
                regexes.append(_glob_regex(g))
            elif g.startswith("*") and g.endswith("*"):
                middles.append(inner)  # also "*" alone: "" is in everything
            elif g.endswith("*"):
                prefixes.append(inner)
            else:
                suffixes.append(inner)
        self.exact = frozenset(exact)
        self.prefixes = tuple(prefixes)
        self.suffixes = tuple(suffixes)
        self.middles = tuple(middles)
        self.regex = None
        if regexes:
            import re

            self.regex = re.compile("|".join(f"(?:{r})" for r in regexes), re.DOTALL)

    def hit(self, keys: tuple[str, ...]) -> bool:
        exact, prefixes, suffixes, middles, regex = (
            self.exact, self.prefixes, self.suffixes, self.middles, self.regex)
        for k in keys:
            if k in exact:
                return True
            if prefixes and k.startswith(prefixes):
                return True
            if suffixes and k.endswith(suffixes):
                return True
            for m in middles:
                if m in k:
                    return True
            if regex is not None and regex.fullmatch(k):
                return True
        return False


def _module_test(module: str) -> Callable[[str], bool]:
    if _has_glob(module):
        rx = compile_glob(module)
        return lambda m: rx.fullmatch(m) is not None
    dotted = module + "."
    return lambda m: m == module or m.startswith(dotted)


class _Compiled:
    """One pattern, compiled: ``test(info, keys)``."""

    __slots__ = ("globs", "module")

    def __init__(self, p: Pattern) -> None:
        self.globs = _GlobSet((p.glob,))
        self.module = _module_test(p.module) if p.module is not None else None

    def test(self, info: FunctionInfo, keys: tuple[str, ...]) -> bool:
        if self.module is not None and not self.module(info.module):
            return False
        return self.globs.hit(keys)


class _Entry(Row):
    """A pattern stored in a hash: an inclusion or (after ``!``) an exclusion. (The
    internal records here are Rows: each dataclass costs ~1 ms of every start-up.)"""

    pattern: Pattern
    include: bool
    compiled: _Compiled

    @property
    def text(self) -> str:
        return self.pattern.text

    @property
    def line(self) -> str:
        return self.text if self.include else "!" + self.text


if TYPE_CHECKING:
    Matcher = Callable[[FunctionInfo], bool]


def _match_every(info: FunctionInfo) -> bool:
    return True


def _compile_hash(entries: tuple[_Entry, ...]) -> Matcher | None:
    """One predicate for a whole hash (None when the hash is empty)."""
    if not entries:
        return None
    if all(e.include for e in entries):
        if any(e.pattern.everything for e in entries):
            return _match_every  # -l '*': no need to look at the function
        free = _GlobSet(e.pattern.glob for e in entries if e.pattern.module is None)
        scoped = tuple(e.compiled for e in entries if e.pattern.module is not None)

        def match_any(info: FunctionInfo) -> bool:
            keys = _keys(info)
            if free.hit(keys):
                return True
            for c in scoped:
                if c.test(info, keys):
                    return True
            return False

        return match_any
    # With exclusions the order matters, as in the kernel's hash: the last entry that matches
    # a function decides whether it is in.
    ordered = tuple((e.include, e.compiled) for e in reversed(entries))

    def match_last(info: FunctionInfo) -> bool:
        keys = _keys(info)
        for include, c in ordered:
            if c.test(info, keys):
                return include
        return False

    return match_last


class _State(Row):
    """Everything a write produces, swapped in with one assignment (readers take no lock)."""

    filter: tuple[_Entry, ...] = ()
    notrace: tuple[_Entry, ...] = ()
    commands: tuple[FilterCommand, ...] = ()
    filter_match: Matcher | None = None
    notrace_match: Matcher | None = None


class FunctionFilter:
    """One user's filter and notrace hashes (an ``ftrace_ops``' ``set_ftrace_filter`` and
    ``set_ftrace_notrace``), plus the function commands written to its filter."""

    def __init__(self, filter: Iterable[str] = (), notrace: Iterable[str] = (),
                 registry: Registry | None = None) -> None:
        self.registry = registry if registry is not None else default_registry()
        self._lock = threading.Lock()
        self._state = _State()
        self._generation = 0
        self._select_cache: tuple[tuple[int, int, bool], dict[int, CodeType]] | None = None
        if isinstance(filter, str):
            filter = (filter,)
        if isinstance(notrace, str):
            notrace = (notrace,)
        f_text = "\n".join(filter)
        n_text = "\n".join(notrace)
        if f_text.strip():
            self.write_filter(f_text)
        if n_text.strip():
            self.write_notrace(n_text)

    # --- the tracefs-like interface -------------------------------------------------------------
    def write_filter(self, text: str, append: bool = False) -> None:
        """``echo text > set_ftrace_filter`` (or ``>>`` with ``append``); all or nothing."""
        self._write(text, append, notrace=False)

    def write_notrace(self, text: str, append: bool = False) -> None:
        """``echo text > set_ftrace_notrace`` (or ``>>`` with ``append``); all or nothing."""
        self._write(text, append, notrace=True)

    def snapshot(self) -> object:
        """The filter as it is now, for :meth:`restore` (to undo a write whose effects
        elsewhere failed)."""
        return self._state

    def restore(self, snapshot: object) -> None:
        """Put back what :meth:`snapshot` returned."""
        assert isinstance(snapshot, _State)
        with self._lock:
            self._state = snapshot
            self._generation += 1

    def read_filter(self) -> str:
        """What ``cat set_ftrace_filter`` shows: one pattern per line, then the commands."""
        st = self._state
        lines = [e.line for e in st.filter] or [_FILTER_EMPTY]
        lines += [c.text for c in st.commands]
        return "".join(line + "\n" for line in lines)

    def read_notrace(self) -> str:
        """What ``cat set_ftrace_notrace`` shows."""
        lines = [e.line for e in self._state.notrace] or [_NOTRACE_EMPTY]
        return "".join(line + "\n" for line in lines)

    # --- queries --------------------------------------------------------------------------------
    @property
    def filter_patterns(self) -> list[str]:
        """The filter hash's lines (exclusions start with ``!``)."""
        return [e.line for e in self._state.filter]

    @property
    def notrace_patterns(self) -> list[str]:
        return [e.line for e in self._state.notrace]

    @property
    def commands(self) -> list[FilterCommand]:
        """The function commands, in the order written."""
        return list(self._state.commands)

    @property
    def generation(self) -> int:
        """Bumped by every successful write."""
        return self._generation

    @property
    def is_empty(self) -> bool:
        """Both hashes are empty: every function matches."""
        st = self._state
        return not st.filter and not st.notrace

    def matches(self, info: FunctionInfo) -> bool:
        """(filter empty or some filter pattern selects it) and no notrace pattern selects it."""
        st = self._state
        if st.filter_match is not None and not st.filter_match(info):
            return False
        return st.notrace_match is None or not st.notrace_match(info)

    @property
    def takes_every(self) -> bool:
        """Whether every function matches, whatever its name or module: no filter pattern
        or a bare ``*``, and no notrace pattern."""
        st = self._state
        return st.notrace_match is None and st.filter_match in (None, _match_every)

    def matching(self, infos: list[FunctionInfo]) -> list[FunctionInfo]:
        """Those of ``infos`` that :meth:`matches` takes, all at once where the filter takes
        every function (``-l '*'``, or none given, and no notrace: a module's worth of new
        functions is then not looked at one by one)."""
        if self.takes_every:
            return list(infos)
        return [info for info in infos if self.matches(info)]

    def select(self) -> set[CodeType]:
        """The code objects of every registry function that matches.

        Beware: code objects compare *by value* (name, first line, bytecode, constants, but not
        filename or qualname), so two distinct functions can collapse into one set element
        (``bz2.BZ2File.tell`` and ``lzma.LZMAFile.tell`` do). Use :meth:`select_by_id` when
        every code object must be kept.
        """
        return set(self.select_by_id().values())

    def select_by_id(self, complete: bool = True) -> dict[int, CodeType]:
        """Every matching registry function's code object, keyed by ``id(code)``.

        ``complete``: the registry first registers every function the filter can match.
        False: only the functions registered so far (a hook's user, told of the others by
        the registry's subscription as their modules are registered: see
        :meth:`Registry.functions`)."""
        # Key first: functions registered meanwhile make the next call recompute, never miss.
        key = (self.registry.generation, self._generation, complete)
        functions = self._functions(complete)
        cached = self._select_cache
        if cached is not None and cached[0] == key:
            return dict(cached[1])
        chosen = {id(info.code): info.code for info in functions if self.matches(info)}
        self._select_cache = (key, chosen)
        return dict(chosen)

    def select_infos(self, complete: bool = True) -> list[FunctionInfo]:
        """Every matching registry function, sorted by name (``complete``: as in
        :meth:`select_by_id`)."""
        return [info for info in self._functions(complete) if self.matches(info)]

    def _functions(self, complete: bool) -> list[FunctionInfo]:
        return self.registry.functions(self.scope() if complete else no_modules)

    def scope(self) -> Scope | None:
        """Which modules can hold a function the filter hash selects (the registry completes
        just those before a selection); None: any module (an empty hash, a pattern without
        ``:mod:``, or with a glob in it). The notrace hash only takes functions away."""
        if any(e.include and e.pattern.everything for e in self._state.notrace):
            return no_modules  # nothing is selected
        modules = []
        for e in self._state.filter:
            if e.include:
                module = _pattern_module(e.pattern)
                if module is None:
                    return None
                modules.append(module)
        return Within(modules) if modules else None

    def pending(self) -> list[str]:
        """Patterns and commands that select nothing yet (their module is not imported)."""
        st = self._state
        registry = self.registry
        out = [e.text for e in (*st.filter, *st.notrace)
               if e.include and not _index_for(registry, e.pattern).any(e.pattern)]
        out += [c.text for c in st.commands
                if not _index_for(registry, c.pattern).any(c.pattern)]
        return out

    # --- writing --------------------------------------------------------------------------------
    def _write(self, text: str, append: bool, notrace: bool) -> None:
        items = parse_filter_text(text)
        with self._lock:
            st = self._state
            entries = list(st.notrace if notrace else st.filter) if append else []
            # As in the kernel, '>' empties the hash but leaves the commands: they go with '!'.
            commands = list(st.commands)
            resolver = _Resolver(self.registry, text)
            for item in items:
                if isinstance(item, FilterCommand):
                    if notrace:
                        raise FilterError("commands only go to set_ftrace_filter", text,
                                          item.position + len(item.pattern.text) + 1
                                          + (1 if item.remove else 0))
                    _apply_command(commands, item, resolver)
                else:
                    _apply_pattern(entries, item, resolver)
            new_entries = tuple(entries)
            if notrace:
                st = _State(st.filter, new_entries, st.commands, st.filter_match,
                            _compile_hash(new_entries))
            else:
                st = _State(new_entries, st.notrace, tuple(commands),
                            _compile_hash(new_entries), st.notrace_match)
            self._state = st
            self._generation += 1

    def __repr__(self) -> str:
        return (f"<FunctionFilter filter={self.filter_patterns!r} "
                f"notrace={self.notrace_patterns!r} commands={len(self._state.commands)}>")


class _Index:
    """All match keys of a registry as one string, ``module<TAB>key`` per line, so that a write
    checks each pattern with one regex search in C instead of a Python loop over functions."""

    def __init__(self, functions: list[FunctionInfo]) -> None:
        lines: list[str] = []
        owners: list[FunctionInfo] = []
        starts: list[int] = []
        by_key: dict[str, list[FunctionInfo]] = {}
        pos = 1  # the text starts with a newline: every line is preceded by one
        for info in functions:
            for k in _keys(info):
                line = f"{info.module}\t{k}"
                lines.append(line)
                owners.append(info)
                starts.append(pos)
                pos += len(line) + 1
                by_key.setdefault(k, []).append(info)
        self.text = "\n" + "\n".join(lines) + "\n"
        self.owners = owners
        self.starts = starts
        self.by_key = by_key  # exact patterns without a module need no search

    @staticmethod
    def regex(p: Pattern) -> re.Pattern[str]:
        # Regexes that start with literal characters let the engine skip to candidate lines.
        import re

        glob = _glob_regex(p.glob)
        if p.module is None:
            return re.compile(f"\t(?:{glob})(?=\n)")
        if _has_glob(p.module):
            mod = _glob_regex(p.module)
        else:
            mod = re.escape(p.module) + r"(?:\.[^\t\n]*)?"
        return re.compile(f"\n(?:{mod})\t(?:{glob})(?=\n)")

    def any(self, p: Pattern) -> bool:
        if p.module is None and not _has_glob(p.glob):
            return p.glob in self.by_key
        module = _pattern_module(p)
        if p.glob == "*" and module is not None:  # a module's every function (the default
            # filter's '*:mod:__main__'): a line of it or of a submodule, no regex needed
            return f"\n{module}\t" in self.text or f"\n{module}." in self.text
        return self.regex(p).search(self.text) is not None

    def hits(self, p: Pattern) -> list[FunctionInfo]:
        out: dict[int, FunctionInfo] = {}
        if p.module is None and not _has_glob(p.glob):
            for info in self.by_key.get(p.glob, ()):
                out[id(info)] = info
            return list(out.values())
        starts, owners = self.starts, self.owners
        import bisect  # (start-up: test_startup)

        for m in self.regex(p).finditer(self.text):
            info = owners[bisect.bisect_right(starts, m.end() - 1) - 1]
            out[id(info)] = info
        return list(out.values())


#: id(registry) -> (a weak reference to it, its generation, its index). (Not a
#: weakref.WeakKeyDictionary: the weakref module is ~0.5 ms of a start-up, and a program that
#: imports it would find it imported or not depending on the filter.)
_indexes: dict[int, tuple[ref[Registry], int, _Index]] = {}
_indexes_lock = threading.Lock()


def _pattern_module(p: Pattern) -> str | None:
    """The module whose functions (its own and its submodules') are all a pattern can match,
    or None: any module's."""
    return None if p.module is None or _has_glob(p.module) else p.module


def _index_for(registry: Registry, pattern: Pattern | None = None) -> _Index:
    """The index of the registry's functions, complete for what ``pattern`` can match
    (None: everything)."""
    module = None if pattern is None else _pattern_module(pattern)
    registry.complete(None if module is None else Within((module,)))
    generation = registry.generation
    functions = registry.functions(no_modules)  # what the call above completed
    key = id(registry)
    with _indexes_lock:
        cached = _indexes.get(key)
        if cached is not None and cached[0]() is registry \
                and cached[1] == generation == registry.generation:
            return cached[2]
    index = _Index(functions)
    with _indexes_lock:  # (the entry goes with the registry)
        _indexes[key] = (ref(registry, lambda _r: _indexes.pop(key, None)), generation, index)
    return index


class _Resolver:
    """Answers "does this pattern select anything (now or once its module loads)?" for a
    write."""

    def __init__(self, registry: Registry, text: str) -> None:
        self.registry = registry
        self.text = text

    def hits(self, pattern: Pattern) -> list[FunctionInfo]:
        return _index_for(self.registry, pattern).hits(pattern)

    def check(self, pattern: Pattern) -> None:
        """Raise unless the pattern selects something or may once a module is imported."""
        if pattern.everything and self.registry.has_functions():
            return  # it selects every function, and some exist: no need to list them
        # Asked again after may_load_later(): the first index takes a module that is not
        # imported to hold no function (no heap scan at start-up), but code exec'd with that
        # __name__ does; the scan may_load_later() makes to list modules finds it, so the
        # answer does not depend on whether anything scanned before.
        if not _index_for(self.registry, pattern).any(pattern) and \
                not self.may_load_later(pattern) and \
                not _index_for(self.registry, pattern).any(pattern):
            raise FilterError(f"no function matches '{pattern.text}'{_later_hint(pattern)}",
                              self.text, pattern.position + (1 if pattern.remove else 0))

    def may_load_later(self, pattern: Pattern) -> bool:
        """Whether the pattern names a module that is not imported yet (never imports), or
        names functions of one whose body has not run yet (which may generate them)."""
        registry = self.registry
        if pattern.module is not None:
            # sys.modules first: the registry's modules may need a scan of the heap
            if _has_glob(pattern.module):
                rx = compile_glob(pattern.module)
                return not any(rx.fullmatch(m) for m in sys.modules) and \
                    not any(rx.fullmatch(m) for m in registry.modules())
            # a package whose modules were all prepared (-m) says for sure what it holds
            return pattern.module not in sys.modules and \
                pattern.module not in registry.modules() and \
                not registry.covers(pattern.module)
        parts = pattern.glob.split(".")
        if len(parts) < 2:
            return False
        literal: list[str] = []
        for part in parts:
            if _has_glob(part) or not part.isidentifier():
                break
            literal.append(part)
        if any(self.registry.may_generate(".".join(literal[:i]))
               for i in range(1, len(literal))):
            return True
        # Walk the dotted prefix down through imported packages; the first module that is not
        # imported decides. find_spec on it imports nothing: its parent is already imported.
        for i in range(1, len(literal) + 1):
            name = ".".join(literal[:i])
            if name in sys.modules or registry.prepared(name):
                continue
            if registry.covers(name):
                return False  # not among the prepared modules of its package: no such module
            if i > 1 and not hasattr(sys.modules.get(".".join(literal[: i - 1])), "__path__"):
                return False
            try:
                import importlib.util  # (start-up: test_startup)

                return importlib.util.find_spec(name) is not None
            except Exception:  # broken finders, odd names: not findable
                return False
        return False


def _later_hint(p: Pattern) -> str:
    """Advice for a glob that matches none of the functions loaded so far: functions of a
    module the program has not imported yet (a test module pytest collects, a plugin) are
    selected by naming the module, as the kernel's ':mod:' names a module not loaded yet."""
    if p.module is not None or not _has_glob(p.glob):
        return ""
    head, dot, rest = p.glob.partition(".")
    if not dot:  # names are MODULE.QUALNAME: this glob names modules
        return (f" (among the modules loaded so far; for modules the program imports later:"
                f" '*:mod:{p.glob}')")
    if _has_glob(head):
        return (f" (among the modules loaded so far; for a module the program imports later,"
                f" name it: '{rest}:mod:MODULE')")
    return ""


def _apply_pattern(entries: list[_Entry], p: Pattern, resolver: _Resolver) -> None:
    text = p.text
    compiled = _Compiled(p)
    if not p.remove:
        resolver.check(p)
        entries[:] = [e for e in entries if e.text != text]
        entries.append(_Entry(p, True, compiled))
        return
    had = any(e.include and e.text == text for e in entries)
    entries[:] = [e for e in entries if e.text != text]
    if not any(e.include for e in entries):
        entries.clear()  # nothing left to remove from (an empty hash means "everything")
        return
    # Like the kernel, '!' takes functions out of the hash: record an exclusion if the rest of
    # the hash still selects some function the pattern matches (or it names a module that is not
    # imported yet). Otherwise removing the pattern itself was all there was to do.
    hits = resolver.hits(p)
    if hits:
        remaining = _compile_hash(tuple(entries))
        assert remaining is not None
        needed = any(remaining(f) for f in hits)
    else:
        needed = not had and resolver.may_load_later(p)
    if needed:
        entries.append(_Entry(p, False, compiled))


def _apply_command(commands: list[FilterCommand], c: FilterCommand, resolver: _Resolver) -> None:
    key = c.key
    if c.remove:
        commands[:] = [x for x in commands if x.key != key]
        return
    resolver.check(c.pattern)
    stored = FilterCommand(c.glob, c.module, c.command, c.args, c.count, False, c.position)
    for i, x in enumerate(commands):
        if x.key == key:
            commands[i] = stored  # writing it again updates the count
            return
    commands.append(stored)
