"""The control channel: a process's tracefs served on a Unix socket, for ``rethook ctl``.

A process listens when it runs under ``rethook run``, when it calls :func:`listen` (one line
of API), or when it starts with ``RETHOOK_CONTROL=1`` and something calls
:func:`listen_from_env`. Listening costs nothing while nobody is connected: one thread the
program does not see waits in ``select()`` on the socket, nothing is imported beyond the
standard library's sockets, no trace instance exists and nothing is hooked. A client's first
request makes the process's trace instance (a :class:`~rethook.control.tracefs.Tracefs`);
the requests are those of :mod:`rethook.control.wire`.

Connections and instances
-------------------------
Each connection is served by its own hidden thread. Reads and writes of the process's
instance take one lock, so two clients see each other's writes whole and in order; the
program never takes it. A connection may ask for an instance of its own (``session``: the
kernel's ``instances/`` directory): ``record -P``, ``stream -P`` and ``profile -P`` configure
and trace there, and whatever that instance hooked is removed (open calls delivered as
unfinished) when the connection ends, however it ends -- so a client killed mid-stream
leaves nothing behind that it alone asked for. Writes to the process's own instance are the
tracefs's: they stay, as ``echo`` into tracefs stays after the shell exits.

Forks
-----
Around the program's ``os.fork()`` the idle server thread steps aside (the program forks with
the threads it has, see :mod:`rethook.control.hidden`) and no request is half done (the lock
is held across the fork). The child never serves its parent's socket: it closes its copy,
removes the hooks of its parent's client sessions, and -- with ``follow_forks`` -- listens
on a socket of its own, registered with its parent's pid and the same run id.
"""

from __future__ import annotations

import atexit
import os
import select
import socket
import stat
import sys
import threading
from typing import TYPE_CHECKING, Any

from rethook.control import directory, wire
from rethook.control.hidden import HiddenThread, hush_fork_warning

if TYPE_CHECKING:
    from rethook.control.tracefs import Tracefs

#: How often a streaming connection looks for its client's ``stop`` and for the end.
POLL_SECONDS = 0.1
#: How long closing the channel waits for streaming clients to get their end.
CLOSE_GRACE_SECONDS = 5.0
#: Environment variable that opts a program in (see :func:`listen_from_env`).
ENV_CONTROL = "RETHOOK_CONTROL"
#: Environment variable carrying a run's id to the processes it starts.
ENV_RUN_ID = "RETHOOK_RUN_ID"

_current: Channel | None = None
_forked_from: Channel | None = None  # the parent's channel, in a fork child, until cleaned up
_fork_hooks = False
_instance_hook = False


def current() -> Channel | None:
    """This process's channel, if it listens."""
    ch = _current
    return ch if ch is not None and ch.pid == os.getpid() and not ch.closed else None


def listen(fs: Tracefs | None = None, *, default_filter: list[str] | None = None,
           follow_forks: bool = True, how: str = "api",
           argv: list[str] | None = None) -> Channel:
    """Start listening for ``rethook ctl`` (once per process; later calls return the channel).

    ``fs`` is the process's trace instance if it has one already (``rethook run`` passes its
    own); otherwise one is made when a client first needs it. ``default_filter`` is what
    ``record -P`` traces without ``-l`` (default: the modules of the program's own directory).
    With ``follow_forks`` a forked child listens on its own socket.
    """
    global _current
    ch = current()
    if ch is not None:
        return ch
    ch = Channel(fs, default_filter=default_filter, follow_forks=follow_forks, how=how,
                 argv=argv)
    ch.start()
    _current = ch
    _install_fork_hooks()
    return ch


def listen_from_env() -> Channel | None:
    """:func:`listen` if ``RETHOOK_CONTROL`` is set to 1 (for a startup hook), else nothing."""
    if os.environ.get(ENV_CONTROL, "").strip().lower() not in ("1", "yes", "on", "true"):
        return None
    return listen(how="env")


class Channel:
    """One process's listening socket, its server thread and its connections."""

    def __init__(self, fs: Tracefs | None = None, *, default_filter: list[str] | None = None,
                 follow_forks: bool = True, how: str = "api", argv: list[str] | None = None,
                 run_id: str | None = None) -> None:
        self.pid = os.getpid()
        self._fs = fs
        self._owns_fs = fs is None
        self.default_filter = default_filter
        self.follow_forks = follow_forks
        self.how = how
        self.argv = argv
        self.run_id = run_id or os.environ.get(ENV_RUN_ID) or f"{self.pid}"
        self.closed = False
        self._lock = threading.RLock()  # one request of the process's instance at a time
        self._conns: set[_Connection] = set()
        self._sessions: set[Tracefs] = set()  # connections' own instances
        self._server = HiddenThread(self._serve)
        self._sock: socket.socket | None = None
        self._wake_r = self._wake_w = -1
        self._paused = False
        self.directory = ""
        self.path = ""

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self.directory = directory.own_dir()
        if self.how != "fork":
            directory.entries(prune=True)  # leftovers of processes that are gone
        directory.remove_entry(self.directory, self.pid)  # a stale one with our pid
        self.path = directory.socket_path(self.directory, self.pid)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)  # the directory is 0700: nobody else reaches it meanwhile
            os.chmod(self.path, stat.S_IRUSR | stat.S_IWUSR)
            sock.listen(16)
            sock.set_inheritable(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        entry = directory.describe_self(self.directory, self.run_id, how=self.how)
        if self.argv is not None:
            entry.argv = list(self.argv)
        directory.write_entry(self.directory, entry)
        self._wake_r, self._wake_w = os.pipe()
        self._spawn_server()
        atexit.register(self.close)

    def _spawn_server(self) -> None:
        self._server = HiddenThread(self._serve)
        self._server.start()

    def _stop_server(self) -> None:
        if self._server.alive:
            os.write(self._wake_w, b"x")
            self._server.join(until_gone=True)
            os.read(self._wake_r, 64)

    def close(self) -> None:
        """Stop listening: streaming clients get their end (a record's file is finished), the
        connections' instances are removed, the socket and its description deleted."""
        if self.closed or self.pid != os.getpid():
            return
        with self._lock:
            self.closed = True
            conns = list(self._conns)
        self._stop_server()
        for conn in conns:
            conn.stop("exit")
        for conn in conns:
            if not conn.thread.join(CLOSE_GRACE_SECONDS):
                conn.shutdown()
                conn.thread.join(1.0)
        if self._sock is not None:
            self._sock.close()
        for fd in (self._wake_r, self._wake_w):
            _close_fd(fd)
        directory.remove_entry(self.directory, self.pid)
        if self._owns_fs and self._fs is not None:
            self._fs.close()
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # --- instances --------------------------------------------------------------------------
    def top(self) -> Tracefs:
        """The process's trace instance (made on first use)."""
        with self._lock:
            if self._fs is None:
                from rethook.control.tracefs import Tracefs

                self._fs = Tracefs()
                _install_instance_hook()
            return self._fs

    def new_instance(self) -> Tracefs:
        """An instance of a connection's own, removed with it."""
        from rethook.control.tracefs import Tracefs

        fs = Tracefs()
        _install_instance_hook()
        with self._lock:
            self._sessions.add(fs)
        return fs

    def drop_instance(self, fs: Tracefs) -> None:
        with self._lock:
            self._sessions.discard(fs)
            fs.close()

    def defaults(self) -> list[str]:
        """What ``record -P`` traces without ``-l``: the program's own code."""
        if self.default_filter is None:
            self.default_filter = _own_code_filter()
        return list(self.default_filter)

    # --- the server thread -------------------------------------------------------------------
    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self.closed:
            try:
                ready, _, _ = select.select([sock, self._wake_r], [], [])
            except (OSError, ValueError):
                return
            if self._wake_r in ready:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            self._admit(conn)

    def _admit(self, sock: socket.socket) -> None:
        try:
            peer_pid, uid, _gid = wire.peer_credentials(sock)
            if uid != os.geteuid():
                wire.send(sock, wire.error(
                    "permission", f"uid {uid} may not control process {self.pid}, which runs "
                    f"as uid {os.geteuid()}: rethook serves only its own user"))
                sock.close()
                return
        except OSError:
            sock.close()
            return
        conn = _Connection(self, sock, peer_pid)
        with self._lock:
            if self.closed:
                sock.close()
                return
            self._conns.add(conn)
        conn.thread.start()

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._conns.discard(conn)

    def hello(self) -> dict[str, Any]:
        import rethook

        return {"rethook": rethook.__version__, "protocol": wire.PROTOCOL, "pid": self.pid,
                "ppid": os.getppid(), "run_id": self.run_id, "argv": list(sys.argv),
                "python": sys.version.split()[0], "how": self.how,
                "default_filter": self.defaults()}

    # --- fork --------------------------------------------------------------------------------
    def _before_fork(self) -> None:
        self._paused = not self._conns and self._server.alive
        if self._paused:
            self._stop_server()
            hush_fork_warning()

    def _after_fork_parent(self) -> None:
        if self._paused and not self.closed:
            self._spawn_server()

    def _after_fork_child(self) -> None:
        """The parent's socket and connections are its own: close our copies (without
        shutting anything down), and leave the instances to :func:`_drop_parent_sessions`."""
        global _current, _forked_from
        self._lock = threading.RLock()
        for fd in (self._wake_r, self._wake_w):
            _close_fd(fd)
        if self._sock is not None:
            _close_fd(self._sock.detach())
        for conn in self._conns:
            _close_fd(conn.sock.detach())
        _current = None
        _forked_from = self
        if self.follow_forks:
            try:
                child = Channel(self._fs, default_filter=self.default_filter, follow_forks=True,
                                how="fork", run_id=self.run_id)
                child._owns_fs = self._owns_fs
                child.start()
                _current = child
            except OSError:
                pass  # the child goes on untraceable; the parent's listing does not show it


class _Connection:
    """One client, served by its own hidden thread."""

    def __init__(self, channel: Channel, sock: socket.socket, peer_pid: int) -> None:
        self.channel = channel
        self.sock = sock
        self.peer_pid = peer_pid
        self.receiver = wire.Receiver(sock)
        self.fs: Tracefs | None = None  # the connection's own instance, after "session"
        self.streaming = False
        self.ending: str | None = None  # why the channel wants this connection to end
        self.thread = HiddenThread(self._run)

    def stop(self, why: str) -> None:
        with self.channel._lock:
            self.ending = why
            streaming = self.streaming
        if not streaming:
            self.shutdown()

    def shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _run(self) -> None:
        from rethook.engine.core import notrace

        try:
            with notrace():
                self.send(self.channel.hello())
            while self.ending is None:
                with notrace():
                    try:
                        got = self.receiver.recv()
                    except ValueError as e:
                        self.send(wire.error("request", str(e)))
                        continue
                    if got is None:
                        break
                    msg, fds = got
                    self.handle(msg, fds)
        except (wire.ProtocolError, OSError):
            pass  # the client went away: what it asked for goes with it
        finally:
            with notrace():
                self._end()

    def _end(self) -> None:
        self.receiver.close()
        if self.fs is not None:
            self.channel.drop_instance(self.fs)
            self.fs = None
        try:
            self.sock.close()
        except OSError:
            pass
        self.channel._forget(self)

    def send(self, msg: dict[str, Any]) -> None:
        wire.send(self.sock, msg)

    # --- requests ----------------------------------------------------------------------------
    def handle(self, msg: dict[str, Any], fds: list[int]) -> None:
        op = msg.get("op")
        handler = _OPS.get(op) if isinstance(op, str) else None
        try:
            if handler is None:
                raise _Refused("request", f"unknown op {op!r} (known: {', '.join(_OPS)})")
            if fds and op != "record":
                raise _Refused("request", f"{op!r} takes no file descriptor")
            handler(self, msg, fds)
        except _Refused as e:
            for fd in fds:
                _close_fd(fd)
            self.send(wire.error(e.kind, e.message, **e.more))

    def instance(self) -> Tracefs:
        return self.fs if self.fs is not None else self.channel.top()

    def _tracefs_call(self, fn: Any, path: str, text: str = "") -> Any:
        from rethook.control.tracefs import TracefsError

        try:
            with self.channel._lock:
                return fn()
        except TracefsError as e:
            message = str(e).removeprefix(f"{e.path}: ")
            raise _Refused("tracefs", message, path=e.path, text=e.text) from None
        except (ValueError, OverflowError, MemoryError) as e:  # a file without its own check
            raise _Refused("tracefs", f"{type(e).__name__}: {e}", path=path, text=text) \
                from None

    def op_ls(self, msg: dict[str, Any], fds: list[int]) -> None:
        fs = self.instance()
        self.send({"ok": True, "files": self._tracefs_call(fs.listdir, "")})

    def op_read(self, msg: dict[str, Any], fds: list[int]) -> None:
        path = _string(msg, "path")
        fs = self.instance()
        text = self._tracefs_call(lambda: fs.read(path, timeout=0), path)
        self.send({"ok": True, "text": text})

    def op_write(self, msg: dict[str, Any], fds: list[int]) -> None:
        path, text = _string(msg, "path"), _string(msg, "text")
        append = msg.get("append", False)
        if not isinstance(append, bool):
            raise _Refused("request", "'append' must be true or false")
        fs = self.instance()
        self._tracefs_call(lambda: fs.write(path, text, append=append), path, text)
        self.send({"ok": True})

    def op_session(self, msg: dict[str, Any], fds: list[int]) -> None:
        if self.fs is not None:
            raise _Refused("request", "this connection has its own instance already")
        self.fs = self.channel.new_instance()
        self.send({"ok": True})

    def op_profile(self, msg: dict[str, Any], fds: list[int]) -> None:
        from rethook.tracers.profiler import stat_row

        fs = self.instance()
        stats = self._tracefs_call(fs.profile_stats, "")
        self.send({"ok": True, "rows": [stat_row(st) for st in stats]})

    def op_stop(self, msg: dict[str, Any], fds: list[int]) -> None:
        raise _Refused("request", "nothing to stop: no stream is running")

    def op_pipe(self, msg: dict[str, Any], fds: list[int]) -> None:
        """``cat trace_pipe``: text as it comes, until the client stops or the program ends.
        On the connection's own instance, ending delivers its open calls as unfinished."""
        own = self.fs is not None
        fs = self.instance()

        def step() -> None:
            if own:  # nobody else reads this instance: wait in the read itself
                text = fs.read("trace_pipe", timeout=POLL_SECONDS)
            else:
                with self.channel._lock:
                    text = fs.read("trace_pipe", timeout=0)
            if text:
                self.send({"data": text})

        why = self._stream(step, wait=not own, started={"ok": True})
        end: dict[str, Any] = {"end": why}
        if own:
            with self.channel._lock:
                fs.close()  # every hook removed, open calls delivered as unfinished
                fs.write("tracing_on", "0")
                text = fs.read("trace_pipe", timeout=0)
                totals = fs.ctx.buffer.totals()
            if text:
                self.send({"data": text})
            end.update(events=totals.written - totals.lost, lost=totals.lost)
        self.send(end)

    def op_record(self, msg: dict[str, Any], fds: list[int]) -> None:
        """Record this connection's instance into the file whose descriptor came along."""
        from rethook.control.recording import TraceSink, instance_meta

        if self.fs is None:
            raise _Refused("request", "record needs the connection's own instance "
                                      "(send 'session' and configure it first)")
        if len(fds) != 1:
            raise _Refused("request", "record takes exactly one file descriptor (the output)")
        fd = fds[0]
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Refused("request", "the output must be a regular file")
        command = msg.get("command")
        extra = {"rethook_command": command} if isinstance(command, list) else {}
        fs = self.fs
        with self.channel._lock:
            sink = TraceSink(fs, os.fdopen(fd, "wb", buffering=0), instance_meta(fs, **extra))
            fs.write("tracing_on", "1")
        try:
            why = self._stream(lambda: sink.round(POLL_SECONDS), wait=False,
                               started={"ok": True})
        finally:
            with self.channel._lock:
                fs.close()  # every hook removed, open calls delivered as unfinished
                fs.write("tracing_on", "0")
                sink.finish()
        self.send({"end": why, "events": sink.events, "lost": sink.lost, "size": sink.size})

    def _stream(self, step: Any, wait: bool, started: dict[str, Any]) -> str:
        """Answer ``started``, then run ``step`` until the client says stop (or leaves:
        raises) or the channel closes; returns why it ended. ``wait``: the step does not
        wait, so wait here between steps. Marked streaming before the answer goes out, so a
        closing channel lets the stream end with its end message."""
        with self.channel._lock:
            self.streaming = True
        try:
            self.send(started)
            if self.ending is not None:
                return self.ending
            while True:
                step()
                if self.ending is not None:
                    return self.ending
                timeout = POLL_SECONDS if wait else 0
                if self.receiver.pending() or select.select([self.sock], [], [], timeout)[0]:
                    got = self.receiver.recv()
                    if got is None:
                        raise wire.ProtocolError("the client left")
                    msg, fds = got
                    for fd in fds:
                        _close_fd(fd)
                    if msg.get("op") == "stop":
                        return "stopped"
                    self.send(wire.error("request", "only 'stop' is accepted while streaming"))
        finally:
            self.streaming = False


_OPS = {
    "ls": _Connection.op_ls,
    "read": _Connection.op_read,
    "write": _Connection.op_write,
    "pipe": _Connection.op_pipe,
    "session": _Connection.op_session,
    "record": _Connection.op_record,
    "profile": _Connection.op_profile,
    "stop": _Connection.op_stop,
}


class _Refused(Exception):
    def __init__(self, kind: str, message: str, **more: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.more = more


def _string(msg: dict[str, Any], key: str) -> str:
    value = msg.get(key)
    if not isinstance(value, str):
        raise _Refused("request", f"{key!r} must be a string, got {type(value).__name__}")
    return value


def _close_fd(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _own_code_filter() -> list[str]:
    """``*:mod:__main__`` and the loaded top-level modules that live in the main script's
    directory (what ``rethook record`` traces by default)."""
    patterns = ["*:mod:__main__"]
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main_file:
        return patterns
    root = os.path.dirname(os.path.realpath(main_file)) + os.sep
    for name, mod in list(sys.modules.items()):
        if "." in name or name == "__main__" or name.startswith("rethook"):
            continue
        try:
            f = getattr(mod, "__file__", None)
            if f and os.path.realpath(f).startswith(root):
                patterns.append(f"*:mod:{name}")
        except Exception:  # noqa: BLE001 - a module object that misbehaves: not ours
            continue
    return patterns


# --- process-wide hooks -------------------------------------------------------------------------
def _install_fork_hooks() -> None:
    global _fork_hooks
    if _fork_hooks:
        return
    _fork_hooks = True

    def before() -> None:
        ch = current()
        if ch is not None:
            ch._before_fork()

    def parent() -> None:
        ch = current()
        if ch is not None:
            ch._after_fork_parent()

    def child() -> None:
        ch = _current
        if ch is not None and not ch.closed:
            ch._after_fork_child()

    os.register_at_fork(before=before, after_in_parent=parent, after_in_child=child)


def _install_instance_hook() -> None:
    """Registered once the engine is imported, so that its ``before`` runs ahead of the
    engine's (no request holds the channel's lock waiting for the engine's while the engine's
    is held for the fork) and its ``after_in_child`` after the engine's: there it removes the
    parent's client sessions (their hooks would trace the child for nobody), and the
    process's instance too if the child does not listen (nobody could read it)."""
    global _instance_hook
    if _instance_hook:
        return
    _instance_hook = True
    os.register_at_fork(before=_lock_for_fork, after_in_parent=_unlock_after_fork,
                        after_in_child=_drop_parent_sessions)


_locked_for_fork: list[Channel] = []


def _lock_for_fork() -> None:
    ch = current()
    if ch is not None:
        ch._lock.acquire()  # no request half done in the child
        _locked_for_fork.append(ch)


def _unlock_after_fork() -> None:
    while _locked_for_fork:
        _locked_for_fork.pop()._lock.release()


def _drop_parent_sessions() -> None:
    global _forked_from
    parent, _forked_from = _forked_from, None
    _locked_for_fork.clear()  # the child's lock is a new one
    if parent is None:
        return
    from rethook.engine.core import notrace

    with notrace():
        for fs in list(parent._sessions):
            fs.close()
        parent._sessions.clear()
        if parent._owns_fs and parent._fs is not None and current() is None:
            parent._fs.close()
