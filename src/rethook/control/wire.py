"""The control channel's wire format: length-prefixed JSON messages on a Unix stream socket.

A frame is a 4-byte big-endian length, then that many bytes of UTF-8 JSON holding one object.
The first frame on a connection is the target's hello (:data:`PROTOCOL`, pid, command line,
the default filter); after that the client sends requests and the target answers each one::

    {"op": "ls"}                                     -> {"ok": true, "files": [...]}
    {"op": "read", "path": "enabled_functions"}      -> {"ok": true, "text": "..."}
    {"op": "write", "path": P, "text": T, "append": false}  -> {"ok": true}
    {"op": "pipe"}              -> {"data": "..."}... until {"op": "stop"}, then {"end": WHY}
    {"op": "session"}           -> {"ok": true}  (this connection's own trace instance)
    {"op": "record"} + one fd   -> {"ok": true}, then {"end": WHY, "events": N, ...}
    {"op": "profile"}           -> {"ok": true, "text": "the function profiler's table"}

A refused request gets ``{"ok": false, "error": {"kind": K, "message": M, ...}}``; a refused
tracefs write carries the file and the text as well, and its message is the in-process
:class:`~rethook.control.tracefs.TracefsError`'s. Requests name files and carry text: nothing
in them is ever evaluated.

Trace data never crosses the socket as data: ``record`` passes the client's open output file
with ``SCM_RIGHTS``, and the target's trace writer writes into it, exactly as an in-process
``rethook record`` does (the client's permissions and working directory apply, nothing is
copied, and a client killed mid-way still leaves a complete file). Text streams
(``trace_pipe``) go as ``data`` frames.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

#: Version of the messages above; the hello carries it and a client refuses another.
PROTOCOL = 1

#: Largest frame either side accepts (a trace_pipe batch of text is far below it).
MAX_FRAME = 16 << 20

#: Most file descriptors one message may carry.
MAX_FDS = 1

_LEN = struct.Struct(">I")


class ProtocolError(Exception):
    """A frame that is not a length-prefixed JSON object, or a connection that broke."""


def encode(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode("utf-8",
                                                                            "surrogatepass")
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"message of {len(body)} bytes is over the {MAX_FRAME}-byte limit")
    return _LEN.pack(len(body)) + body


def send(sock: socket.socket, msg: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    """Send one message (with ``fds`` passed as SCM_RIGHTS). Never raises SIGPIPE."""
    data = encode(msg)
    flags = getattr(socket, "MSG_NOSIGNAL", 0)
    if fds:
        sent = socket.send_fds(sock, [data], list(fds), flags)
        data = data[sent:]
    if data:
        sock.sendall(data, flags)


def error(kind: str, message: str, **more: Any) -> dict[str, Any]:
    """A refusal: ``{"ok": false, "error": {...}}``."""
    return {"ok": False, "error": {"kind": kind, "message": message, **more}}


class Receiver:
    """Reads messages from one socket, collecting the descriptors that come with them."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self._fds: list[int] = []

    def recv(self) -> tuple[dict[str, Any], list[int]] | None:
        """The next message and the descriptors that came with it; None at a clean end.

        Raises :class:`ProtocolError` for a broken frame (the connection is then unusable)
        and ``ValueError`` for a frame whose body is not a JSON object (the connection can
        go on).
        """
        head = self._take(_LEN.size, eof_ok=True)
        if head is None:
            return None
        (n,) = _LEN.unpack(head)
        if n > MAX_FRAME:
            raise ProtocolError(f"frame of {n} bytes is over the {MAX_FRAME}-byte limit")
        body = self._take(n, eof_ok=False)
        assert body is not None
        fds, self._fds = self._fds, []
        try:
            msg = json.loads(bytes(body).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            for fd in fds:
                _close(fd)
            raise ValueError(f"not a JSON message: {e}") from None
        if not isinstance(msg, dict):
            for fd in fds:
                _close(fd)
            raise ValueError(f"a message is a JSON object, not {type(msg).__name__}")
        return msg, fds

    def _take(self, n: int, eof_ok: bool) -> bytes | None:
        buf = self._buf
        while len(buf) < n:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, max(65536, n - len(buf)),
                                                           MAX_FDS)
            except (ConnectionResetError, BrokenPipeError) as e:
                raise ProtocolError(f"connection lost ({e.strerror})") from None
            self._fds += fds
            if not data:
                if eof_ok and not buf:
                    return None
                raise ProtocolError("connection closed in the middle of a message")
            buf += data
        out = bytes(buf[:n])
        del buf[:n]
        return out

    def pending(self) -> bool:
        """Whether a message (or part of one) is already buffered."""
        return bool(self._buf)

    def close(self) -> None:
        for fd in self._fds:
            _close(fd)
        self._fds = []


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end (SO_PEERCRED, Linux)."""
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", data)
