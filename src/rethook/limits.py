"""The range of every number rethook takes from a user, and the conversion that enforces it.

Each numeric input -- a command-line option, a tracefs file, a number inside a filter
command, probe definition, event filter or trigger -- is checked where it enters against a
range. The ranges that belong to no grammar in particular are here; those of one grammar stay
with it (``MAX_MAXACTIVE`` in probes/dynevent.py, the hist ``size`` in probes/hist.py...).
docs/cli.md and docs/tracefs.md list them all, and a test holds those tables to the code.

A number outside its range is refused like any bad input: an error naming the input, the
range and, where the input has a grammar, the position. Conversion goes through
:func:`parse_digits`, which never hands ``int()`` more digits than the range's bound has:
CPython refuses to convert strings of more than 4300 digits (a ValueError that would
otherwise escape as a traceback), and a number that long is out of every range anyway.

This module imports nothing of rethook's: every layer may use it.
"""

from __future__ import annotations

import os

U64_MAX = (1 << 64) - 1
S64_MIN = -(1 << 63)
S64_MAX = (1 << 63) - 1
UINT_MAX = (1 << 32) - 1

#: ``buffer_size_kb`` and ``-b``: KiB per thread. Bounded further by the memory there is
#: (:func:`memory_available`): a thread's buffer must fit in it.
BUFFER_KB = (1, 1 << 32)
#: record's ``--blocking-timeout``, in milliseconds: up to an hour.
BLOCKING_MS = (0, 3_600_000)
#: ``max_graph_depth`` and ``--max-graph-depth``: 0 (no limit) up to the kernel's unsigned int.
MAX_GRAPH_DEPTH = (0, UINT_MAX)
#: ``tracing_thresh`` and ``--tracing-thresh``, in microseconds: in nanoseconds it fits s64.
TRACING_THRESH_US = (0, S64_MAX // 1000)
#: Counts of function commands (``FUNC:traceon:N``): the kernel's unsigned long, 0 refused.
COUNT = (1, U64_MAX)
#: Counts of event triggers (``traceon:N``): the kernel's unsigned long (0: never fires).
TRIGGER_COUNT = (0, U64_MAX)
#: Integer immediates (``\\42``) and integer subscripts (``arg[3]``) of fetch args: what s64
#: or u64 holds.
IMMEDIATE = (S64_MIN, U64_MAX)

_DIGITS = {2: frozenset("01"), 8: frozenset("01234567"), 10: frozenset("0123456789"),
           16: frozenset("0123456789abcdefABCDEF")}


def _width(value: int, base: int) -> int:
    """Digits of ``value`` written in ``base``."""
    n = 1
    while value >= base:
        value //= base
        n += 1
    return n


def parse_digits(digits: str, base: int = 10, hi: int = U64_MAX) -> int | None:
    """``int(digits, base)`` if ``digits`` are all digits of ``base`` (no sign, no
    underscores, ASCII only) and the value is at most ``hi``; else None."""
    ok = _DIGITS[base]
    if not digits or not all(c in ok for c in digits):
        return None
    body = digits.lstrip("0") or "0"
    if len(body) > _width(hi, base):
        return None
    value = int(body, base)
    return value if value <= hi else None


def parse_int(text: str, lo: int, hi: int) -> int | None:
    """A decimal integer with an optional sign (surrounding blanks allowed), if it lies in
    ``[lo, hi]``; else None (also for text that is not such an integer)."""
    s = text.strip()
    sign = -1 if s[:1] == "-" else 1
    if s[:1] in "+-":
        s = s[1:]
    value = parse_digits(s, 10, max(hi, -lo, 0))
    if value is None:
        return None
    value *= sign
    return value if lo <= value <= hi else None


class NumberError(ValueError):
    """Text that is not an integer in its range; the message says which of the two."""


def checked_int(text: str, bounds: tuple[int, int]) -> int:
    """The decimal integer ``text`` holds, which must lie within ``bounds``; raises
    :class:`NumberError` saying what is wrong (not an integer, or out of range)."""
    value = parse_int(text, *bounds)
    if value is None:
        word = text.strip()
        digits = word[1:] if word[:1] in "+-" else word
        if digits and all(c in _DIGITS[10] for c in digits):
            raise NumberError(f"{shown(word)} is out of range ({range_text(*bounds)})")
        raise NumberError(f"expected an integer, got {shown(word)}")
    return value


def range_text(lo: int, hi: int) -> str:
    """``must be LO to HI``: how every range error states the range."""
    return f"must be {lo} to {hi}"


def shown(text: str, most: int = 24) -> str:
    """A user's number as an error message quotes it: long ones cut, their length said."""
    text = text.strip()
    if len(text) <= most:
        return repr(text)
    return f"{text[:most]!r}... ({len(text)} characters)"


def memory_available() -> int | None:
    """Bytes this process can still allocate, as well as it can be told: the kernel's
    MemAvailable, lowered by the address-space and data limits (``ulimit -v``, ``-d``)
    less what is mapped already. None where none of that can be read."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    limits = _soft_limits()
    if any(limit is not None for limit in limits):
        for limit, used in zip(limits, _mapped_bytes(), strict=True):
            if limit is not None:
                found.append(max(0, limit - used))
    return min(found) if found else None


#: /proc/self/limits' rows (the kernel pads each name to 25 characters) for the
#: address-space and data limits (``ulimit -v``, ``-d``), and the resource module's names
_LIMITS = ((b"Max address space", "RLIMIT_AS"), (b"Max data size", "RLIMIT_DATA"))


def _soft_limits() -> list[int | None]:
    """The soft address-space and data limits in bytes, None for unlimited or unknown. From
    /proc/self/limits (Linux), else the resource module: a C extension, whose loading would
    be ~0.2 ms more of every start-up."""
    try:
        with open("/proc/self/limits", "rb") as f:
            rows = {row[:25].strip(): row[25:].split() for row in f}
        softs = [rows[name][0] for name, _ in _LIMITS]
        return [None if soft == b"unlimited" else int(soft) for soft in softs]
    except (OSError, ValueError, KeyError, IndexError):
        pass
    try:
        import resource

        softs = [resource.getrlimit(getattr(resource, name))[0] if hasattr(resource, name)
                 else resource.RLIM_INFINITY for _, name in _LIMITS]
        return [None if soft == resource.RLIM_INFINITY else soft for soft in softs]
    except (ImportError, OSError, ValueError):
        return [None for _ in _LIMITS]


def _mapped_bytes() -> tuple[int, int]:
    """(address space, data segment) in use, in bytes (Linux); zeros where unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        page = os.sysconf("SC_PAGE_SIZE")
        return int(fields[0]) * page, int(fields[5]) * page
    except (OSError, ValueError, IndexError):
        return 0, 0
