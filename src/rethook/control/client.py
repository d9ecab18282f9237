"""The client side of the control channel: another process's tracefs, read and written.

::

    with RemoteTracefs.connect(pid) as fs:
        print(fs.read("available_tracers"))
        fs.write("set_ftrace_filter", "handle*")
        fs.write("current_tracer", "function_graph")
        for text in fs.pipe():              # cat trace_pipe (stop it with fs.stop())
            print(text, end="")

:meth:`RemoteTracefs.connect` finds the process's socket (see
:mod:`rethook.control.directory`), checks that it and its directory are the user's own and
that the peer is the process asked for, and reads the hello. A write the target refuses
raises the same :class:`~rethook.control.tracefs.TracefsError` an in-process write would;
anything else that goes wrong raises :class:`ControlError`, whose message says what to do.
"""

from __future__ import annotations

import os
import select
import socket
from collections.abc import Iterator
from typing import IO, Any

from rethook.control import directory, wire
from rethook.control.tracefs import TracefsError


class ControlError(Exception):
    """The process cannot be controlled (not listening, not ours, gone, protocol)."""


def no_channel_message(pid: int) -> str:
    """Why there is nothing to connect to, and what to do about it."""
    if directory.process_start(pid) is None:
        return f"no process {pid} (is it still running?)"
    return (f"process {pid} has no control channel: start the program with "
            "'rethook run [--] SCRIPT ARGS' (or 'rethook run -m MODULE'), or have it call "
            "rethook.control.listen(), or start it with RETHOOK_CONTROL=1 where rethook's "
            "startup hook is installed (docs/control.md)")


class RemoteTracefs:
    """A connection to one process's control channel."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self._receiver = wire.Receiver(sock)
        hello = self._recv()
        if not hello.get("ok", True):
            raise ControlError(_error_text(hello))
        if hello.get("protocol") != wire.PROTOCOL:
            raise ControlError(f"process {pid} speaks control protocol "
                               f"{hello.get('protocol')!r}, this rethook {wire.PROTOCOL}: use "
                               f"the rethook it runs ({hello.get('rethook', '?')})")
        self.hello = hello
        self.streaming = False

    # --- connecting ----------------------------------------------------------------------------
    @classmethod
    def connect(cls, pid: int, path: str | None = None) -> RemoteTracefs:
        """Connect to ``pid``'s channel (``path``: its socket, found when not given)."""
        if path is None:
            entry = directory.find(pid)
            if entry is None:
                raise ControlError(no_channel_message(pid))
            path = entry.socket
        _check_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except PermissionError:
            sock.close()
            st = os.stat(path)
            raise ControlError(f"permission denied on {path} (owned by uid {st.st_uid}, mode "
                               f"{st.st_mode & 0o777:04o}): control a process as the user "
                               "that runs it") from None
        except (ConnectionRefusedError, FileNotFoundError):
            sock.close()
            raise ControlError(f"process {pid} is not listening any more "
                               "(it has exited, or closed its channel)") from None
        peer_pid, uid, _gid = wire.peer_credentials(sock)
        if uid != os.geteuid() or peer_pid != pid:
            sock.close()
            raise ControlError(f"{path} is served by pid {peer_pid} (uid {uid}), not by "
                               f"process {pid} of uid {os.geteuid()}: refusing it")
        try:
            return cls(sock, pid)
        except BaseException:
            sock.close()
            raise

    def close(self) -> None:
        self._receiver.close()
        self.sock.close()

    def __enter__(self) -> RemoteTracefs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- requests ------------------------------------------------------------------------------
    def request(self, msg: dict[str, Any], fds: tuple[int, ...] = ()) -> dict[str, Any]:
        """Send one request and return its answer; a refusal raises."""
        try:
            wire.send(self.sock, msg, fds)
        except OSError as e:
            raise ControlError(f"process {self.pid} closed the connection ({e.strerror})") \
                from None
        return _checked(self._recv())

    def _recv(self) -> dict[str, Any]:
        try:
            got = self._receiver.recv()
        except (wire.ProtocolError, ValueError, OSError) as e:
            raise ControlError(f"process {self.pid}: {e}") from None
        if got is None:
            raise ControlError(f"process {self.pid} closed the connection "
                               "(the program exited?)")
        msg, fds = got
        for fd in fds:
            os.close(fd)
        return msg

    def listdir(self) -> list[str]:
        return list(self.request({"op": "ls"})["files"])

    def read(self, path: str) -> str:
        """``cat path`` (``trace_pipe``: what is there now; :meth:`pipe` streams it)."""
        return str(self.request({"op": "read", "path": path})["text"])

    def write(self, path: str, text: str, append: bool = False) -> None:
        """``echo text > path`` (``>>`` with ``append``)."""
        self.request({"op": "write", "path": path, "text": text, "append": append})

    def session(self) -> None:
        """From now on, this connection works on a trace instance of its own, removed (with
        every hook it made) when the connection ends."""
        self.request({"op": "session"})

    def profile_stats(self) -> list[Any]:
        """The instance's function profile, threads merged (``Tracefs.profile_stats``)."""
        from rethook.tracers.profiler import stat_from_row

        return [stat_from_row(row) for row in self.request({"op": "profile"})["rows"]]

    @property
    def dynamic(self) -> _Events:
        """The probe events defined in the instance (what ``configure`` asks after ``-e``)."""
        return _Events(self)

    # --- streams -------------------------------------------------------------------------------
    def pipe(self) -> Iterator[str]:
        """``cat trace_pipe``: yields text as the target sends it until :meth:`stop` is
        answered or the program ends (the last value of :attr:`end` says which)."""
        self.request({"op": "pipe"})
        yield from self._stream()

    def record(self, out: IO[bytes], command: list[str] | None = None) -> None:
        """Start recording the instance into ``out`` (a regular file, opened for writing):
        its descriptor goes to the target, whose trace writer writes the file. Then wait
        (:meth:`wait`) and :meth:`stop`; :meth:`finish` returns the summary."""
        self.request({"op": "record", "command": command or []}, fds=(out.fileno(),))
        self.streaming = True

    def stop(self) -> None:
        """Ask the running stream to end (its end comes through :meth:`pipe`/:meth:`finish`)."""
        try:
            wire.send(self.sock, {"op": "stop"})
        except OSError:
            pass  # the program ended meanwhile: its end message is already on the way

    def wait(self, timeout: float | None) -> bool:
        """Wait until the target says something (its end) or ``timeout`` passes; True if
        something came."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        return bool(ready) or self._receiver.pending()

    def finish(self) -> dict[str, Any]:
        """The end of a record: ``{"end": "stopped" | "exit", "events": N, "lost": N,
        "size": BYTES}``."""
        for _ in self._stream():
            pass
        return self.end

    def _stream(self) -> Iterator[str]:
        self.streaming = True
        self.end: dict[str, Any] = {}
        while True:
            msg = self._recv()
            if "data" in msg:
                yield str(msg["data"])
            elif "end" in msg:
                self.end = msg
                self.streaming = False
                return
            elif msg.get("ok") is False:
                raise ControlError(_error_text(msg))


class _Events:
    """The names of an instance's probe events (``GRP/NAME``), read from its listing."""

    def __init__(self, fs: RemoteTracefs) -> None:
        files = fs.listdir()
        self.events = {"/".join(f.split("/")[1:3]): None for f in files
                       if f.startswith("events/") and f.count("/") == 3}


def _checked(msg: dict[str, Any]) -> dict[str, Any]:
    if msg.get("ok") is False:
        err = msg.get("error") or {}
        if err.get("kind") == "tracefs":
            raise TracefsError(str(err.get("path", "")), str(err.get("text", "")),
                               str(err.get("message", "")))
        raise ControlError(_error_text(msg))
    return msg


def _error_text(msg: dict[str, Any]) -> str:
    err = msg.get("error") or {}
    return str(err.get("message") or err or msg)


def _check_socket(path: str) -> None:
    """The socket and its directory must be the user's own (a socket someone else made
    could pose as the process)."""
    directory.check_dir(os.path.dirname(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ControlError(f"{path} is gone (the process exited?)") from None
    if st.st_uid != os.geteuid():
        raise ControlError(f"{path} belongs to uid {st.st_uid}, not to you (uid "
                           f"{os.geteuid()}): rethook controls only your own processes")
