"""``rethook report``, ``rethook export`` and ``rethook hist``: reading trace files back.

``report`` streams: events are decoded one chunk at a time and rendered as they come, so a
trace of millions of events prints in bounded memory. Thread names, per-thread counts and event
formats come first from a quick pass that checks chunks without decoding events.
"""

from __future__ import annotations

import importlib
import os
import stat
import sys
import tempfile
import warnings
from collections.abc import Iterable
from typing import IO

import click

from rethook.buffer.tracefile import TraceFileError, TraceFileWarning
from rethook.buffer.traceread import TraceReader
from rethook.cli.exports import EXPORTERS
from rethook.output.text import FunctionRenderer, Threads, probe_describer, renderer_for
from rethook.printable import printable, printable_lines
from rethook.runner.observers import human_size
from rethook.tracers.base import OPTION_DEFAULTS, OptionError, Options

#: Lines gathered before one write to stdout.
WRITE_BATCH = 2048



def _error(text: str) -> None:
    from rethook.cli.term import error

    error(text)


def _damage_status(damage: TraceFileError | None, path: str) -> int:
    """Report damage met while reading: a file that merely stops early (the recording was
    killed, or is still going on) is a warning and status 0, since everything in it was
    read; other damage is an error, status 1."""
    if damage is None:
        return 0
    if damage.truncated:
        click.echo(f"rethook: warning: {path}: the recording has no end (its END chunk is "
                   f"missing: killed, or still running?); shown up to byte offset "
                   f"{damage.offset}, the last complete chunk", err=True)
        return 0
    _error(str(damage))
    return 1


def display_options(recorded: dict, overrides: Iterable[str]) -> dict[str, bool]:
    """The options a trace was recorded with, then ``-O`` overrides (validated)."""
    opts = Options({k: v for k, v in recorded.items() if k in OPTION_DEFAULTS})
    try:
        for word in overrides:
            opts.write(word)
    except OptionError as e:
        raise click.UsageError(f"-O: {e}") from None
    return opts.as_dict()


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
                _render(reader, overrides, out, _paint(out))
            except BrokenPipeError:
                # the reader went away (report | head): stop quietly, as cat would
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, out.fileno())
                return 0
            except OSError as e:  # reading the file or writing the report
                _error(f"{e.filename or path}: {e.strerror or e}")
                return 1
            except click.UsageError:
                raise
            except Exception as e:  # noqa: BLE001 - events well-formed but impossible
                _error(str(unreadable(reader, e)))
                return 1
    return _damage_status(reader.damage, path)


def _paint(out: IO[str]) -> dict[str, tuple[str, str]] | None:
    """Colours for the report, when it goes to a colour terminal (cli/term.py)."""
    from rethook.cli.term import colours, text_paint

    con = colours(out)
    return text_paint(con) if con is not None else None


def _render(reader: TraceReader, overrides: list[str], out: IO[str],
            paint: dict[str, tuple[str, str]] | None = None) -> None:
    # A quick pass (no event decoding) gives thread names, counts and formats first.
    threads, stats, formats = reader.threads, reader.stats, reader.formats
    meta = reader.meta
    tracer = meta.get("tracer", "function_graph")
    opts = display_options(meta.get("options", {}), overrides)
    renderer = renderer_for(tracer, formats, Threads(threads, reader.thread_pids), opts,
                            describe=probe_describer(meta.get("probe_events")), paint=paint)
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
    feed = renderer.feed_ahead
    from rethook.cli.term import progress

    with progress(reader, "report", quiet_stdout=True) as reading:
        # time order across threads; each event with its thread's next (a graph leaf is told
        # when its entry is due)
        for ev, nxt in reading.ordered_events(lost=True, lookahead=True):
            lines.extend(feed(ev, nxt))
            if len(lines) >= WRITE_BATCH:
                write("\n".join(lines) + "\n")
                lines.clear()
    lines.extend(renderer.flush())
    if lines:
        write("\n".join(lines) + "\n")
    out.flush()


def unreadable(reader: TraceReader, exc: Exception) -> TraceFileError:
    """Damage a consumer of the events met (a view or an exporter failing on values the
    chunk checks let through: a file written by something else), at the chunk they came
    from."""
    return TraceFileError(reader.path, reader.chunk_offset,
                          f"events that cannot be read ({type(exc).__name__}: {exc})")


def _replace_when_done(output: str, binary: bool):
    """A temporary file beside ``output``; :func:`os.replace` puts it in place once the
    export is complete, so an existing ``output`` is never left half overwritten."""
    folder = os.path.dirname(os.path.abspath(output))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(output)}.", dir=folder)
    try:  # the mode open() would give: an existing file's, else what the umask allows
        mode = stat.S_IMODE(os.stat(output).st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        mode = 0o666 & ~mask
    os.fchmod(fd, mode)
    return os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})), tmp


def export_file(path: str, fmt: str, output: str | None, **options: object) -> int:
    """Convert the trace at ``path`` to ``fmt`` (an EXPORTERS name, or html); ``options`` go
    to the writer. Returns the exit status."""
    if fmt == "html":
        from rethook.cli.viewing import view_file

        return view_file(path, output)
    exporter = EXPORTERS[fmt]
    try:
        write = getattr(importlib.import_module(exporter.module), exporter.function)
    except ImportError as e:
        _error(f"the {fmt} exporter is not available ({e})")
        return 1
    if output is None:
        output = os.path.splitext(path)[0] + exporter.suffix
    binary = exporter.binary
    to_stdout = output == "-"
    tmp = None
    reader: TraceReader | None = None
    from rethook.cli.term import progress

    try:
        with warnings.catch_warnings():
            # Not strict: everything before damage is exported; the damage is said at the end.
            warnings.simplefilter("ignore", TraceFileWarning)
            reader = TraceReader(path, strict=False)
            with reader:
                if exporter.graph_only:
                    from rethook.output.slices import is_graph_trace

                    if not is_graph_trace(reader):
                        _error(f"{path}: --format {fmt} needs a function_graph trace (this one "
                               f"is {printable(str(reader.meta.get('tracer', 'not')))}'s): "
                               "record with -p function_graph")
                        return 1
                with progress(reader, f"export {fmt}", exporter.passes) as reading:
                    if to_stdout:
                        target = sys.stdout.buffer if binary else sys.stdout
                        count = write(reading, target, **options)
                        target.flush()
                    else:
                        f, tmp = _replace_when_done(output, binary)
                        with f:
                            count = write(reading, f, **options)
                damage = reader.damage
                readable = reader.event_count if damage is not None else 1
                if damage is not None and tmp is not None and not readable:
                    os.unlink(tmp)  # nothing readable: leave an existing output alone
                    tmp = None
                elif tmp is not None:
                    os.replace(tmp, output)
                    tmp = None
    except TraceFileError as e:  # not a trace file, or its header is damaged
        _error(str(e))
        return 1
    except OSError as e:
        _error(f"{output}: {e.strerror or e}")
        return 1
    except Exception as e:  # noqa: BLE001 - events well-formed but impossible
        if reader is None:
            raise
        _error(str(unreadable(reader, e)))
        return 1
    finally:
        if tmp is not None:
            os.unlink(tmp)
    if damage is not None and not readable:  # nothing exported: an error, even if cut short
        _error(str(damage))
        return 1
    if not to_stdout and readable:
        size = human_size(os.path.getsize(output))
        upto = ", what comes before the damage" if damage is not None and not damage.truncated \
            else ""
        click.echo(f"rethook: {count:,} {exporter.unit} written to {output} ({size}){upto}",
                   err=True)
    return _damage_status(damage, path)


def hist_file(path: str, only: Iterable[str]) -> int:
    """``rethook hist``: the histograms a recording saved, one section per event."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceFileWarning)
            with TraceReader(path, strict=False) as reader:
                meta = reader.all_meta
                processes = reader.processes
                damage = reader.damage
    except TraceFileError as e:
        _error(str(e))
        return 1
    except OSError as e:
        _error(f"{path}: {e.strerror or e}")
        return 1
    hists: dict[str, str] = dict(meta.get("histograms") or {})
    for pid, proc in processes.items():  # followed processes' histograms, by process
        if proc.get("how") != "main":
            for name, text in (proc.get("meta", {}).get("histograms") or {}).items():
                hists[f"{name} (process {pid})"] = text
    wanted = list(only)
    unknown = [name for name in wanted if name not in hists]
    if unknown and damage is None:
        have = ", ".join(map(printable, sorted(hists))) or "none"
        raise click.UsageError(f"-e: no histogram for {', '.join(unknown)} in {path} "
                               f"(recorded: {have})")
    if not hists and damage is None:
        _error(f"{path}: the recording has no histograms (add -R 'hist:keys=...' to an -e)")
        return 1
    out = []
    for name in wanted or sorted(hists):
        if name in hists:  # from a file: its text escaped, line by line
            out.append(f"# {printable(name)}\n{printable_lines(hists[name])}")
    click.echo("\n".join(out), nl=False)
    if damage is not None and (not damage.truncated or not hists):
        _error(str(damage))  # histograms are saved at the end: a cut file lost them
        return 1
    return _damage_status(damage, path)
