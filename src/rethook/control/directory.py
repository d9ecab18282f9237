"""Where control sockets live, and the list of processes that can be controlled.

Each process that listens has two files in its user's control directory: ``PID.sock``, the
Unix socket (mode 0600), and ``PID.json``, a small description written next to it (its parent
pid, the run it belongs to, its command line, its start time). The directory is the first of

* ``$RETHOOK_CONTROL_DIR`` (set: only that one),
* ``$XDG_RUNTIME_DIR/rethook`` (the user's runtime directory, when it is set),
* ``TMPDIR/rethook-UID`` (the temp directory, one per user),

created mode 0700 and refused unless it is a real directory owned by the user with no access
for anyone else. A process that ends without removing its files (``os._exit``, a signal) leaves
them stale; the listing checks each one against the running process (pid and start time)
and removes those that are gone.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

#: Environment variable naming the control directory (tests, or a shared runtime dir).
ENV_DIR = "RETHOOK_CONTROL_DIR"

#: A Unix socket's path must fit ``sun_path`` (108 bytes on Linux, with its NUL).
MAX_SOCKET_PATH = 107


class DirectoryError(OSError):
    """The control directory cannot be used: says which and why."""


def candidate_dirs() -> list[str]:
    """The directories a control socket may be in, in the order they are tried."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return [os.path.abspath(explicit)]
    dirs = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        dirs.append(os.path.join(xdg, "rethook"))
    dirs.append(os.path.join(tempfile.gettempdir(), f"rethook-{os.geteuid()}"))
    return dirs


def check_dir(path: str) -> None:
    """Refuse a control directory that is not ours alone (a symlink, another owner, group or
    other access): a socket in it could be someone else's."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise DirectoryError(f"{path} is not a directory (a symbolic link?): refusing it")
    if st.st_uid != os.geteuid():
        raise DirectoryError(f"{path} belongs to uid {st.st_uid}, not to you "
                             f"(uid {os.geteuid()}): refusing it")
    if st.st_mode & 0o077:
        raise DirectoryError(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be "
                             "0700 (no access for group or others): refusing it")


def own_dir() -> str:
    """The control directory this process listens in, created if needed."""
    path = candidate_dirs()[0]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise DirectoryError(f"cannot create the control directory {path}: {e.strerror}") \
            from None
    check_dir(path)
    return path


def socket_path(directory: str, pid: int) -> str:
    path = os.path.join(directory, f"{pid}.sock")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise DirectoryError(f"control socket path {path} is longer than a Unix socket allows "
                             f"({MAX_SOCKET_PATH} bytes): set {ENV_DIR} to a shorter directory")
    return path


def meta_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{pid}.json")


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat), None if there is
    no such process; with the pid, it names one process even after pids wrap around."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Entry:
    """One process with a control socket."""

    pid: int
    ppid: int
    run_id: str
    argv: list[str]
    socket: str
    python: str = ""
    rethook: str = ""
    start: int | None = None
    started: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def command(self) -> str:
        return " ".join(self.argv) if self.argv else "?"

    def alive(self) -> bool:
        now = process_start(self.pid)
        if now is None:
            return False
        return self.start is None or now == self.start


def describe_self(directory: str, run_id: str, **extra: Any) -> Entry:
    pid = os.getpid()
    return Entry(pid=pid, ppid=os.getppid(), run_id=run_id, argv=list(sys.orig_argv),
                 socket=socket_path(directory, pid), python=sys.version.split()[0],
                 rethook=_version(), start=process_start(pid), started=time.time(),
                 extra=extra)


def _version() -> str:
    import rethook

    return rethook.__version__


def write_entry(directory: str, entry: Entry) -> None:
    """Write ``PID.json`` (mode 0600, replaced atomically)."""
    data = {"pid": entry.pid, "ppid": entry.ppid, "run_id": entry.run_id, "argv": entry.argv,
            "socket": entry.socket, "python": entry.python, "rethook": entry.rethook,
            "start": entry.start, "started": entry.started, **entry.extra}
    final = meta_path(directory, entry.pid)
    tmp = f"{final}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, final)


def remove_entry(directory: str, pid: int) -> None:
    for path in (socket_path(directory, pid), meta_path(directory, pid)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def read_entry(path: str) -> Entry | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        known = {"pid", "ppid", "run_id", "argv", "socket", "python", "rethook", "start",
                 "started"}
        return Entry(pid=int(data["pid"]), ppid=int(data.get("ppid", 0)),
                     run_id=str(data.get("run_id", "")), argv=list(data.get("argv") or []),
                     socket=str(data["socket"]), python=str(data.get("python", "")),
                     rethook=str(data.get("rethook", "")), start=data.get("start"),
                     started=float(data.get("started") or 0.0),
                     extra={k: v for k, v in data.items() if k not in known})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def entries(prune: bool = True) -> list[Entry]:
    """Every process with a control socket in the user's control directories, by pid; stale
    entries (the process is gone) are removed on the way when ``prune``."""
    found: dict[int, Entry] = {}
    for directory in candidate_dirs():
        try:
            check_dir(directory)
            names = os.listdir(directory)
        except (OSError, DirectoryError):
            continue
        for name in names:
            stem, dot, ext = name.partition(".")
            if not stem.isdigit() or ext not in ("json", "sock"):
                continue
            pid = int(stem)
            if ext == "sock":
                if not os.path.exists(meta_path(directory, pid)) and process_start(pid) is None \
                        and prune:
                    remove_entry(directory, pid)  # a socket whose description never came
                continue
            entry = read_entry(os.path.join(directory, name))
            if entry is None or pid in found:
                continue
            if not entry.alive() or not os.path.exists(entry.socket):
                if prune:
                    remove_entry(directory, pid)
                continue
            found[pid] = entry
    return [found[pid] for pid in sorted(found)]


def find(pid: int) -> Entry | None:
    return next((e for e in entries() if e.pid == pid), None)


def family(all_entries: list[Entry], pid: int) -> list[Entry]:
    """``pid``'s entry and those of its descendants that listen, parent first."""
    by_parent: dict[int, list[Entry]] = {}
    for e in all_entries:
        by_parent.setdefault(e.ppid, []).append(e)
    out = [e for e in all_entries if e.pid == pid]
    i = 0
    while i < len(out):
        out += by_parent.get(out[i].pid, [])
        i += 1
    return out
