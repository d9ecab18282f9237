"""Attaching to a process that did not opt in: CPython 3.14's ``sys.remote_exec`` (PEP 768).

Python 3.14 lets a process of the same user (and the same Python version) ask a running
interpreter to execute a script file at its next safe point. rethook uses that for one thing
only: the target runs :data:`SCRIPT`, which imports rethook and calls
:func:`rethook.control.channel.listen`; from then on everything goes through the control
channel as for a program started with ``rethook run``. Nothing the user types becomes code:
the script is fixed and names no function, filter or file.

Earlier Pythons (3.12, 3.13) have no such door: such a program must have been started with
``rethook run`` or opt in (``rethook.control.listen()``, ``RETHOOK_CONTROL=1``). :func:`plan`
says so, and for a 3.14 target it checks what the kernel will check -- same user, Yama's
``ptrace_scope``, ``CAP_SYS_PTRACE`` -- and names what is missing before anything is tried.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from rethook.control import directory

#: The first Python with ``sys.remote_exec``.
MIN_VERSION = (3, 14)

#: How long to wait for the target to run the script (it runs at the interpreter's next safe
#: point: at once in running code, later for a thread blocked in a system call).
ATTACH_TIMEOUT = 10.0

#: What the target executes. ``{root}`` is where the client's rethook package lives (used
#: only if the target cannot import rethook by itself; the path is removed again after).
SCRIPT = """\
import sys
try:
    import rethook.control.channel as _rethook_channel
except ImportError:
    sys.path.insert(0, {root!r})
    try:
        import rethook.control.channel as _rethook_channel
    finally:
        sys.path.remove({root!r})
_rethook_channel.listen(how="attach")
del _rethook_channel
"""

_CAP_SYS_PTRACE = 19
_PYTHON_NAME = re.compile(r"python(\d+)\.(\d+)")
_LIBPYTHON = re.compile(r"libpython(\d+)\.(\d+)")


class AttachError(Exception):
    """The process cannot be attached to; the message says what is missing and what to do."""


@dataclass
class Target:
    pid: int
    uid: int
    version: tuple[int, int] | None  # the target's Python (major, minor), if it can be told
    exe: str  # its executable (what to run sys.remote_exec with when ours is another version)
    exe_is_python: bool


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def inspect_target(pid: int, proc: str = "/proc") -> Target:
    status = _read(f"{proc}/{pid}/status")
    if status is None:
        raise AttachError(f"no process {pid}")
    uid = -1
    for line in status.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[2])  # effective uid
    exe = os.path.realpath(f"{proc}/{pid}/exe")  # the link itself when it cannot be read
    version = None
    m = _PYTHON_NAME.fullmatch(os.path.basename(exe))
    if m:
        version = (int(m.group(1)), int(m.group(2)))
    else:
        m = _LIBPYTHON.search(_read(f"{proc}/{pid}/maps") or "")
        if m:
            version = (int(m.group(1)), int(m.group(2)))
    return Target(pid, uid, version, exe, exe_is_python=_PYTHON_NAME.fullmatch(
        os.path.basename(exe)) is not None)


def _has_cap_sys_ptrace(proc: str) -> bool:
    for line in (_read(f"{proc}/self/status") or "").splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> _CAP_SYS_PTRACE & 1)
    return False


def _ptrace_scope(proc: str) -> int | None:
    text = _read(f"{proc}/sys/kernel/yama/ptrace_scope")
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


HOW_TO_OPT_IN = ("start the program with 'rethook run [--] SCRIPT ARGS' (or 'rethook run -m "
                 "MODULE ARGS'), or have it call rethook.control.listen() once")


def plan(pid: int, proc: str = "/proc", our_version: tuple[int, int] | None = None,
         euid: int | None = None) -> list[str] | None:
    """Check that ``pid`` can be attached to; return how to call ``sys.remote_exec`` (None:
    in this process; else the command of an interpreter of the target's version). Raises
    :class:`AttachError` naming what is missing."""
    our_version = our_version or sys.version_info[:2]
    euid = os.geteuid() if euid is None else euid
    target = inspect_target(pid, proc)
    if target.uid != euid:
        raise AttachError(f"process {pid} runs as uid {target.uid}, not as you (uid {euid}): "
                          "rethook attaches only to your own processes")
    if target.version is None:
        raise AttachError(f"cannot tell which Python process {pid} runs ({target.exe or '?'}): "
                          f"to control it, {HOW_TO_OPT_IN}")
    if target.version < MIN_VERSION:
        v = ".".join(map(str, target.version))
        raise AttachError(f"process {pid} runs Python {v}, which cannot be attached to from "
                          f"outside (sys.remote_exec needs Python 3.14+): {HOW_TO_OPT_IN}")
    scope = _ptrace_scope(proc)
    cap = _has_cap_sys_ptrace(proc)
    if scope == 3:
        raise AttachError("kernel.yama.ptrace_scope is 3: no process may attach to another "
                          f"until reboot; to control process {pid}, {HOW_TO_OPT_IN}")
    if scope == 2 and not cap:
        raise AttachError("kernel.yama.ptrace_scope is 2: attaching needs CAP_SYS_PTRACE "
                          "(run rethook as root)")
    if scope == 1 and not cap:
        raise AttachError("kernel.yama.ptrace_scope is 1: only a parent process may attach; "
                          "run rethook with CAP_SYS_PTRACE (as root), lower the scope "
                          "('sysctl kernel.yama.ptrace_scope=0'), or start the program under "
                          "'setpriv --ptracer any'")
    if target.version == our_version:
        return None
    if not target.exe_is_python:
        v = ".".join(map(str, target.version))
        raise AttachError(f"process {pid} runs Python {v} embedded in {target.exe}: run "
                          f"rethook with Python {v} to attach to it")
    return [target.exe, "-I", "-c",
            "import sys; sys.remote_exec(int(sys.argv[1]), sys.argv[2])"]


def attach(pid: int, timeout: float = ATTACH_TIMEOUT) -> directory.Entry:
    """Make ``pid`` listen (see the module's docstring) and return its channel's entry."""
    helper = plan(pid)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    fd, script = tempfile.mkstemp(prefix="rethook-attach-", suffix=".py")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(SCRIPT.format(root=root))
        _remote_exec(pid, script, helper)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            entry = directory.find(pid)
            if entry is not None:
                return entry
            if directory.process_start(pid) is None:
                raise AttachError(f"process {pid} exited while attaching")
            time.sleep(0.05)
        raise AttachError(f"process {pid} did not run the attach script within {timeout:g} s: "
                          "it runs Python code only at its next safe point (a thread blocked in "
                          "a system call waits), and remote debugging may be off "
                          "(PYTHON_DISABLE_REMOTE_DEBUG, -X disable_remote_debug)")
    finally:
        os.unlink(script)


def _remote_exec(pid: int, script: str, helper: list[str] | None) -> None:
    try:
        if helper is None:
            sys.remote_exec(pid, script)  # type: ignore[attr-defined]
            return
        done = subprocess.run([*helper, str(pid), script], capture_output=True, text=True,
                              timeout=30)
    except PermissionError as e:
        raise AttachError(f"not allowed to attach to process {pid} ({e}): attaching needs "
                          "ptrace rights over it (same user, CAP_SYS_PTRACE where Yama or a "
                          "container restricts ptrace)") from None
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        raise AttachError(f"attaching to process {pid} failed: {e}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        if "PermissionError" in last or "Operation not permitted" in last:
            raise AttachError(f"not allowed to attach to process {pid} ({last}): attaching "
                              "needs ptrace rights over it (same user, CAP_SYS_PTRACE where "
                              "Yama or a container restricts ptrace)")
        raise AttachError(f"attaching to process {pid} failed: {last}")
