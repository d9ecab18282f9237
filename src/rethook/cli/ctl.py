"""Controlling running programs: ``rethook ctl``, ``rethook run``, and ``-P PID`` for
``record``, ``stream`` and ``profile`` (docs/control.md).

``ctl`` reads and writes a process's tracefs files over its control channel with the words
of a shell on tracefs (``ls``, ``cat FILE``, ``echo TEXT > FILE``); ``-P`` runs trace-cmd's
commands against a running process instead of a program it starts: the session gets a trace
instance of its own in the target, configured by the same flags, and everything it set up
is gone when it ends -- by Ctrl-C, ``--duration``, the program's exit, or the client dying.
"""

from __future__ import annotations

import select
import sys
import time
from collections.abc import Callable
from typing import IO, Any

import click

from rethook.control import directory
from rethook.control.attach import AttachError, attach
from rethook.control.client import ControlError, RemoteTracefs
from rethook.control.tracefs import TracefsError
from rethook.runner.observers import human_size
from rethook.runner.settings import SettingError, TraceSettings, configure

# --- connecting ----------------------------------------------------------------------------------


def connect(pid: int) -> RemoteTracefs:
    """Connect to ``pid``'s channel, attaching (Python 3.14+) if it has none."""
    entry = directory.find(pid)
    if entry is None and directory.process_start(pid) is not None:
        entry = attach(pid)  # raises AttachError saying what is missing, and how to opt in
    if entry is None:
        raise ControlError(f"no process {pid} (is it still running?)")
    return RemoteTracefs.connect(pid, entry.socket)


def targets(pid: int, children: bool) -> list[int]:
    """``pid``, and with ``children`` the processes below it that listen."""
    if not children:
        return [pid]
    found = [e.pid for e in directory.family(directory.entries(), pid)]
    return found or [pid]


def fail(message: str, status: int = 1) -> int:
    click.echo(f"rethook: error: {message}", err=True)
    return status


# --- rethook ctl ---------------------------------------------------------------------------------


def list_processes() -> int:
    rows = directory.entries()
    if not rows:
        click.echo("rethook: no process is listening (start one with 'rethook run')", err=True)
        return 0
    click.echo(f"{'PID':>7} {'PPID':>7}  {'RUN':<12} {'HOW':<7} COMMAND")
    for e in rows:
        click.echo(f"{e.pid:>7} {e.ppid:>7}  {e.run_id:<12} {e.extra.get('how', ''):<7} "
                   f"{e.command}")
    return 0


def parse_verb(words: list[str]) -> tuple[str, str, str]:
    """(verb, file, text) from ``ls``, ``cat FILE``, ``echo TEXT... > FILE`` (``>>``),
    ``write FILE TEXT...``, ``append FILE TEXT...``. Raises click.UsageError."""
    if not words:
        return "ls", "", ""
    verb, rest = words[0], words[1:]
    if verb == "ls" and len(rest) <= 1:
        return "ls", rest[0] if rest else "", ""
    if verb == "cat" and len(rest) == 1:
        return "cat", rest[0], ""
    if verb in ("write", "append") and rest:
        return verb, rest[0], " ".join(rest[1:])
    if verb == "echo":
        for i, word in enumerate(rest):
            for op, mode in ((">>", "append"), (">", "write")):
                if word == op and i == len(rest) - 2:
                    return mode, rest[-1], " ".join(rest[:i])
                if word.startswith(op) and word[len(op):] and word[len(op)] != ">" \
                        and i == len(rest) - 1:
                    return mode, word[len(op):], " ".join(rest[:i])
        raise click.UsageError(
            "echo needs '> FILE' or '>> FILE' at its end, with the '>' quoted so that your "
            "shell passes it on: rethook ctl PID echo TEXT '>' FILE (or: rethook ctl PID "
            "write FILE TEXT)")
    raise click.UsageError(f"unknown or incomplete command {' '.join(words)!r}: use ls, "
                           "cat FILE, echo TEXT '>' FILE, echo TEXT '>>' FILE, "
                           "write FILE TEXT, append FILE TEXT")


def ctl_main(pid: int | None, children: bool, words: list[str]) -> int:
    if pid is None:
        if words not in ([], ["ls"]):
            raise click.UsageError("give the PID first: rethook ctl PID COMMAND "
                                   "(rethook ctl alone lists the processes)")
        return list_processes()
    verb, path, text = parse_verb(words)
    pids = targets(pid, children)
    if verb == "cat" and path.strip("/") == "trace_pipe":
        return stream_processes(pids, lambda fs: None, tracing=False)
    status = 0
    for p in pids:
        if len(pids) > 1:
            click.echo(f"==> process {p} <==")
        try:
            with connect(p) as fs:
                if verb == "ls":
                    files = fs.listdir()
                    prefix = path.strip("/") + "/" if path.strip("/") else ""
                    click.echo("\n".join(f for f in files if f.startswith(prefix)))
                elif verb == "cat":
                    sys.stdout.write(fs.read(path))
                    sys.stdout.flush()
                else:
                    fs.write(path, text, append=verb == "append")
        except TracefsError as e:
            status = fail(str(e), 2)
        except (ControlError, AttachError, OSError) as e:
            status = fail(str(e))
    return status


# --- -P: record, stream, profile ----------------------------------------------------------------


def _configure(fs: RemoteTracefs, settings: TraceSettings, tracer: bool) -> None:
    """The flags as tracefs writes into the session's instance; without -l the program's own
    code, as the target names it (the patterns that match nothing there are skipped)."""
    if not settings.filters:
        used = []
        for pattern in fs.hello.get("default_filter") or ["*:mod:__main__"]:
            try:
                fs.write("set_ftrace_filter", pattern, append=True)
            except TracefsError:
                continue
            used.append(pattern)
        if not used:
            raise click.UsageError(f"process {fs.pid} has no functions of its own to trace "
                                   "by default: choose functions with -l")
    configure(fs, settings, None, tracer=tracer)  # type: ignore[arg-type]


def _open_sessions(pids: list[int], settings: TraceSettings, tracer: bool
                   ) -> list[RemoteTracefs]:
    sessions: list[RemoteTracefs] = []
    try:
        for p in pids:
            fs = connect(p)
            sessions.append(fs)
            fs.session()
            _configure(fs, settings, tracer)
    except SettingError as e:
        for fs in sessions:
            fs.close()
        raise click.UsageError(str(e)) from None
    except BaseException:
        for fs in sessions:
            fs.close()
        raise
    return sessions


def _wait(sessions: list[RemoteTracefs], duration: float | None) -> None:
    """Until Ctrl-C, ``duration`` seconds, or every target has said it ended."""
    deadline = None if duration is None else time.monotonic() + duration
    live = list(sessions)
    try:
        while live:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fs.sock for fs in live], [], [], timeout)
            if not ready:
                return
            live = [fs for fs in live if fs.sock not in ready]
    except KeyboardInterrupt:
        return


def _describe(fs: RemoteTracefs) -> str:
    return f"process {fs.pid} ({' '.join(fs.hello.get('argv') or []) or '?'})"


def _output_for(output: str, pid: int, first: bool) -> str:
    return output if first else f"{output}.{pid}"


def record_running(pid: int, children: bool, settings: TraceSettings, output: str,
                   duration: float | None) -> int:
    """``rethook record -P PID``: record a running process until Ctrl-C, ``--duration``
    or its exit, then leave it as it was."""
    pids = targets(pid, children)
    try:
        sessions = _open_sessions(pids, settings, tracer=True)
    except (ControlError, AttachError, OSError) as e:
        return fail(str(e))
    files: list[tuple[RemoteTracefs, str, IO[bytes]]] = []
    try:
        for i, fs in enumerate(sessions):
            path = _output_for(output, fs.pid, i == 0)
            try:
                out = open(path, "wb")  # noqa: SIM115 - closed below, the target has its copy
            except OSError as e:
                raise click.UsageError(f"-o {path!r}: cannot write: {e.strerror}") from None
            files.append((fs, path, out))
            fs.record(out, command=["rethook", *sys.argv[1:]])
            out.close()  # the target writes through the descriptor it received
            click.echo(f"rethook: recording {_describe(fs)} into {path}; Ctrl-C to stop",
                       err=True)
        _wait(sessions, duration)
        status = 0
        for fs in sessions:
            fs.stop()
        for fs, path, _out in files:
            try:
                end = fs.finish()
            except ControlError as e:
                status = fail(str(e))
                continue
            click.echo(f"rethook: {end.get('events', 0):,} events ({end.get('lost', 0):,} lost) "
                       f"written to {path} ({human_size(int(end.get('size', 0)))})", err=True)
            if end.get("end") == "exit":
                click.echo(f"rethook: process {fs.pid} exited; its trace ends there", err=True)
        return status
    except (ControlError, OSError) as e:
        return fail(str(e))
    finally:
        for fs in sessions:
            fs.close()


def stream_processes(pids: list[int], setup: Callable[[RemoteTracefs], None],
                     tracing: bool) -> int:
    """Print ``trace_pipe`` of each process as it comes (``ctl PID cat trace_pipe``, or a
    ``stream -P`` session when ``tracing``) until Ctrl-C or the programs end."""
    sessions: list[RemoteTracefs] = []
    try:
        for p in pids:
            fs = connect(p)
            sessions.append(fs)
            setup(fs)
            if tracing:
                fs.write("tracing_on", "1")
            fs.request({"op": "pipe"})
    except TracefsError as e:
        for fs in sessions:
            fs.close()
        return fail(str(e), 2)
    except (ControlError, AttachError, OSError) as e:
        for fs in sessions:
            fs.close()
        return fail(str(e))
    prefix = len(sessions) > 1
    streams = {fs.sock: (fs, fs._stream()) for fs in sessions}
    out = sys.stdout
    stopping = False
    try:
        while streams:
            try:
                ready, _, _ = select.select(list(streams), [], [])
                for sock in ready:
                    fs, it = streams[sock]
                    try:
                        text = next(it)
                    except StopIteration:
                        del streams[sock]
                        _stream_end(fs, tracing)
                        continue
                    if prefix:
                        text = "".join(f"[{fs.pid}] {line}\n" for line in text.splitlines())
                    out.write(text)
                    out.flush()
            except KeyboardInterrupt:
                if stopping:
                    raise
                stopping = True
                for fs, _ in streams.values():
                    fs.stop()
    except (ControlError, OSError) as e:
        return fail(str(e))
    except BrokenPipeError:
        return 0
    finally:
        for fs in sessions:
            fs.close()
    return 0


def _stream_end(fs: RemoteTracefs, tracing: bool) -> None:
    end = fs.end
    if tracing and "events" in end:
        click.echo(f"rethook: {end['events']:,} events ({end['lost']:,} lost) streamed from "
                   f"process {fs.pid}", err=True)
    if end.get("end") == "exit":
        click.echo(f"rethook: process {fs.pid} exited", err=True)


def stream_running(pid: int, children: bool, settings: TraceSettings) -> int:
    """``rethook stream -P PID``."""
    pids = targets(pid, children)

    def setup(fs: RemoteTracefs) -> None:
        fs.session()
        try:
            _configure(fs, settings, tracer=True)
        except SettingError as e:
            raise click.UsageError(str(e)) from None
        click.echo(f"rethook: streaming {_describe(fs)}; Ctrl-C to stop", err=True)

    return stream_processes(pids, setup, tracing=True)


def profile_running(pid: int, children: bool, settings: TraceSettings,
                    duration: float | None,
                    show: Callable[[list[tuple[int, list[Any]]], bool, bool], None]) -> int:
    """``rethook profile -P PID``: the function profiler over a running process for a while;
    ``show(tables, abrupt, graph_time)`` says what the processes counted (``rethook
    profile``'s table or pstats file)."""
    pids = targets(pid, children)
    try:
        sessions = _open_sessions(pids, settings, tracer=False)
    except (ControlError, AttachError, OSError) as e:
        return fail(str(e))
    try:
        for fs in sessions:
            fs.write("function_profile_enabled", "1")
            fs.write("tracing_on", "1")
            click.echo(f"rethook: profiling {_describe(fs)}; Ctrl-C to stop", err=True)
        _wait(sessions, duration)
        status = 0
        tables = []
        for fs in sessions:
            try:
                fs.write("function_profile_enabled", "0")
                tables.append((fs.pid, fs.profile_stats()))
            except ControlError as e:
                status = fail(f"{e} (the profile of process {fs.pid} is lost with it)")
        graph_time = not any(opt == "nograph-time" for opt in settings.options)
        show(tables, False, graph_time)
        return status
    except (ControlError, OSError) as e:
        return fail(str(e))
    finally:
        for fs in sessions:
            fs.close()


# --- the options -P brings to record, stream and profile ------------------------------------------


