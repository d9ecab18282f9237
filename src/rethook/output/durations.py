"""ftrace's duration column: the number format and the overhead marks of function_graph (and
the colours a terminal shows them in)."""

from __future__ import annotations

#: Overhead marks, checked in order; a duration strictly greater than the bound gets the mark.
MARKS: tuple[tuple[int, str], ...] = (
    (1_000_000_000, "$"),  # 1 s
    (100_000_000, "@"),  # 100 ms
    (10_000_000, "*"),  # 10 ms
    (1_000_000, "#"),  # 1 ms
    (100_000, "!"),  # 100 us
    (10_000, "+"),  # 10 us
)


#: Rich styles of the marks, where a terminal shows colours (cli/term.py).
MARK_STYLES: dict[str, str] = {"+": "cyan", "!": "yellow", "#": "bold yellow", "*": "red",
                               "@": "bold red", "$": "bold magenta"}


def mark(duration_ns: int) -> str:
    for bound, sym in MARKS:
        if duration_ns > bound:
            return sym
    return " "


def graph_duration(duration_ns: int) -> str:
    """``12.051 us  `` : microseconds with up to three decimals, 7 significant digits at most,
    padded so the column is always as wide (the kernel's trace_print_graph_duration)."""
    usecs, nsecs = divmod(max(0, int(duration_ns)), 1000)
    text = str(usecs)
    length = len(text)
    if length < 7:
        decimals = f"{nsecs:03d}"[: min(4, 7 - length)]
        text += "." + decimals
        length += len(decimals) + 1
    return text + " us " + " " * max(0, 8 - length)
