"""``rethook view``: the page's data (checked against the trace and against the folded-stack
exporter), aggregation of big traces, the command line, and the page itself in a real
headless Chromium (Debian's package), driven by Playwright.

The browser test records a threaded asyncio program with ``rethook record`` (a subprocess),
writes the page with ``rethook view``, loads it, and checks what the viewer shows against the
trace: no console errors, no network request, the slices per thread, zoom (Ctrl+wheel and keys),
search (typing, Enter), the flame graph, the histograms. Screenshots of every tab are kept in
$RETHOOK_ARTIFACTS/view-screenshots, else in pytest's tmp dir (the path is printed on stderr);
they are for people to look at, never compared pixel by pixel.

Chromium and Playwright are set up by .ci/run; elsewhere the browser test skips, saying what
is missing, except under CI=true, where it fails.
"""

from __future__ import annotations

import heapq
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rethook.buffer.tracefile import TraceWriter
from rethook.buffer.traceread import TraceReader
from rethook.output import html as view_html
from rethook.output.folded import _graph_stacks
from rethook.output.html import build_view, page
from rethook.tracers.formats import BUILTIN, FUNCGRAPH_ENTRY, FUNCGRAPH_EXIT, FUNCGRAPH_RESUME
from test_cli import rethook

# -- decoding the page's data back into slices ----------------------------------------------


def _prefix(deltas: list[int]) -> list[int]:
    out, t = [], 0
    for d in deltas:
        t += d
        out.append(t)
    return out


def slices_of(data: dict[str, Any]) -> dict[int, list[tuple[int, int, int, str]]]:
    """tid -> (depth, start, end, name) of every slice on the timeline, as viewer.js reads
    them (starts relative to the first event)."""
    strings = data["strings"]
    out: dict[int, list[tuple[int, int, int, str]]] = {}
    for proc in data["processes"]:
        for th in proc["threads"]:
            rows = out.setdefault(th["tid"], [])
            for depth, row in enumerate(th["rows"]):
                for s, d, n in zip(_prefix(row["start"]), row["dur"], row["name"], strict=True):
                    rows.append((depth, s, s + d, strings[n]))
    return out


def check_layout(data: dict[str, Any]) -> None:
    """What viewer.js relies on: rows in start order, never overlapping, and every slice
    below depth 0 inside a slice of the row above."""
    for tid, slices in slices_of(data).items():
        by_depth: dict[int, list[tuple[int, int]]] = {}
        for depth, s, e, _ in slices:
            assert s <= e, (tid, depth, s, e)
            row = by_depth.setdefault(depth, [])
            assert not row or row[-1][1] <= s, f"tid {tid}: depth {depth} overlaps or unsorted"
            row.append((s, e))
        for depth, row in by_depth.items():
            if depth == 0:
                continue
            above = by_depth.get(depth - 1, [])
            for s, e in row:
                assert any(ps <= s and e <= pe for ps, pe in above), (tid, depth, s, e)


def slice_counts(path: Path) -> tuple[Counter[int], Counter[tuple[int, str]], Counter[int]]:
    """From the raw events: slices per thread (an entry or a resumption starts one), slices per
    (thread, function), and non-graph events (markers) per thread."""
    per_tid: Counter[int] = Counter()
    per_func: Counter[tuple[int, str]] = Counter()
    markers: Counter[int] = Counter()
    with TraceReader(path) as reader:
        graph = {f.id for f in reader.formats if f.name.startswith("funcgraph_")}
        for ev in reader.events():
            if ev[0] in (FUNCGRAPH_ENTRY.id, FUNCGRAPH_RESUME.id):
                per_tid[ev[2]] += 1
                per_func[ev[2], ev[4]] += 1
            elif ev[0] not in graph:
                markers[ev[2]] += 1
    return per_tid, per_func, markers


# -- synthetic traces: random call trees on a few threads ----------------------------------

NAMES = ["app.main", "app.load", "pkg.mod.Class.method", "leaf"]
CALL = st.recursive(
    st.tuples(st.sampled_from(NAMES), st.integers(1, 900), st.just(())),
    lambda kids: st.tuples(st.sampled_from(NAMES), st.integers(1, 900),
                           st.lists(kids, max_size=3).map(tuple)),
    max_leaves=12)
PROGRAM = st.lists(st.lists(CALL, max_size=4), min_size=1, max_size=3)


def write_calls(path: Path, threads: list[list[tuple]],
                lost: int = 0) -> list[tuple[int, int, int, str, int]]:
    """A function_graph trace of the call trees (one list per thread), then ``lost`` events
    lost on the first thread; returns every call as (tid, begin, end, name, depth)."""
    streams, calls = [], []
    for k, roots in enumerate(threads):
        tid = 100 + k
        events: list[tuple] = []
        clock = [1_000 + k]

        def walk(call: tuple, depth: int, tid: int = tid, events: list = events,
                 clock: list = clock) -> None:
            name, gap, kids = call
            clock[0] += gap
            begin = clock[0]
            events.append((FUNCGRAPH_ENTRY.id, begin, tid, depth, name, ""))
            for kid in kids:
                walk(kid, depth + 1)
            clock[0] += gap
            events.append((FUNCGRAPH_EXIT.id, clock[0], tid, depth, name, begin, 0, 0, 0, ""))
            calls.append((tid, begin, clock[0], name, depth))

        for root in roots:
            walk(root, 0)
        streams.append(events)
    with TraceWriter(str(path), {"tracer": "function_graph", "pid": 4242,
                                 "argv": ["prog.py"]}, formats=BUILTIN) as w:
        for k in range(len(threads)):
            w.set_thread_name(100 + k, f"T{k}")
        w.write_events(heapq.merge(*streams, key=lambda ev: ev[1]))
        if lost:
            w.write_lost(100, lost)
    return calls


@settings(max_examples=40, deadline=None)
@given(PROGRAM, st.integers(1, 12), st.sampled_from([0, 0, 7]))
def test_view_data_matches_the_calls(tmp_path_factory, threads, max_slices, lost):
    path = tmp_path_factory.mktemp("view") / "t.dat"
    calls = write_calls(path, threads, lost)
    with TraceReader(path) as reader:
        full = build_view(reader).data
    with TraceReader(path) as reader:
        small = build_view(reader, max_slices=max_slices)
    t0 = min((c[1] for c in calls), default=0)  # the first event is the first entry
    want = Counter((tid, b - t0, e - t0, n) for tid, b, e, n, _ in calls)
    got = Counter((tid, s, e, n) for tid, ss in slices_of(full).items() for _, s, e, n in ss)
    assert got == want
    check_layout(full)
    # lost events: a marker of their own, counted on their thread, never thinned
    for data in (full, small.data):
        first = [th for p in data["processes"] for th in p["threads"] if th["tid"] == 100]
        assert sum(th["lost"] for th in first) == lost
        assert sum(th["markers"]["kind"].count(view_html.MARK_LOST) for th in first) == \
            (1 if lost else 0)
    check_layout(small.data)

    # aggregated: the longest calls, a caller always with its callees' longest
    kept = [(tid, s, e) for tid, ss in slices_of(small.data).items() for _, s, e, _ in ss]
    assert small.slices_shown == len(kept) <= max_slices
    assert small.slices == len(calls)
    dropped = Counter((tid, b - t0, e - t0) for tid, b, e, _, _ in calls)
    dropped.subtract(Counter(kept))
    longest_dropped = max((e - s for (_, s, e), n in dropped.items() if n), default=-1)
    assert all(e - s > longest_dropped for _, s, e in kept)
    assert bool(small.notes()) == (len(kept) < len(calls))

    # the call tree counts every call, aggregated or not
    prof = small.data["profile"]
    assert sum(prof["count"]) == len(calls)
    assert prof["total"][0] == sum(e - b for _, b, e, _, depth in calls if depth == 0)


def test_threads_go_under_their_process(tmp_path):
    """A reader that knows the processes of a trace (followed children) puts each thread
    under its own process, in the timeline and in the call tree."""
    path = tmp_path / "t.dat"
    write_calls(path, [[("app.main", 5, (("app.work", 3, ()),))], [("child.main", 4, ())]])

    class TwoProcesses(TraceReader):
        processes = {777: {"argv": ["/srv/child.py", "-v"]}}
        thread_pids = {101: 777}

    with TwoProcesses(path) as reader:
        data = build_view(reader).data
    strings = data["strings"]
    procs = {p["pid"]: (strings[p["name"]], p["cmdline"], [t["tid"] for t in p["threads"]])
             for p in data["processes"]}
    assert procs == {4242: ("prog.py (pid 4242)", ["prog.py"], [100]),
                     777: ("child.py (pid 777)", ["/srv/child.py", "-v"], [101])}
    paths = {node: strings[name] for node, name in enumerate(data["profile"]["name"])}
    parent = data["profile"]["parent"]
    by_name = {paths[n]: paths[parent[n]] for n in paths if parent[n] >= 0}
    assert by_name["child.main"] == "T1 (101)" and by_name["T1 (101)"] == "child.py (pid 777)"
    assert by_name["app.work"] == "app.main" and by_name["T0 (100)"] == "prog.py (pid 4242)"


def tree_self_times(data: dict[str, Any]) -> dict[tuple[str, ...], int]:
    """Self time per stack from the page's call tree, stacks rooted at the thread's name."""
    prof, strings = data["profile"], data["strings"]
    paths: list[tuple[str, ...]] = []
    children_total = [0] * len(prof["parent"])
    for node, (up, name) in enumerate(zip(prof["parent"], prof["name"], strict=True)):
        paths.append(() if up < 0 else (*paths[up], strings[name]))
        if up >= 0:
            children_total[up] += prof["total"][node]
    out = {}
    for node, path in enumerate(paths):
        if len(path) >= 3:  # process, thread, frames...
            thread = re.sub(r" \(\d+\)$", "", path[1])
            out[(thread, *path[2:])] = prof["total"][node] - children_total[node]
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, Any]:
    """view_prog.py recorded with args, return values and a probe with a hist trigger."""
    tmp = tmp_path_factory.mktemp("viewprog")
    trace = tmp / "crawl.dat"
    r = rethook("record", "-O", "funcgraph-args", "-O", "funcgraph-retval",
                "-e", "r:parsed __main__.parse page ret=$retval", "-R", "hist:keys=ret",
                "-o", str(trace), "view_prog.py")
    assert r.returncode == 0, r.stderr
    scored = dict(line.split() for line in r.stdout.splitlines())
    v = rethook("view", "-i", str(trace), cwd=tmp)
    assert v.returncode == 0, v.stderr
    return {"trace": trace, "html": tmp / "crawl.html", "scored": scored, "stderr": v.stderr,
            "tmp": tmp}


def embedded(html_text: str) -> dict[str, Any]:
    m = re.search(r'<script id="rethook-data" type="application/json">(.*?)</script>',
                  html_text, re.S)
    assert m, "no data in the page"
    return json.loads(m.group(1))


def test_recorded_program_view_data(recorded):
    trace = recorded["trace"]
    data = embedded(recorded["html"].read_text("utf-8"))
    per_tid, per_func, markers = slice_counts(trace)
    with TraceReader(trace) as reader:
        names = reader.threads
    threads = {th["tid"]: th for p in data["processes"] for th in p["threads"]}
    assert {tid: th["slices"] for tid, th in threads.items()} == dict(per_tid)
    assert {tid: th["markerCount"] for tid, th in threads.items() if th["markerCount"]} == \
        dict(markers)
    # the program's own count of its score() calls, per thread (score never suspends)
    by_name = {names[tid]: n for (tid, func), n in per_func.items() if func == "__main__.score"}
    assert by_name == {name: int(n) for name, n in recorded["scored"].items()}
    check_layout(data)
    # one process, named after the program, its pid the recording's
    (proc,) = data["processes"]
    assert data["strings"][proc["name"]].startswith("view_prog.py (pid ")
    # the flame graph's self times are the folded-stack exporter's, stack for stack
    with TraceReader(trace) as reader:
        folded = _graph_stacks(reader, per_thread=True)
    # (the exporter's root frame is name-pid/tid; the view's, the thread's name)
    assert tree_self_times(data) == {(k[0].rsplit("-", 1)[0], *k[1:]): v
                                     for k, v in folded.items()}
    # details: arguments and return values ride on the slices
    infos = {data["strings"][i - 1] for th in threads.values() for row in th["rows"]
             for i in row["info"] if i}
    assert any(text.startswith("args: ") and "retval: " in text for text in infos)
    # the histogram, parsed for the bars
    (hist,) = data["histograms"]
    assert hist["event"].endswith("parsed")
    (section,) = hist["sections"]
    assert section["totals"]["hits"] == sum(markers.values()) == 12
    assert sum(row[1] for row in section["rows"]) == 12
    assert {row[0] for row in section["rows"]} == {"ret: 6", "ret: 12", "ret: 18"}


def named_tree(data: dict[str, Any]) -> list[tuple]:
    """The call tree with names instead of string ids."""
    prof, strings = data["profile"], data["strings"]
    return list(zip(prof["parent"], [strings[n] for n in prof["name"]], prof["total"],
                    prof["count"], strict=True))


def test_function_tracer_view(tmp_path):
    trace = tmp_path / "f.dat"
    r = rethook("record", "-p", "function", "-o", str(trace), "view_prog.py")
    assert r.returncode == 0, r.stderr
    with TraceReader(trace) as reader:
        view = build_view(reader)
        calls = sum(1 for _ in reader.events())
        thinned = build_view(reader, max_markers=10)
    assert view.data["profile"]["unit"] == "calls"
    assert view.markers == view.markers_shown == calls  # one marker per call
    assert view.slices == 0
    # the call tree counts every call once, under its caller, thinned markers or not
    assert sum(view.data["profile"]["count"]) == calls
    assert named_tree(thinned.data) == named_tree(view.data)
    assert thinned.markers == calls and thinned.markers_shown <= 2 * 10
    assert any("markers" in note for note in thinned.notes())


def test_hist_sections_parse():
    from rethook.probes.hist import parse_hist_trigger

    trig = parse_hist_trigger("hist:keys=name:vals=size:sort=hitcount.descending",
                              {"name": "string", "size": "u64"})
    for name, size in [("a b, c", 3), ("a b, c", 4), ("}x{", 10)]:
        trig.fire({"name": name, "size": size})
    (event,) = view_html._histograms({"kprobes/x": trig.render()})
    (section,) = event["sections"]
    assert section["vals"] == ["size"]
    assert section["rows"] == [["name: a b, c", 2, 7], ["name: }x{", 1, 10]]
    assert section["totals"] == {"hits": 3, "entries": 2, "dropped": 0}
    assert view_html._histograms("not a dict") == []


def test_page_is_self_contained_and_script_safe(tmp_path):
    path = tmp_path / "t.dat"
    evil = "</script><script>alert(1)</script><!--"
    write_calls(path, [[(evil, 5, ()), ("ok", 5, ())]])
    with TraceReader(path) as reader:
        text = page(build_view(reader))
    assert text.count("</script>") == 2  # the data's and the viewer's, nothing else
    assert "<!--" not in text
    assert embedded(text)["strings"].count(evil) == 1  # and the name comes back whole
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing to fetch


# -- the command line -----------------------------------------------------------------------


def test_view_cli_outputs(recorded, tmp_path):
    trace = recorded["trace"]
    assert re.search(r"^rethook: \d+ calls and 12 markers written to \S*/crawl\.html \(",
                     recorded["stderr"], re.M)
    out = rethook("view", "-i", str(trace), "-o", "-", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("<!doctype html>")
    e = rethook("export", "-i", str(trace), "--format", "html", "-o", "x.html", cwd=tmp_path)
    assert e.returncode == 0, e.stderr
    assert embedded((tmp_path / "x.html").read_text("utf-8")) == embedded(out.stdout)
    # aggregation is said on stderr, with the way to see everything
    small = rethook("view", "-i", str(trace), "-o", "s.html", "--max-calls", "10", cwd=tmp_path)
    assert small.returncode == 0
    assert "the timeline shows the " in small.stderr
    assert "rethook export -i " in small.stderr and "--format perfetto" in small.stderr
    assert embedded((tmp_path / "s.html").read_text("utf-8"))["aggregated"]["notes"]


def test_view_damaged_trace(recorded, tmp_path):
    """A truncated trace (a crash, SIGKILL) still gives a page of what precedes the damage,
    named on the page and on stderr (exit status 1); a file that is no trace gives none."""
    damaged = tmp_path / "d.dat"
    damaged.write_bytes(recorded["trace"].read_bytes()[:-20])  # the END chunk is lost
    r = rethook("view", "-i", str(damaged), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert re.search(rf"^rethook: error: {re.escape(str(damaged))}: .* \(at byte offset \d+\) "
                     r"\(the page shows the trace up to there\)$", r.stderr, re.M), r.stderr
    page_data = embedded((tmp_path / "d.html").read_text("utf-8"))
    assert page_data["damage"].startswith(str(damaged))
    full = embedded(recorded["html"].read_text("utf-8"))
    assert sum(t["slices"] for p in page_data["processes"] for t in p["threads"]) == \
        sum(t["slices"] for p in full["processes"] for t in p["threads"])  # all before END
    assert full["damage"] is None
    (tmp_path / "e.html").write_text("older page")
    bad = rethook("view", "-i", str(tmp_path / "d.html"), "-o", "e.html", cwd=tmp_path)
    assert bad.returncode == 1 and "not a rethook trace file" in bad.stderr
    assert (tmp_path / "e.html").read_text() == "older page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.dat", "d.html", "e.html"]


def test_view_open_uses_the_browser(recorded, tmp_path):
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(browser.stat().st_mode | stat.S_IEXEC)
    env_browser = os.environ.get("BROWSER")
    os.environ["BROWSER"] = str(browser)
    try:
        r = rethook("view", "-i", str(recorded["trace"]), "-o", "o.html", "--open",
                    cwd=tmp_path)
    finally:
        if env_browser is None:
            del os.environ["BROWSER"]
        else:
            os.environ["BROWSER"] = env_browser
    assert r.returncode == 0, r.stderr
    assert opened.read_text().strip() == (tmp_path / "o.html").resolve().as_uri()


# -- in a real browser ------------------------------------------------------------------------

#: How the tests start Chromium: headless, and nothing that would reach for the network.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def _unavailable(reason: str) -> None:
    """Skip, saying what is missing; under CI, fail: CI must run the browser test."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run the browser test: .ci/run installs it)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if os.environ.get("RETHOOK_NO_OTHER_CORE"):
        # test_ccore's rerun of the suite on the other core: the page is a function of the
        # trace file, whose making on this core the data tests above check
        pytest.skip("the browser test runs once per suite run, on its main core")
    exe = os.environ.get("RETHOOK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(exe, os.X_OK):
        _unavailable("no Chromium: apt-get install chromium (or set RETHOOK_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright is not installed: pip install -e '.[dev]'")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def test_page_in_a_browser(recorded, browser, tmp_path):
    trace, html_path = recorded["trace"], recorded["html"]
    per_tid, per_func, markers = slice_counts(trace)
    shots = Path(os.environ.get("RETHOOK_ARTIFACTS") or tmp_path) / "view-screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    pg = browser.new_page(viewport={"width": 1400, "height": 820})
    problems: list[str] = []
    requests: list[str] = []
    pg.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}")
          if m.type in ("error", "warning") else None)
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.on("request", lambda r: requests.append(r.url))
    pg.goto(html_path.as_uri())
    pg.wait_for_function("document.documentElement.dataset.ready === '1'", timeout=60_000)
    view = "window.rethookView"

    # the slices per thread, as the viewer counts them from its own data
    threads = pg.evaluate(f"{view}.threads()")
    assert {t["tid"]: t["slices"] for t in threads} == dict(per_tid)
    assert {t["tid"]: t["shown"] for t in threads} == dict(per_tid)
    assert {t["tid"]: t["markers"] for t in threads if t["markers"]} == dict(markers)
    rows = pg.eval_on_selector_all(
        "#thread-table tr[data-tid]", "rs => rs.map(r => [+r.dataset.tid, +r.dataset.slices])")
    assert dict(rows) == dict(per_tid)
    pg.screenshot(path=shots / "timeline.png")

    # zoom: Ctrl+wheel over the plot narrows the view around the pointer; 0 shows it all
    full = pg.evaluate(f"{view}.view()")
    assert (full["start"], full["end"]) == (0, full["duration"])
    box = pg.locator("#panel-timeline canvas").bounding_box()
    pg.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 200)
    pg.keyboard.down("Control")
    pg.mouse.wheel(0, -600)
    pg.keyboard.up("Control")
    pg.wait_for_function(f"{view}.view().end - {view}.view().start < {full['duration']} / 2")
    zoomed = pg.evaluate(f"{view}.view()")
    assert 0 <= zoomed["start"] < zoomed["end"] <= full["duration"]
    pg.keyboard.press("w")
    narrower = pg.evaluate(f"{view}.view()")
    assert narrower["end"] - narrower["start"] < zoomed["end"] - zoomed["start"]
    pg.keyboard.press("0")
    assert pg.evaluate(f"{view}.view()") == full

    # search: typing counts the matching calls; Enter goes to the first and selects it
    visits = sum(n for (_, func), n in per_func.items() if func == "__main__.visit")
    pg.click("#search-input")
    pg.keyboard.type("visit")
    pg.wait_for_function(f"{view}.matches() === {visits}")
    assert pg.inner_text("#search-count").startswith(f"{visits} calls")
    pg.keyboard.press("Enter")
    first = pg.evaluate(f"{view}.selected()")
    assert first["name"] == "__main__.visit"
    assert "__main__.visit" in pg.inner_text("#panel-timeline .details")
    shown = pg.evaluate(f"{view}.view()")
    assert shown["start"] <= first["start"] <= first["end"] <= shown["end"]  # in view
    pg.keyboard.press("Enter")
    second = pg.evaluate(f"{view}.selected()")
    assert second["name"] == "__main__.visit" and second["start"] >= first["start"]
    pg.screenshot(path=shots / "search.png")

    # flame graph and icicle: the search shows the matched share; a click zooms into a frame
    pg.click("[data-tab=flame]")
    prof = pg.evaluate(f"{view}.profile()")
    assert prof["unit"] == "ns" and 0 < prof["matched"] < prof["total"]
    assert "%" in pg.inner_text("#search-count")
    pg.screenshot(path=shots / "flame.png")
    canvas = pg.locator("#panel-flame canvas")
    cbox = canvas.bounding_box()
    scroller = pg.locator("#panel-flame .canvas-area").bounding_box()
    # the bottom row of the flame graph is the root; the one above it the process
    pg.mouse.click(cbox["x"] + 40, scroller["y"] + scroller["height"] - 4 - 18 - 9)
    assert pg.evaluate(f"{view}.profile().focus") == 1
    pg.fill("#search-input", "")
    pg.click("[data-tab=icicle]")
    pg.screenshot(path=shots / "icicle.png")

    pg.click("[data-tab=histograms]")
    assert pg.locator(".hist-table tr").count() == 1 + 3
    pg.screenshot(path=shots / "histograms.png")
    pg.click("[data-tab=info]")
    pg.screenshot(path=shots / "info.png")

    assert not problems, problems
    assert requests == [html_path.as_uri()], requests  # nothing but the page itself
    pg.close()
    print(f"\nscreenshots of the view: {shots}", file=sys.stderr)


# -- docs/view.md ------------------------------------------------------------------------------

DOCS = Path(__file__).parent.parent / "docs" / "view.md"


def test_docs_examples_run(tmp_path):
    """Every example of docs/view.md, in order, in one directory: shell blocks with the
    rethook of this Python on PATH, Python blocks as scripts."""
    blocks = re.findall(r"^```(sh|python)\n(.*?)^```", DOCS.read_text("utf-8"), re.S | re.M)
    assert [lang for lang, _ in blocks] == ["sh", "python"]
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep
           + os.environ.get("PATH", "")}
    env.pop("BROWSER", None)
    for lang, code in blocks:
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else \
            [sys.executable, "-c", code]
        r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, f"{lang} block failed:\n{code}\n{r.stdout}\n{r.stderr}"
    for name in ("demo.html", "demo-page.html", "demo-api.html"):
        assert embedded((tmp_path / name).read_text("utf-8"))["version"] == 1
