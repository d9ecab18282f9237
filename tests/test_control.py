"""The control channel end to end: programs under ``rethook run``, controlled from other
processes with ``rethook ctl``, ``record -P``, ``stream -P`` and ``profile -P``.

Every target is a real long-running program in a subprocess; every client is the
``rethook`` command in another one (or :class:`RemoteTracefs`, for the raw protocol).
Nothing waits on a timing threshold: where a test waits for the target to notice something,
it polls until it has (with a generous give-up for a hung run).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import click
import pytest

from rethook.buffer.traceread import TraceReader
from rethook.cli.ctl import parse_verb
from rethook.cli.reporting import _render
from rethook.control import directory
from rethook.control.attach import AttachError, plan
from rethook.control.client import ControlError, RemoteTracefs
from rethook.control.tracefs import Tracefs, TracefsError

PROGRAMS = Path(__file__).parent / "control_programs"
GIVE_UP = 60.0  # seconds before a wait is a hang, not a slow machine


@pytest.fixture
def ctl_dir(monkeypatch):
    """A control directory of the test's own (short: socket paths have a length limit)."""
    path = tempfile.mkdtemp(prefix="rh", dir="/tmp")
    monkeypatch.setenv(directory.ENV_DIR, path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONWARNINGS", "PYTHONUNBUFFERED"):
        env.pop(name, None)
    return env


def rethook(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rethook", *args], env=_env(),
                          capture_output=True, text=True, timeout=120, **kw)


def start(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "rethook", *args], env=env or _env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def until(predicate, what: str):
    deadline = time.monotonic() + GIVE_UP
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


class Program:
    """A program under ``rethook run``, listening (its first stdout line read)."""

    def __init__(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = start("run", str(PROGRAMS / name), *args, env=env)
        self.first = self.proc.stdout.readline()
        self.pid = self.proc.pid
        until(lambda: directory.find(self.pid), f"process {self.pid} to listen")

    def finish(self) -> tuple[str, str, int]:
        out, err = self.proc.communicate("\n", timeout=GIVE_UP)
        return self.first + out, err, self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def ticker(ctl_dir):
    prog = Program("ticker.py")
    yield prog
    prog.kill()


def enabled(pid: int) -> str:
    """``cat enabled_functions`` of the process (the engine's hooks, every instance's)."""
    with RemoteTracefs.connect(pid) as fs:
        return fs.read("enabled_functions")


def graph_calls(trace: str, name: str) -> int:
    """Entries of ``name`` in the file's function_graph report (``name();``, ``name() {``)."""
    out = io.StringIO()
    with TraceReader(trace) as reader:
        _render(reader, [], out)
        assert reader.damage is None
    return len(re.findall(rf"\b{re.escape(name)}\(\)", out.getvalue()))


# --- the service: record -P, detach, record again ------------------------------------------------
def test_http_service_recorded_while_attached_and_left_as_it_was(ctl_dir, tmp_path):
    """A threaded HTTP server with a worker pool, under ``rethook run``: ``record -P`` holds
    exactly the requests made while attached; after it the program has no hooks, answers as
    before, and can be recorded again."""
    prog = Program("httpserver.py")
    try:
        port = int(prog.first)

        def get(path: str) -> dict:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=30) as r:
                return json.loads(r.read())

        before = [get(str(n)) for n in (3, 4)]
        assert enabled(prog.pid) == ""

        def record(out: Path, requests: list[int]) -> tuple[list[dict], str]:
            rec = start("record", "-P", str(prog.pid), "-l", "handle", "-l", "work",
                        "-o", str(out))
            line = rec.stderr.readline()
            assert "recording process" in line, line + rec.stderr.read()
            answers = [get(str(n)) for n in requests]
            rec.send_signal(signal.SIGINT)
            _, err = rec.communicate(timeout=GIVE_UP)
            assert rec.returncode == 0, err
            return answers, err

        first, err = record(tmp_path / "one.dat", [5, 6, 7])
        assert re.search(r"rethook: 12 events \(0 lost\) written to .*one\.dat", err), err
        assert graph_calls(str(tmp_path / "one.dat"), "__main__.handle") == 3
        assert graph_calls(str(tmp_path / "one.dat"), "__main__.work") == 3
        assert enabled(prog.pid) == ""  # every hook gone
        after = [get(str(n)) for n in (3, 4)]
        second, _ = record(tmp_path / "two.dat", [2])
        assert graph_calls(str(tmp_path / "two.dat"), "__main__.handle") == 1
        assert enabled(prog.pid) == ""
        # the answers are the program's own: same results, one count per request
        assert [a["result"] for a in before + first + after + second] == \
            [5, 14, 30, 55, 91, 5, 14, 1]
        assert [a["requests"] for a in before + first + after + second] == list(range(1, 9))
        get("quit")
        out, err, status = prog.finish()
        assert (out.splitlines()[-1], err, status) == ("answered 8", "", 0)
    finally:
        prog.kill()


# --- ctl: files, words and errors ---------------------------------------------------------------
def test_ctl_reads_and_writes_tracefs_files(ticker):
    pid = str(ticker.pid)
    listing = rethook("ctl")
    assert re.search(rf"^\s*{pid}\s+{os.getpid()}\s+\S+\s+run\s+python .*ticker\.py$",
                     listing.stdout, re.M), listing.stdout
    assert rethook("ctl", pid, "echo", "tick", ">", "set_ftrace_filter").returncode == 0
    assert rethook("ctl", pid, "echo", "tock", ">>set_ftrace_filter").returncode == 0
    assert rethook("ctl", pid, "cat", "set_ftrace_filter").stdout == "tick\ntock\n"
    with RemoteTracefs.connect(ticker.pid) as fs:
        assert {"current_tracer", "set_ftrace_filter", "trace_pipe", "enabled_functions"} \
            <= set(fs.listdir())
        fs.write("current_tracer", "function")
        assert fs.read("enabled_functions") == "__main__.tick (1)\n__main__.tock (1)\n"
        until(lambda: "__main__.tock <-__main__.tick" in fs.read("trace"), "events")
        fs.write("current_tracer", "nop")
        fs.write("set_ftrace_filter", "")
        assert fs.read("enabled_functions") == ""
    out, err, status = ticker.finish()
    assert (out, err, status) == ("ready 2 ['MainThread', 'ticker']\nticked True 1\n", "", 0)


def test_ctl_errors_are_the_in_process_errors(ticker):
    pid = str(ticker.pid)
    local = Tracefs()
    stamp = re.compile(r"\[ *[\d.]+\] ")  # error_log's timestamp
    with RemoteTracefs.connect(ticker.pid) as remote:
        for path, text in [("current_tracer", "bogus"), ("max_graph_depth", "x"),
                           ("dynamic_events", "p:g/e __main__.tick x=__import__('os')"),
                           ("no_such_file", "1")]:
            with pytest.raises(TracefsError) as expected:
                local.write(path, text)
            with pytest.raises(TracefsError) as got:
                remote.write(path, text)
            assert stamp.sub("", str(got.value)) == stamp.sub("", str(expected.value))
        # the probe grammar stays a grammar: nothing of that text ran; error_log has it
        assert "__import__" in remote.read("error_log")
        assert remote.read("dynamic_events") == ""
    local.close()
    r = rethook("ctl", pid, "write", "current_tracer", "bogus")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "rethook: error: current_tracer: unknown tracer 'bogus' (available: " \
        "function_graph function nop)\n"
    r = rethook("ctl", "999999999", "ls")
    assert (r.returncode, r.stderr) == (1, "rethook: error: no process 999999999 (is it still "
                                           "running?)\n")


def test_ctl_words():
    assert parse_verb([]) == ("ls", "", "")
    assert parse_verb(["cat", "trace"]) == ("cat", "trace", "")
    assert parse_verb(["echo", "a", "b", ">", "set_ftrace_filter"]) == \
        ("write", "set_ftrace_filter", "a b")
    assert parse_verb(["echo", "x", ">>", "f"]) == ("append", "f", "x")
    assert parse_verb(["echo", "x", ">>f"]) == ("append", "f", "x")
    assert parse_verb(["write", "f", "a", "b"]) == ("write", "f", "a b")
    assert parse_verb(["append", "f"]) == ("append", "f", "")
    for words in (["echo", "tick", "set_ftrace_filter"], ["echo", ">", "a", "b"],
                  ["cat"], ["rm", "x"]):
        with pytest.raises(click.UsageError):
            parse_verb(words)


def test_bad_requests_get_errors_and_change_nothing(ticker):
    """The raw protocol: broken JSON, wrong shapes, unknown ops, an oversized frame."""
    entry = directory.find(ticker.pid)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(entry.socket)
        f = s.makefile("rb")

        def frame() -> dict:
            (n,) = struct.unpack(">I", f.read(4))
            return json.loads(f.read(n))

        def send(raw: bytes) -> dict:
            s.sendall(struct.pack(">I", len(raw)) + raw)
            return frame()

        assert frame()["pid"] == ticker.pid  # the hello
        for raw, kind in [(b"{not json", "request"), (b"[1, 2]", "request"),
                          (b'{"op": "rm -rf"}', "request"), (b'{"op": "read"}', "request"),
                          (b'{"op": "write", "path": "tracing_on", "text": 1}', "request"),
                          (b'{"op": "write", "path": "tracing_on", "text": "2"}', "tracefs"),
                          (b'{"op": "stop"}', "request")]:
            answer = send(raw)
            assert answer["ok"] is False and answer["error"]["kind"] == kind, (raw, answer)
        assert send(b'{"op": "read", "path": "tracing_on"}') == {"ok": True, "text": "1\n"}
        s.sendall(struct.pack(">I", 1 << 30))  # a frame larger than anything accepted
        assert f.read(1) == b""  # the target hangs up on a broken stream
    assert enabled(ticker.pid) == ""
    assert ticker.finish()[2] == 0


# --- several clients ----------------------------------------------------------------------------
def test_two_clients_at_once_and_a_client_killed_mid_stream(ticker):
    pid = ticker.pid
    names = ["alpha", "beta", "gamma", "delta"]
    errors: list[BaseException] = []

    def writer(mine: list[str]) -> None:
        try:
            with RemoteTracefs.connect(pid) as fs:
                for name in mine * 5:
                    fs.write("set_ftrace_filter", name, append=True)
                    text = fs.read("set_ftrace_filter")
                    assert text.endswith("\n") and f"{name}\n" in text
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(names[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with RemoteTracefs.connect(pid) as fs:
        assert sorted(fs.read("set_ftrace_filter").split()) == sorted(names)
        fs.write("set_ftrace_filter", "")
    # a stream -P client killed while its events flow: its hooks go with it
    stream = start("stream", "-P", str(pid), "-l", "tick")
    assert "tick" in stream.stdout.readline()
    assert "__main__.tick" in enabled(pid)
    stream.kill()
    stream.communicate()
    until(lambda: enabled(pid) == "", "the killed client's hooks to go")
    assert ticker.finish()[2] == 0


def test_program_exiting_while_clients_stream(ticker, tmp_path):
    pid = str(ticker.pid)
    stream = start("stream", "-P", pid, "-l", "tick", "-p", "function")
    record = start("record", "-P", pid, "-l", "tick", "-o", str(tmp_path / "t.dat"))
    assert "recording" in record.stderr.readline()
    assert "tick" in stream.stdout.readline()
    out, err, status = ticker.finish()
    assert status == 0 and err == ""
    _, rerr = record.communicate(timeout=GIVE_UP)
    sout, serr = stream.communicate(timeout=GIVE_UP)
    assert record.returncode == 0 and stream.returncode == 0
    assert f"process {pid} exited" in rerr and f"process {pid} exited" in serr
    assert re.search(r"rethook: [\d,]+ events \(0 lost\) written to", rerr)
    # A complete file; how many ticks it holds depends on when the program read its line
    # (the ticker may end before it ticks again with record's hooks live).
    graph_calls(str(tmp_path / "t.dat"), "__main__.tick")  # reads it whole, undamaged
    with TraceReader(tmp_path / "t.dat") as reader:
        assert reader.all_meta["end_time"]
    assert directory.find(ticker.pid) is None


def test_profile_running_process(ticker):
    r = rethook("profile", "-P", str(ticker.pid), "-l", "tick", "-l", "tock",
                "--duration", "0.3")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: int(line.split()[1]) for line in r.stdout.splitlines()[2:]}
    assert set(rows) == {"__main__.tick", "__main__.tock"} and rows["__main__.tick"] > 0
    assert enabled(ticker.pid) == ""
    assert ticker.finish()[2] == 0


# --- permissions ------------------------------------------------------------------------------
def test_other_users_are_refused(ticker, tmp_path):
    """Another user can neither reach the socket nor, with the permissions opened up by
    mistake, be served (SO_PEERCRED); a socket someone else owns is refused by the client."""
    if os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs root (to act as another user) and /usr/bin/python3")
    entry = directory.find(ticker.pid)
    probe = ("import json, socket, struct, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1])\n"
             "except OSError as e:\n    print('refused', e.errno); sys.exit()\n"
             "n = struct.unpack('>I', s.recv(4))[0]\n"
             "print(json.loads(s.recv(n))['error']['message'])\n")

    def as_nobody() -> str:
        return subprocess.run(["/usr/bin/python3", "-I", "-c", probe, entry.socket], user=65534,
                              group=65534, capture_output=True, text=True,
                              timeout=GIVE_UP).stdout
    assert as_nobody().startswith("refused 13")  # EACCES: the directory is 0700
    os.chmod(os.path.dirname(entry.socket), 0o711)
    os.chmod(entry.socket, 0o666)
    try:
        assert "uid 65534 may not control process" in as_nobody()
    finally:
        os.chmod(entry.socket, 0o600)
        os.chmod(os.path.dirname(entry.socket), 0o700)
    os.chown(entry.socket, 65534, -1)
    try:
        with pytest.raises(ControlError, match="belongs to uid 65534"):
            RemoteTracefs.connect(ticker.pid, entry.socket)
    finally:
        os.chown(entry.socket, 0, -1)
    assert ticker.finish()[2] == 0


def test_a_shared_control_directory_is_refused(tmp_path, monkeypatch):
    shared = tempfile.mkdtemp(prefix="rh", dir="/tmp")
    os.chmod(shared, 0o755)
    monkeypatch.setenv(directory.ENV_DIR, shared)
    try:
        r = subprocess.run([sys.executable, "-m", "rethook", "run",
                            str(PROGRAMS / "ticker.py")], input="\n", env=_env(),
                           capture_output=True, text=True, timeout=GIVE_UP)
        assert r.returncode == 0 and r.stdout.endswith("ticked True 1\n")
        assert "has mode 0755; it must be 0700" in r.stderr
    finally:
        shutil.rmtree(shared)


# --- attaching ------------------------------------------------------------------------------
def _fake_proc(tmp_path: Path, exe: str, uid: int = 0, scope: str | None = None,
               cap: int = 0, pid: int = 4242) -> str:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (proc / str(pid) / "exe").symlink_to(exe)
    (proc / str(pid) / "maps").write_text("")
    (proc / "self").mkdir()
    (proc / "self" / "status").write_text(f"CapEff:\t{cap:016x}\n")
    if scope is not None:
        (proc / "sys/kernel/yama").mkdir(parents=True)
        (proc / "sys/kernel/yama/ptrace_scope").write_text(scope + "\n")
    return str(proc)


def test_attach_decisions(tmp_path):
    """What attaching checks before it tries (the 3.14 path cannot run without a 3.14)."""
    def decide(exe, ours=(3, 14), **kw):
        proc = _fake_proc(tmp_path / str(len(os.listdir(tmp_path))), exe, **kw)
        return plan(4242, proc=proc, our_version=ours, euid=0)

    with pytest.raises(AttachError, match=r"Python 3\.13, which cannot be attached.*rethook "
                                          r"run \[--\] SCRIPT"):
        decide("/usr/bin/python3.13")
    with pytest.raises(AttachError, match=r"runs as uid 1000, not as you"):
        decide("/usr/bin/python3.14", uid=1000)
    with pytest.raises(AttachError, match=r"ptrace_scope is 1: only a parent"):
        decide("/usr/bin/python3.14", scope="1")
    with pytest.raises(AttachError, match=r"ptrace_scope is 3"):
        decide("/usr/bin/python3.14", scope="3", cap=1 << 19)
    with pytest.raises(AttachError, match=r"cannot tell which Python"):
        decide("/usr/bin/uwsgi")
    assert decide("/usr/bin/python3.14", scope="1", cap=1 << 19) is None  # CAP_SYS_PTRACE
    assert decide("/opt/py/bin/python3.14", ours=(3, 13), scope="0")[:2] == \
        ["/opt/py/bin/python3.14", "-I"]


def test_a_program_that_did_not_opt_in(tmp_path, ctl_dir):
    """On 3.12/3.13 there is no way in from outside: the error says how to start it."""
    plain = subprocess.Popen([sys.executable, str(PROGRAMS / "ticker.py")], env=_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        plain.stdout.readline()
        r = rethook("record", "-P", str(plain.pid), "-o", str(tmp_path / "x.dat"))
        if sys.version_info < (3, 14):
            assert r.returncode == 1
            assert "cannot be attached to from outside" in r.stderr
            assert "'rethook run [--] SCRIPT ARGS'" in r.stderr
            assert not (tmp_path / "x.dat").exists()
    finally:
        plain.communicate("\n", timeout=GIVE_UP)
    assert plain.returncode == 0


# --- forks and the listing --------------------------------------------------------------------
def test_forked_children_listen_and_are_addressed_together(ctl_dir, tmp_path):
    """The idle channel forks cleanly (no fork warning even as an error), each child listens
    with its parent's pid, and --children reaches them all."""
    env = {**_env(), "PYTHONWARNINGS": "error::DeprecationWarning"}
    prog = Program("forker.py", env=env)
    try:
        assert prog.first == "threads 1\n"
        assert prog.proc.stdout.readline() == "forked 2\n"
        family = until(lambda: len(f := directory.family(directory.entries(), prog.pid)) == 3
                       and f, "both children to listen")
        assert [e.ppid for e in family[1:]] == [prog.pid, prog.pid]
        assert {e.run_id for e in family} == {str(prog.pid)}
        r = rethook("ctl", "--children", str(prog.pid), "cat", "current_tracer")
        assert r.stdout.count("nop\n") == 3 and r.stdout.count("==> process") == 3, r.stderr
        out = tmp_path / "f.dat"
        r = rethook("record", "-P", str(prog.pid), "--children", "-l", "tick",
                    "--duration", "0.3", "-o", str(out))
        assert r.returncode == 0, r.stderr
        for child in family[1:]:
            assert graph_calls(f"{out}.{child.pid}", "__main__.tick") > 0
        for e in family:
            assert enabled(e.pid) == ""
        text, err, status = prog.finish()
        assert (text.splitlines()[-1], err, status) == ("exits [0, 0]", "", 0)
        assert [e.pid for e in directory.entries()] == []  # the children's stale files pruned
    finally:
        prog.kill()


def test_listen_api_and_environment(ctl_dir):
    """``rethook.control.listen()`` in the program; ``RETHOOK_CONTROL=1`` for a startup hook
    that calls listen_from_env()."""
    code = ("import sys, threading, rethook.control as c, rethook.control.channel as ch\n"
            "assert ch.listen_from_env() is None\n"
            "c.listen()\n"
            "def tick(): pass\n"
            "print('up', threading.active_count(), 'rethook.engine' in sys.modules, "
            "flush=True)\n"
            "while not sys.stdin.readline(): tick()\n")
    env = {**_env(), "RETHOOK_CONTROL": "0"}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "up 1 False\n"
        assert directory.find(p.pid).extra["how"] == "api"
        with RemoteTracefs.connect(p.pid) as fs:
            assert fs.read("current_tracer") == "nop\n"
            assert fs.hello["default_filter"] == ["*:mod:__main__"]
    finally:
        p.communicate("\n", timeout=GIVE_UP)
    assert p.returncode == 0
    assert directory.find(p.pid) is None  # removed at exit
