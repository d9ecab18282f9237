"""Whole programs as users run them, under rethook and its peers (trace0, viztracer, cProfile).

    ./dev.sh bench                       (all benchmarks; installs the bench extra first)
    .venv/bin/python bench/bench_peers.py [--repeat N] [--quick] [--tools T,...]
                                          [--workloads W,...] [--out DIR]

Each tool's command line runs each workload in a subprocess, writing its trace file, with
every function traced (``rethook record -l '*'``, ``trace0 run``, ``viztracer`` with a
``--tracer_entries`` larger than the program's calls and ``--ignore_c_function``, since the
others trace Python functions only; ``python -m cProfile -o``). Every traced run is paired
with an untraced run (``python SCRIPT``) just before it, tool order rotating each round; the
table shows medians over the pairs of:

- ratio: traced wall time / untraced wall time of the pair;
- ns/call: (traced - untraced wall time) / the program's Python calls (counted once per
  workload with bench/programs/count_calls.py);
- start, run, finish: the tool's extra wall time before the program's first line, while it
  runs, and after its last line (the programs write their own start and end times: see
  bench/programs/_marks.py), each against the untraced run's;
- lost: events the tool says it dropped, median (and how many runs lost any): rethook's
  summary, trace0's "events dropped" or its dropped-events counter in the file, viztracer's
  full-buffer warning; cProfile keeps counts only; events: what the tool says it wrote;
- file: the trace file's size; RSS: peak resident memory of the run's process tree
  (``/usr/bin/time``'s, or ``wait4``'s ``ru_maxrss``), the untraced run's in parentheses.

Workloads: ``sqlglot`` (bench/programs/sqlglot_transpile.py: SQL transpiled between
dialects, ~1.1 M calls), pyperformance benchmarks run as plain scripts with
bench/programs/pyperf_stub.py standing in for pyperf (``bm:NAME``; the default set is
richards, nbody, deltablue, raytrace, chaos, go, json_dumps, float), and ``threads``
(bench/programs/thread_storm.py: 4 threads x 2 M calls). A tool run that takes longer than
``--slow-limit`` seconds is not repeated (its row says how many pairs it has).

``PYTHONPATH`` is set to the program's directory for every run, untraced included:
``trace0 run`` executes the script without putting its directory on ``sys.path``.
Results go to ``--out`` (default bench/results/): a Markdown table with the date, Python,
machine and its load, and the raw runs as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
BIN = Path(sys.executable).parent

#: pyperformance benchmarks of the default set, with the --loops that make each ~0.3-0.6 s.
PYPERFORMANCE = {"richards": 2, "nbody": 1, "deltablue": 3, "raytrace": 1, "chaos": 1, "go": 1,
                 "json_dumps": 2, "float": 1}
TOOLS = ("rethook", "trace0", "viztracer", "cProfile")


@dataclass
class Workload:
    name: str
    script: Path
    args: list[str]
    calls: int = 0


@dataclass
class Run:
    tool: str
    workload: str
    wall: float
    start: float | None
    inrun: float | None
    finish: float | None
    rss_kb: int
    status: int
    file_size: int = 0
    events: int | None = None
    lost: int | None = None
    note: str = ""
    stderr_tail: str = ""


@dataclass
class Pair:
    base: Run
    traced: Run


@dataclass
class Results:
    pairs: dict[str, dict[str, list[Pair]]] = field(default_factory=dict)


# --- workloads ---------------------------------------------------------------------------------
def _pyperformance_dir() -> Path | None:
    try:
        import pyperformance
    except ImportError:
        return None
    d = Path(pyperformance.__file__).parent / "data-files" / "benchmarks"
    return d if d.is_dir() else None


def make_workloads(names: list[str], quick: bool, work: Path) -> list[Workload]:
    out = []
    for name in names:
        if name == "sqlglot":
            out.append(Workload(name, PROGRAMS / "sqlglot_transpile.py", ["3" if quick else "14"]))
        elif name == "threads":
            calls = "200000" if quick else "2000000"
            out.append(Workload(name, PROGRAMS / "thread_storm.py", ["4", calls]))
        elif name.startswith("bm:"):
            bm = name[3:]
            src = _pyperformance_dir()
            if src is None or not (src / f"bm_{bm}" / "run_benchmark.py").is_file():
                sys.exit(f"bench_peers: {name}: pyperformance's bm_{bm} is not installed "
                         "(./dev.sh bench installs the bench extra)")
            dst = work / f"bm_{bm}"
            shutil.copytree(src / f"bm_{bm}", dst)
            shutil.copy(PROGRAMS / "pyperf_stub.py", dst / "pyperf.py")
            shutil.copy(PROGRAMS / "_marks.py", dst / "_marks.py")
            loops = str(PYPERFORMANCE.get(bm, 1))
            out.append(Workload(name, dst / "run_benchmark.py", ["--loops", loops]))
        else:
            sys.exit(f"bench_peers: unknown workload {name!r} (sqlglot, threads, bm:NAME)")
    return out


# --- running -----------------------------------------------------------------------------------
def _env(script: Path, marks: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(script.parent)
    env["BENCH_MARKS"] = str(marks)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as users run: byte code cached
    return env


def command(tool: str, w: Workload, out: Path) -> list[str]:
    prog = [str(w.script), *w.args]
    py = sys.executable
    if tool == "python":
        return [py, *prog]
    if tool == "rethook":
        return [str(BIN / "rethook"), "record", "-l", "*", "-o", str(out), *prog]
    if tool == "trace0":
        return [str(BIN / "trace0"), "run", "-o", str(out), *prog]
    if tool == "viztracer":
        entries = max(1_000_000, int(w.calls * 1.2) + 100_000)
        return [str(BIN / "viztracer"), "--quiet", "--ignore_c_function", "--tracer_entries",
                str(entries), "-o", str(out), *prog]
    if tool == "cProfile":
        return [py, "-m", "cProfile", "-o", str(out), *prog]
    raise ValueError(tool)


#: GNU time, when there: Linux gives an exec'd child at least the peak RSS of the process that
#: forked it, so runs forked by this (bigger) script would all report at least its own peak;
#: time(1) is a small process in between. Without it, wait4's ru_maxrss (this script stays
#: small: it never reads a trace file whole).
TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None

SUFFIX = {"python": "", "rethook": ".dat", "trace0": ".pftrace", "viztracer": ".json",
          "cProfile": ".prof"}


def run_once(tool: str, w: Workload, work: Path) -> Run:
    out = work / f"out{SUFFIX[tool]}"
    marks = work / "marks.txt"
    for p in (out, marks):
        if p.exists():
            p.unlink()
    cmd = command(tool, w, out)
    err_path = work / "stderr.txt"
    rss_path = work / "rss.txt"
    if TIME is not None:  # its own small process forks the run: see peak_rss()
        cmd = [TIME, "-f", "%M", "-o", str(rss_path), *cmd]
    with open(err_path, "w") as err:
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err,
                                env=_env(w.script, marks), cwd=work)
        _, status, usage = os.wait4(proc.pid, 0)
        t1 = time.time()
    stderr = err_path.read_text(errors="replace")
    rss_kb = usage.ru_maxrss
    if TIME is not None and rss_path.exists():
        rss_kb = int(rss_path.read_text().split()[-1])
    start, inrun, finish = split_run(marks, t0, t1)
    r = Run(tool, w.name, t1 - t0, start, inrun, finish, rss_kb,
            os.waitstatus_to_exitcode(status), out.stat().st_size if out.exists() else 0)
    _read_counts(r, stderr, out)
    if r.status != 0:
        r.stderr_tail = stderr[-2000:]
    return r


def split_run(marks: Path, t0: float, t1: float) -> tuple[float | None, float | None,
                                                          float | None]:
    """``(start, in-run, finish)`` in seconds of a run spawned at ``t0`` that ended at ``t1``,
    from its program's "start" and "end" marks (None where a mark is missing)."""
    m = dict(_read_marks(marks))
    start = m["start"] - t0 if "start" in m else None
    inrun = m["end"] - m["start"] if "start" in m and "end" in m else None
    finish = t1 - m["end"] if "end" in m else None
    return start, inrun, finish


def _read_marks(path: Path, field: int = 1) -> list[tuple[str, float]]:
    """``(name, value)`` of each mark (_marks.py): field 1 its wall time, 2 the marking
    thread's CPU time."""
    if not path.exists():
        return []
    marks = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) > field:  # the last "end" wins (benchmarks may run several)
            marks.append((fields[0], float(fields[field])))
    return marks


def _read_counts(r: Run, stderr: str, out: Path) -> None:
    """Events written and lost, as each tool reports them."""
    if r.tool in ("python", "cProfile"):
        r.lost = 0  # cProfile keeps counts, nothing to drop
    elif r.tool == "rethook":
        m = re.search(r"rethook: ([\d,]+) events \(([\d,]+) lost\)", stderr)
        if m:
            r.events, r.lost = (int(g.replace(",", "")) for g in m.groups())
    elif r.tool == "trace0":
        m = re.search(r"([\d,]+) events dropped", stderr)
        r.lost = int(m.group(1).replace(",", "")) if m else 0
        if not m and out.exists() and _file_mentions(out, b"trace0_dropped_events"):
            r.lost = None
            r.note = "drops counted in the file"
    elif r.tool == "viztracer":
        m = re.search(r"Total Entries: (\d+)", stderr)
        if m:
            r.events = int(m.group(1))
        if "Circular buffer is full" in stderr:
            r.note = "buffer full: oldest entries dropped"
            r.lost = None
        else:
            r.lost = 0


def _file_mentions(path: Path, needle: bytes) -> bool:
    with open(path, "rb") as f:
        tail = b""
        while chunk := f.read(1 << 20):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle):]
    return False


def count_calls(w: Workload, work: Path) -> int:
    cmd = [sys.executable, str(PROGRAMS / "count_calls.py"), str(w.script), *w.args]
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       env=_env(w.script, work / "marks.txt"), cwd=work)
    m = re.search(r"calls (\d+)", p.stderr)
    if p.returncode != 0 or not m:
        sys.exit(f"bench_peers: {w.name} does not run:\n{p.stderr[-2000:]}")
    return int(m.group(1))


# --- the table ---------------------------------------------------------------------------------
def _med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(w: Workload, tool: str, pairs: list[Pair]) -> dict:
    ok = [p for p in pairs if p.traced.status == 0 and p.base.status == 0]
    if not ok:
        return {"workload": w.name, "tool": tool, "failed": True,
                "error": pairs[-1].traced.stderr_tail if pairs else ""}

    def delta(get) -> float | None:
        return _med([None if get(p.traced) is None or get(p.base) is None
                     else get(p.traced) - get(p.base) for p in ok])

    losts = [p.traced.lost for p in ok]
    known = [x for x in losts if x is not None]
    return {
        "workload": w.name, "tool": tool, "pairs": len(ok), "calls": w.calls,
        "ratio": _med([p.traced.wall / p.base.wall for p in ok]),
        "ns_per_call": _med([(p.traced.wall - p.base.wall) / w.calls * 1e9 for p in ok]),
        "start": delta(lambda r: r.start), "inrun": delta(lambda r: r.inrun),
        "finish": delta(lambda r: r.finish),
        "base_wall": _med([p.base.wall for p in ok]),
        "lost": None if len(known) < len(losts) else statistics.median(known),
        "runs_losing": sum(1 for x in known if x),
        "events": _med([p.traced.events for p in ok]),
        "file": _med([p.traced.file_size for p in ok]),
        "rss_mb": max(p.traced.rss_kb for p in ok) / 1024,
        "base_rss_mb": max(p.base.rss_kb for p in ok) / 1024,
        "note": "; ".join(sorted({p.traced.note for p in ok if p.traced.note})),
    }


def _fmt(v: float | None, spec: str, unit: str = "") -> str:
    return "—" if v is None else f"{v:{spec}}{unit}"


def _size(n: float | None) -> str:
    if not n:
        return "—"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "—"


def table(rows: list[dict]) -> str:
    head = ("| workload | tool | ratio | ns/call | start | run | finish | lost | events | file "
            "| peak RSS (untraced) | pairs |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        if r.get("failed"):
            err = r["error"].strip().splitlines()[-1:] or ["?"]
            lines.append(f"| {r['workload']} | {r['tool']} | failed: {err[0][:80]} |"
                         + " |" * 9)
            continue
        lost = "?" if r["lost"] is None else f"{r['lost']:,.0f}"
        if r["runs_losing"]:
            lost += f" ({r['runs_losing']}/{r['pairs']} runs)"
        if r["note"]:
            lost += f" ({r['note']})"
        events = "—" if r["events"] is None else f"{r['events']:,.0f}"
        lines.append(
            f"| {r['workload']} | {r['tool']} | {r['ratio']:.2f}x | {r['ns_per_call']:.0f} "
            f"| {_fmt(r['start'], '+.2f', ' s')} | {_fmt(r['inrun'], '+.2f', ' s')} "
            f"| {_fmt(r['finish'], '+.2f', ' s')} | {lost} | {events} | {_size(r['file'])} "
            f"| {r['rss_mb']:.0f} MB ({r['base_rss_mb']:.0f}) | {r['pairs']} |")
    return "\n".join(lines)


def targets(rows: list[dict]) -> list[str]:
    """issue 10's targets, read off the rows."""
    by = {(r["workload"], r["tool"]): r for r in rows if not r.get("failed")}
    out = []
    for wl in dict.fromkeys(r["workload"] for r in rows):
        me = by.get((wl, "rethook"))
        if me is None:
            continue
        for peer, factor in (("trace0", 1.0), ("viztracer", 0.5)):
            other = by.get((wl, peer))
            if other is not None:
                goal = factor * other["ratio"]
                verdict = "met" if me["ratio"] <= goal else "NOT met"
                out.append(f"{wl}: rethook {me['ratio']:.2f}x <= "
                           f"{'' if factor == 1 else f'{factor} x '}{peer}'s {other['ratio']:.2f}x"
                           f" = {goal:.2f}x: {verdict}")
    return out


def machine() -> dict:
    load = os.getloadavg()
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "python": platform.python_version(), "implementation": platform.python_implementation(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "load_before": [round(x, 2) for x in load]}


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("rethook", "trace0", "viztracer", "sqlglot", "pyperformance"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="pairs per tool and workload")
    ap.add_argument("--quick", action="store_true", help="small workloads, 3 pairs")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--workloads",
                    default=",".join(["sqlglot", *(f"bm:{b}" for b in PYPERFORMANCE), "threads"]))
    ap.add_argument("--slow-limit", type=float, default=120.0,
                    help="a traced run longer than this many seconds is not repeated")
    ap.add_argument("--out", default=str(HERE / "results"),
                    help="directory for the results ('' to write none)")
    args = ap.parse_args()
    repeat = 3 if args.quick and args.repeat == 5 else args.repeat
    tools = [t for t in args.tools.split(",") if t]
    for t in tools:
        if t not in TOOLS:
            sys.exit(f"bench_peers: unknown tool {t!r} (one of {', '.join(TOOLS)})")
        exe = {"rethook": "rethook", "trace0": "trace0", "viztracer": "viztracer"}.get(t)
        if exe and not (BIN / exe).exists():
            sys.exit(f"bench_peers: {exe} is not installed in {BIN} "
                     "(./dev.sh bench installs the bench extra)")
    info = machine()
    info["versions"] = _versions()
    print(f"Whole-program overhead, every function traced; Python {info['python']}, "
          f"{info['machine']}, load {info['load_before']}; medians of {repeat} pairs",
          flush=True)
    work = Path(tempfile.mkdtemp(prefix="rethook-peers-"))
    rows: list[dict] = []
    raw: list[dict] = []
    try:
        workloads = make_workloads([w for w in args.workloads.split(",") if w], args.quick, work)
        for w in workloads:
            w.calls = count_calls(w, work)
        for w in workloads:
            pairs: dict[str, list[Pair]] = {t: [] for t in tools}
            slow: set[str] = set()
            for i in range(repeat):
                order = tools[i % len(tools):] + tools[:i % len(tools)]
                for tool in order:
                    if tool in slow:
                        continue
                    base = run_once("python", w, work)
                    traced = run_once(tool, w, work)
                    pairs[tool].append(Pair(base, traced))
                    raw.append({"base": asdict(base), "traced": asdict(traced)})
                    if traced.wall > args.slow_limit or traced.status != 0:
                        slow.add(tool)
            for tool in tools:
                rows.append(summarize(w, tool, pairs[tool]))
            print(f"  {w.name}: {w.calls:,} calls, untraced "
                  f"{_med([p.base.wall for ps in pairs.values() for p in ps]):.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info["load_after"] = [round(x, 2) for x in os.getloadavg()]
    text = table(rows)
    verdicts = targets(rows)
    print(text)
    for v in verdicts:
        print(v)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"peers-{info['date'][:10]}"
        cmdline = " ".join(["bench/bench_peers.py", *sys.argv[1:]])
        stem.with_suffix(".md").write_text(
            f"# Whole-program overhead: rethook and its peers\n\n"
            f"`{cmdline}` on {info['date']}; Python {info['python']} "
            f"({info['implementation']}), {info['machine']}; load average "
            f"{info['load_before']} before, {info['load_after']} after; versions "
            f"{info['versions']}. Medians of {repeat} interleaved pairs (untraced, traced).\n\n"
            f"{text}\n\n" + "".join(f"- {v}\n" for v in verdicts))
        stem.with_suffix(".json").write_text(json.dumps(
            {"machine": info, "command": cmdline, "rows": rows, "runs": raw}, indent=1))
        print(f"results: {stem}.md, {stem}.json")


if __name__ == "__main__":
    main()
