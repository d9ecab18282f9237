"""Text from the traced program or from a trace file, made safe to show on a terminal.

Function names, thread names, return values, histogram keys and the values a trace file's
metadata holds come from code and files rethook does not control: a thread named
``"\\x1b]0;owned\\a"`` must reach the user's terminal as those characters written out, never
as an escape sequence. Every text view passes such strings through :func:`printable`, which
leaves printable text as it is (one ``str.isprintable`` call, the common case) and writes
every other character the way a Python repr does (``\\x1b``, ``\\u202e``), as probe string
values already are.

This module imports nothing of rethook's: every layer may use it.
"""

from __future__ import annotations


def _escape(c: str) -> str:
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    if n < 0x10000:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


def printable(text: str) -> str:
    """``text`` with every non-printable character (controls, format characters such as
    bidirectional overrides, line and paragraph separators, tabs, newlines) escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def printable_lines(text: str) -> str:
    """Like :func:`printable` for text made of lines: the newlines stay."""
    return "\n".join(map(printable, text.split("\n")))
