"""``rethook view`` and ``rethook export --format html``: a trace as one self-contained page.

The page is written to a temporary file beside the output and renamed into place once
complete, so an error never leaves half a page (or clobbers an older one). What the page left
out of a big trace is said on stderr too, with the Perfetto command that shows everything.
A damaged trace file (truncated by a crash, say) still gives a page of everything before the
damage, as ``report`` prints it, with the error on the page and on stderr (exit status 1).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
import webbrowser
from pathlib import Path

import click

from rethook.buffer.tracefile import TraceFileError, TraceFileWarning
from rethook.buffer.traceread import TraceReader
from rethook.output.html import DEFAULT_MAX_SLICES, View, write_html
from rethook.runner.observers import human_size

#: The page's name when none is given: the input's, with this suffix.
HTML_SUFFIX = ".html"


def _say(text: str) -> None:
    click.echo(f"rethook: {text}", err=True)


def default_output(path: str) -> str:
    return os.path.splitext(path)[0] + HTML_SUFFIX


def view_file(path: str, output: str | None, *, open_page: bool = False,
              max_slices: int = DEFAULT_MAX_SLICES) -> int:
    """Write the HTML view of the trace at ``path``; returns the exit status."""
    if output is None:
        output = default_output(path)
    with warnings.catch_warnings():
        # not strict: damage ends the reading (kept in reader.damage) and is reported once
        warnings.simplefilter("ignore", TraceFileWarning)
        try:
            reader = TraceReader(path, strict=False)
        except TraceFileError as e:  # not a trace file, or its header is damaged
            _say(f"error: {e}")
            return 1
        try:
            with reader:
                if output == "-":
                    view = write_html(reader, sys.stdout, max_slices=max_slices)
                    sys.stdout.flush()
                else:
                    view = _write_atomically(reader, output, max_slices)
        except OSError as e:
            _say(f"error: {output}: {e.strerror or e}")
            return 1
    _report(view, path, output, open_page)
    if reader.damage is not None:
        _say(f"error: {reader.damage} (the page shows the trace up to there)")
        return 1
    return 0


def _write_atomically(reader: TraceReader, output: str, max_slices: int) -> View:
    target = Path(output)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                               dir=target.parent if str(target.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            view = write_html(reader, f, max_slices=max_slices)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    return view


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _report(view: View, path: str, output: str, open_page: bool) -> None:
    for note in view.notes():
        _say(f"a big trace: {note}")
    if view.notes():
        _say(f"every event is in Perfetto's view: rethook export -i {path} --format perfetto")
    if output == "-":
        return
    _say(f"{view.summary} written to {output} ({human_size(os.path.getsize(output))})")
    uri = Path(output).resolve().as_uri()
    if open_page:
        if not _open(uri):
            _say(f"no web browser found to open {uri} (set BROWSER to one)")
    elif sys.stderr.isatty() and _has_browser():
        _say(f"open {uri} in a browser (or add --open)")


def _has_browser() -> bool:
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


def _open(uri: str) -> bool:
    try:
        return webbrowser.open(uri)
    except webbrowser.Error:
        return False
