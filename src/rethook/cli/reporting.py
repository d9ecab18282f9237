"""``rethook report``, ``rethook export`` and ``rethook hist``: reading trace files back.

``report`` streams: events are decoded one chunk at a time and rendered as they come, so a
trace of millions of events prints in bounded memory. Thread names, per-thread counts and event
formats come first from a quick pass that checks chunks without decoding events.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable
from typing import IO

import click

from rethook.buffer.tracefile import TraceFileError, TraceReader
from rethook.output.text import FunctionRenderer, Threads, renderer_for
from rethook.session import human_size
from rethook.tracers.base import OPTION_DEFAULTS, OptionError, Options

#: Lines gathered before one write to stdout.
WRITE_BATCH = 2048

EXPORT_SUFFIX = {"perfetto": ".perfetto-trace", "folded": ".folded"}


def _error(text: str) -> None:
    click.echo(f"rethook: error: {text}", err=True)


def display_options(recorded: dict, overrides: Iterable[str]) -> dict[str, bool]:
    """The options a trace was recorded with, then ``-O`` overrides (validated)."""
    opts = Options({k: v for k, v in recorded.items() if k in OPTION_DEFAULTS})
    try:
        for word in overrides:
            opts.write(word)
    except OptionError as e:
        raise click.UsageError(f"-O: {e}") from None
    return opts.as_dict()


def _describer(probes: dict[str, str] | None):
    """How the trace's probe events print: from their definitions, kept in the meta."""
    from rethook.output.text import describer

    if not probes:
        return describer()
    from rethook.probes.events import ProbeFormatter

    try:
        return describer(ProbeFormatter(probes).describe)
    except Exception:  # noqa: BLE001 - a definition this version cannot parse: print raw fields
        return describer()


def report_file(path: str, overrides: Iterable[str], out: IO[str] | None = None) -> int:
    """Print the trace at ``path``; returns the exit status (1 if the file is damaged)."""
    out = out or sys.stdout
    overrides = list(overrides)
    display_options({}, overrides)  # a bad -O is a usage error, whatever the file
    with warnings.catch_warnings():
        # Not strict: damage ends a pass with a warning (silenced) and is kept in .damage, so
        # everything before it is printed; the error is reported once, at the end.
        warnings.simplefilter("ignore")
        try:
            reader = TraceReader(path, strict=False)
        except TraceFileError as e:  # not a trace file, or its header is damaged
            _error(str(e))
            return 1
        except OSError as e:
            _error(f"{path}: {e.strerror}")
            return 1
        with reader:
            try:
                _render(reader, overrides, out)
            except BrokenPipeError:
                # the reader went away (report | head): stop quietly, as cat would
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, out.fileno())
                return 0
    if reader.damage is not None:
        _error(str(reader.damage))
        return 1
    return 0


def _render(reader: TraceReader, overrides: list[str], out: IO[str]) -> None:
    # A quick pass (no event decoding) gives thread names, counts and formats first.
    threads, stats, formats = reader.threads, reader.stats, reader.formats
    meta = reader.meta
    tracer = meta.get("tracer", "function_graph")
    opts = display_options(meta.get("options", {}), overrides)
    renderer = renderer_for(tracer, formats, Threads(threads), opts,
                            describe=_describer(meta.get("probe_events")))
    if isinstance(renderer, FunctionRenderer):
        entries = sum(s.get("entries", 0) + s.get("read", 0) for s in stats.values())
        written = sum(s.get("written", 0) for s in stats.values())
        renderer.stats = (entries, written)
        header = renderer.header(tracer)
    else:
        header = renderer.header()
    write = out.write
    write(header)
    lines: list[str] = []
    feed = renderer.feed
    for ev in reader.events(lost=True):
        lines.extend(feed(ev))
        if len(lines) >= WRITE_BATCH:
            write("\n".join(lines) + "\n")
            lines.clear()
    lines.extend(renderer.flush())
    if lines:
        write("\n".join(lines) + "\n")
    out.flush()


def export_file(path: str, fmt: str, output: str | None) -> int:
    """Convert the trace at ``path`` to ``fmt``; returns the exit status."""
    if fmt == "html":
        from rethook.cli.viewing import view_file

        return view_file(path, output)
    try:
        if fmt == "perfetto":
            from rethook.output.perfetto import write_perfetto as write
        else:
            from rethook.output.folded import write_folded as write
    except ImportError as e:
        _error(f"the {fmt} exporter is not available ({e})")
        return 1
    if output is None:
        output = os.path.splitext(path)[0] + EXPORT_SUFFIX[fmt]
    binary = fmt == "perfetto"
    try:
        reader = TraceReader(path)
    except TraceFileError as e:
        _error(str(e))
        return 1
    to_stdout = output == "-"
    try:
        with reader:
            if to_stdout:
                target = sys.stdout.buffer if binary else sys.stdout
                count = write(reader, target)
                target.flush()
            else:
                mode = "wb" if binary else "w"
                with open(output, mode, **({} if binary else {"encoding": "utf-8"})) as f:
                    count = write(reader, f)
    except TraceFileError as e:
        _error(f"{e} (the export is incomplete)")
        return 1
    except OSError as e:
        _error(f"{output}: {e.strerror or e}")
        return 1
    if not to_stdout:
        unit = "packets" if binary else "stacks"
        size = human_size(os.path.getsize(output))
        click.echo(f"rethook: {count:,} {unit} written to {output} ({size})", err=True)
    return 0


def hist_file(path: str, only: Iterable[str]) -> int:
    """``rethook hist``: the histograms a recording saved, one section per event."""
    try:
        meta = TraceReader(path, strict=False).all_meta
    except TraceFileError as e:
        _error(str(e))
        return 1
    hists: dict[str, str] = meta.get("histograms") or {}
    wanted = list(only)
    unknown = [name for name in wanted if name not in hists]
    if unknown:
        have = ", ".join(sorted(hists)) or "none"
        raise click.UsageError(f"-e: no histogram for {', '.join(unknown)} in {path} "
                               f"(recorded: {have})")
    if not hists:
        _error(f"{path}: the recording has no histograms (add -R 'hist:keys=...' to an -e)")
        return 1
    out = []
    for name in wanted or sorted(hists):
        out.append(f"# {name}\n{hists[name]}")
    click.echo("\n".join(out), nl=False)
    return 0
