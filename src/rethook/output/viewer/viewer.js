/* rethook's trace viewer: a timeline per process and thread, a flame graph and an icicle of
 * the call tree, the probe histograms and the trace's metadata, drawn on canvases from the data
 * that rethook/output/html.py embeds in the page (<script id="rethook-data">). Plain
 * JavaScript, no library, nothing fetched: the page's Content-Security-Policy forbids it.
 *
 * Read top-down: the data (decoding the compact columns), formatting, colours, the timeline,
 * the call tree views, histograms, info, then the page (tabs, search, keys, the test hook).
 *
 * Data layout (html.py is its owner; DATA_VERSION must match):
 *   strings[]                      every name and detail text, referred to by index
 *   processes[] = {pid, name, cmdline, threads[]}
 *   thread = {tid, name, slices, rows[depth], markers, markerCount, lost}
 *   row    = {start[] (ns, each a delta from the previous; the first from t0), dur[], name[],
 *             info[] (string index + 1, 0 for none)}; slices of a row never overlap
 *   markers = {ts[] (deltas like start), name[], info[], kind[]}  (kind: an index into
 *             markerKinds, e.g. ["event", "call", "lost", "graph"])
 *   profile = {unit: "ns" | "calls", parent[], name[], total[], count[]}; node 0 is the root,
 *             parents come before their children
 */
"use strict";
(function () {
  const DATA_VERSION = 1;
  let MARKER_KINDS = []; // the page's markerKinds: what each marker kind number stands for
  let MARK_LOST = -1;
  let MARK_GRAPH = -1;

  // ---------------------------------------------------------------------------------------
  // Data

  function prefixSum(deltas) {
    const out = new Float64Array(deltas.length);
    let t = 0;
    for (let i = 0; i < deltas.length; i++) { t += deltas[i]; out[i] = t; }
    return out;
  }

  function decodeRow(r) {
    const start = prefixSum(r.start);
    const n = start.length;
    const end = new Float64Array(n);
    for (let i = 0; i < n; i++) end[i] = start[i] + r.dur[i];
    return { n, start, end, name: Int32Array.from(r.name), info: Int32Array.from(r.info) };
  }

  function decodeMarkers(m) {
    return { n: m.ts.length, ts: prefixSum(m.ts), name: Int32Array.from(m.name),
             info: Int32Array.from(m.info), kind: Int8Array.from(m.kind) };
  }

  function decodeProfile(p, strings) {
    const n = p.parent.length;
    const children = Array.from({ length: n }, () => []);
    const depth = new Int32Array(n);
    const self = Float64Array.from(p.total);
    let maxDepth = 0;
    for (let i = 1; i < n; i++) {
      const up = p.parent[i];
      children[up].push(i);
      depth[i] = depth[up] + 1;
      if (depth[i] > maxDepth) maxDepth = depth[i];
      self[up] -= p.total[i];
    }
    for (let i = 0; i < n; i++) {
      if (self[i] < 0) self[i] = 0;
      children[i].sort((a, b) => p.total[b] - p.total[a]);
    }
    return { n, unit: p.unit, parent: Int32Array.from(p.parent), name: Int32Array.from(p.name),
             total: Float64Array.from(p.total), count: Float64Array.from(p.count), self,
             children, depth, maxDepth, strings };
  }

  function decode(raw) {
    if (raw.version !== DATA_VERSION) {
      throw new Error("this page's data is version " + raw.version + ", the viewer reads " +
                      DATA_VERSION);
    }
    MARKER_KINDS = raw.markerKinds;
    MARK_LOST = MARKER_KINDS.indexOf("lost");
    MARK_GRAPH = MARKER_KINDS.indexOf("graph");
    const strings = raw.strings;
    const threads = [];
    const processes = raw.processes.map((p) => {
      const proc = { pid: p.pid, name: strings[p.name], cmdline: p.cmdline, threads: [],
                     collapsed: false };
      for (const t of p.threads) {
        const rows = t.rows.map(decodeRow);
        const th = {
          index: threads.length, process: proc, pid: p.pid, tid: t.tid, name: strings[t.name],
          slices: t.slices, shown: rows.reduce((s, r) => s + r.n, 0), rows,
          markers: decodeMarkers(t.markers), markerCount: t.markerCount, lost: t.lost,
          collapsed: false,
        };
        proc.threads.push(th);
        threads.push(th);
      }
      return proc;
    });
    return { raw, strings, processes, threads, duration: Math.max(raw.duration, 1),
             profile: decodeProfile(raw.profile, strings) };
  }

  // first index in [lo, hi) with arr[i] > value (arr sorted ascending)
  function upperBound(arr, value, lo, hi) {
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (arr[mid] > value) hi = mid; else lo = mid + 1;
    }
    return lo;
  }

  // first index in [lo, hi) with arr[i] >= value
  function lowerBound(arr, value, lo, hi) {
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (arr[mid] < value) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  // ---------------------------------------------------------------------------------------
  // Formatting

  function fmtDur(ns) {
    const a = Math.abs(ns);
    if (a < 1e3) return (Math.round(ns * 10) / 10) + " ns";
    if (a < 1e6) return (ns / 1e3).toPrecision(3) + " µs";
    if (a < 1e9) return (ns / 1e6).toPrecision(3) + " ms";
    return (ns / 1e9).toPrecision(4) + " s";
  }

  function fmtCount(n) { return Math.round(n).toLocaleString("en-US"); }

  // "1 call", "2,345 calls"
  function counted(n, word) { return fmtCount(n) + " " + word + (n === 1 ? "" : "s"); }

  function fmtValue(v, unit) { return unit === "calls" ? counted(v, "call") : fmtDur(v); }

  function fmtPct(part, whole) {
    if (!whole) return "0%";
    const p = 100 * part / whole;
    return (p >= 10 ? p.toFixed(1) : p.toPrecision(2)) + "%";
  }

  // Ruler labels: in the unit of the view's far end, with the digits the step between
  // ticks needs ("40.1 ms" rather than "40100 µs").
  function fmtTick(t, step, far) {
    const units = [[1e9, "s"], [1e6, "ms"], [1e3, "µs"], [1, "ns"]];
    const [scale, unit] = units.find(([s]) => far >= s) || units[3];
    const digits = Math.max(0, Math.ceil(-Math.log10(step / scale) - 1e-9));
    return (t / scale).toFixed(Math.min(digits, 9)) + " " + unit;
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (k === "class") e.className = v;
        else if (k === "text") e.textContent = v;
        else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
        else e.setAttribute(k, v);
      }
    }
    for (const c of children) {
      if (c != null) e.append(c);
    }
    return e;
  }

  // ---------------------------------------------------------------------------------------
  // Colours: one per function name, the same in every view

  function hashName(s) {
    let h = 2166136261;
    for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
    return h >>> 0;
  }

  const colourCache = new Map();
  function nameColour(strings, id) {
    let c = colourCache.get(id);
    if (c === undefined) {
      const h = hashName(strings[id]);
      const hue = h % 360;
      const light = 70 + (h >>> 9) % 10;
      c = "hsl(" + hue + ",52%," + light + "%)";
      colourCache.set(id, c);
    }
    return c;
  }

  function markerColour(strings, id, kind) {
    if (kind === MARK_LOST) return "#d62728";
    if (kind === MARK_GRAPH) return "#8a8f98";
    return "hsl(" + (hashName(strings[id]) % 360) + ",60%,40%)";
  }

  const DIM = "#e3e5e9";
  const DIM_TEXT = "#a0a4ab";
  const TEXT = "#1d2127";
  const FONT = "11px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
  const FONT_BOLD = "600 11px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";

  // A label that fits `width` pixels. A qualified name that does not fit loses its leading
  // components ("pkg.mod.Class.method" -> "Class.method" -> "method"); a last component that
  // does not fit either is cut with an ellipsis.
  function fitLabel(ctx, text, width, cache) {
    if (width < 16) return "";
    if (ctx.measureText(text).width <= width) return text;
    let dot = text.indexOf(".");
    while (dot >= 0 && dot < text.length - 1) {
      const tail = text.slice(dot + 1);
      if (ctx.measureText(tail).width <= width) return tail;
      dot = text.indexOf(".", dot + 1);
    }
    const last = text.slice(text.lastIndexOf(".") + 1);
    let charW = cache.charW;
    if (!charW) charW = cache.charW = ctx.measureText("abcdefghij_.").width / 12;
    const keep = Math.floor(width / charW) - 1;
    return keep >= 2 ? last.slice(0, keep) + "…" : "";
  }

  // ---------------------------------------------------------------------------------------
  // A canvas that follows its container's size and redraws on demand

  class Surface {
    // height(): the canvas's height in CSS pixels (default: the container's)
    constructor(container, draw, height) {
      this.container = container;
      this.heightOf = height || (() => container.clientHeight);
      this.canvas = el("canvas");
      this.ctx = this.canvas.getContext("2d");
      container.append(this.canvas);
      this.draw = draw;
      this.width = 0;
      this.height = 0;
      this.pending = false;
      new ResizeObserver(() => this.resize()).observe(container);
    }

    resize() {
      const dpr = window.devicePixelRatio || 1;
      const w = this.container.clientWidth;
      const h = this.heightOf();
      if (w === this.width && h === this.height && this.dpr === dpr) return;
      this.width = w; this.height = h; this.dpr = dpr;
      this.canvas.width = Math.max(1, Math.round(w * dpr));
      this.canvas.height = Math.max(1, Math.round(h * dpr));
      this.canvas.style.width = w + "px";
      this.canvas.style.height = h + "px";
      this.redrawNow();
    }

    invalidate() {
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.redrawNow(); });
    }

    redrawNow() {
      if (!this.width || !this.height) return;
      const ctx = this.ctx;
      ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
      ctx.clearRect(0, 0, this.width, this.height);
      this.draw(ctx, this.width, this.height);
    }
  }

  // ---------------------------------------------------------------------------------------
  // Search: which string ids match the query (case-insensitive substring)

  class Search {
    constructor(strings) {
      this.strings = strings;
      this.query = "";
      this.match = null; // Uint8Array over string ids, or null when no query
    }

    set(query) {
      query = query.trim();
      if (query === this.query) return false;
      this.query = query;
      if (!query) { this.match = null; return true; }
      const q = query.toLowerCase();
      const m = new Uint8Array(this.strings.length);
      for (let i = 0; i < m.length; i++) {
        if (this.strings[i].toLowerCase().includes(q)) m[i] = 1;
      }
      this.match = m;
      return true;
    }

    active() { return this.match !== null; }
    hit(id) { return this.match === null || this.match[id] === 1; }
  }

  // ---------------------------------------------------------------------------------------
  // The timeline: one block per thread (markers lane, then one row per call depth), grouped
  // under a header per process. Time runs left to right; the view is [t0, t1] in ns from the
  // trace's first event.

  const GUTTER = 200;
  const RULER = 24;
  const ROW = 18;
  const LANE = 14;
  const PROC_HEAD = 22;
  const GAP = 8;
  const THREAD_MIN = 34;

  class Timeline {
    constructor(model, search, root) {
      this.m = model;
      this.search = search;
      this.t0 = 0;
      this.t1 = model.duration;
      this.scrollY = 0;
      this.selected = null; // {thread, depth, i} or {thread, marker: i}
      this.labelCache = {};
      this.matchList = null;
      this.matchIndex = -1;

      this.toolbar = el("div", { class: "toolbar" });
      this.range = el("span", { class: "range" });
      const button = (text, title, fn) => el("button", { type: "button", title, onclick: fn, text });
      this.toolbar.append(
        button("−", "Zoom out (S)", () => this.zoomBy(2)),
        button("+", "Zoom in (W)", () => this.zoomBy(0.5)),
        button("Fit", "Show the whole trace (0)", () => this.reset()),
        this.range,
        el("span", { class: "hint", text: "Ctrl+wheel or W/S zoom · drag or A/D pan · " +
          "wheel scrolls · click a call for details, double-click to zoom to it · " +
          "click a thread's name to fold it" }));
      this.area = el("div", { class: "canvas-area", tabindex: "0" });
      this.details = el("div", { class: "details", text: "Click a call or a marker for its details." });
      root.append(this.toolbar, this.area, this.details);
      this.surface = new Surface(this.area, (ctx, w, h) => this.draw(ctx, w, h));
      this.tip = el("div", { class: "tooltip", hidden: "" });
      document.body.append(this.tip);
      this.layout();
      this.bind();
      this.updateRange();
    }

    // -- geometry --

    threadRows(th) { return th.collapsed ? Math.min(1, th.rows.length) : th.rows.length; }

    layout() {
      // blocks: {y, h, proc} process headers and {y, h, thread, lane, rowsY} thread blocks
      const blocks = [];
      let y = 0;
      for (const p of this.m.processes) {
        blocks.push({ y, h: PROC_HEAD, proc: p });
        y += PROC_HEAD;
        if (p.collapsed) continue;
        for (const th of p.threads) {
          const lane = th.markers.n ? LANE : 0;
          const rows = this.threadRows(th);
          // at least the height of the thread's two label lines
          const h = Math.max(lane + rows * ROW, th.collapsed ? ROW : THREAD_MIN) + GAP;
          blocks.push({ y, h, thread: th, lane, rowsY: y + lane });
          y += h;
        }
      }
      this.blocks = blocks;
      this.contentHeight = y;
    }

    plotWidth() { return Math.max(1, this.surface.width - GUTTER); }
    xOf(t) { return GUTTER + (t - this.t0) * this.plotWidth() / (this.t1 - this.t0); }
    tOf(x) { return this.t0 + (x - GUTTER) * (this.t1 - this.t0) / this.plotWidth(); }

    clampScroll() {
      const max = Math.max(0, this.contentHeight - (this.surface.height - RULER));
      this.scrollY = Math.min(Math.max(0, this.scrollY), max);
    }

    setRange(t0, t1) {
      const span = Math.max(t1 - t0, 20); // never closer than 20 ns across the plot
      const total = this.m.duration;
      if (span >= total) { t0 = 0; t1 = total; } else {
        t0 = Math.min(Math.max(0, t0), total - span);
        t1 = t0 + span;
      }
      this.t0 = t0; this.t1 = t1;
      this.updateRange();
      this.surface.invalidate();
    }

    zoomBy(factor, x) {
      const at = x === undefined ? (this.t0 + this.t1) / 2 : this.tOf(x);
      this.setRange(at - (at - this.t0) * factor, at + (this.t1 - at) * factor);
    }

    panBy(px) {
      const dt = px * (this.t1 - this.t0) / this.plotWidth();
      this.setRange(this.t0 + dt, this.t1 + dt);
    }

    reset() { this.setRange(0, this.m.duration); }

    updateRange() {
      this.range.textContent = "showing " + fmtDur(this.t1 - this.t0) + " from +" +
        fmtDur(this.t0) + " (trace: " + fmtDur(this.m.duration) + ")";
    }

    // -- drawing --

    draw(ctx, w, h) {
      this.clampScroll();
      ctx.font = FONT;
      ctx.textBaseline = "middle";
      const top = RULER;
      ctx.save();
      ctx.beginPath();
      ctx.rect(0, top, w, h - top);
      ctx.clip();
      for (const b of this.blocks) {
        const y = b.y - this.scrollY + top;
        if (y + b.h < top || y > h) continue;
        if (b.proc) this.drawProcess(ctx, b, y, w);
        else this.drawThread(ctx, b, y, w, h);
      }
      ctx.restore();
      this.drawRuler(ctx, w, h);
    }

    drawProcess(ctx, b, y, w) {
      const p = b.proc;
      ctx.fillStyle = "#2b3340";
      ctx.fillRect(0, y, w, PROC_HEAD - 2);
      ctx.fillStyle = "#fff";
      ctx.font = FONT_BOLD;
      const n = p.threads.length;
      ctx.fillText((p.collapsed ? "▸ " : "▾ ") + p.name + "  ·  " + counted(n, "thread"), 8,
                   y + PROC_HEAD / 2 - 1);
      ctx.font = FONT;
    }

    drawThread(ctx, b, y, w, h) {
      const th = b.thread;
      const strings = this.m.strings;
      // gutter: the thread's name and counts
      ctx.fillStyle = th.index % 2 ? "#f6f7f9" : "#fbfbfc";
      ctx.fillRect(0, y, w, b.h - GAP / 2);
      ctx.fillStyle = TEXT;
      ctx.font = FONT_BOLD;
      const label = (th.collapsed ? "▸ " : "▾ ") + th.name;
      ctx.fillText(fitLabel(ctx, label, GUTTER - 14, this.labelCache), 8, y + 9);
      ctx.font = FONT;
      ctx.fillStyle = "#6b7280";
      let sub = "tid " + th.tid + " · " + (th.slices || !th.markerCount
        ? counted(th.slices, "call") : counted(th.markerCount, "event"));
      if (th.lost) sub += " · " + fmtCount(th.lost) + " lost";
      if (b.h - GAP >= 30) ctx.fillText(fitLabel(ctx, sub, GUTTER - 14, this.labelCache), 8, y + 24);
      ctx.strokeStyle = "#d5d9df";
      ctx.beginPath();
      ctx.moveTo(GUTTER - 0.5, y); ctx.lineTo(GUTTER - 0.5, y + b.h - GAP / 2);
      ctx.stroke();

      ctx.save();
      ctx.beginPath();
      ctx.rect(GUTTER, y, w - GUTTER, b.h);
      ctx.clip();
      const rows = this.threadRows(th);
      for (let d = 0; d < rows; d++) {
        const ry = b.rowsY - this.scrollY + RULER + d * ROW;
        if (ry + ROW < RULER || ry > h) continue;
        this.drawRow(ctx, th, d, th.rows[d], ry, strings);
      }
      if (b.lane) this.drawMarkers(ctx, th, y, b.h - GAP, strings);
      ctx.restore();
    }

    drawRow(ctx, th, depth, row, y, strings) {
      const t0 = this.t0, t1 = this.t1;
      const k = this.plotWidth() / (t1 - t0);
      const search = this.search;
      const sel = this.selected;
      // slices are sorted by start and never overlap, so their ends are sorted too
      let i = upperBound(row.end, t0, 0, row.n);
      const h = ROW - 2;
      while (i < row.n && row.start[i] < t1) {
        const x0 = GUTTER + (row.start[i] - t0) * k;
        const x1 = GUTTER + (row.end[i] - t0) * k;
        const name = row.name[i];
        const hit = search.hit(name);
        if (x1 - x0 < 1) {
          // below a pixel: one sliver stands for every call starting in this pixel
          const px = Math.floor(x0);
          ctx.fillStyle = hit ? (search.active() ? "#d9480f" : nameColour(strings, name)) : DIM;
          ctx.fillRect(px, y, 1, h);
          i = lowerBound(row.start, t0 + (px + 1 - GUTTER) / k, i + 1, row.n);
          continue;
        }
        const left = Math.max(x0, GUTTER - 1);
        const width = Math.min(x1, GUTTER + this.plotWidth() + 1) - left;
        ctx.fillStyle = hit ? nameColour(strings, name) : DIM;
        ctx.fillRect(left, y, Math.max(width - (width > 3 ? 0.5 : 0), 1), h);
        if (search.active() && hit) {
          ctx.strokeStyle = "#d9480f";
          ctx.lineWidth = 1.5;
          ctx.strokeRect(left + 0.75, y + 0.75, width - 1.5, h - 1.5);
          ctx.lineWidth = 1;
        }
        if (sel && sel.thread === th && sel.depth === depth && sel.i === i) {
          ctx.strokeStyle = "#111";
          ctx.lineWidth = 2;
          ctx.strokeRect(left + 1, y + 1, width - 2, h - 2);
          ctx.lineWidth = 1;
        }
        if (width > 24) {
          const text = fitLabel(ctx, strings[name], width - 6, this.labelCache);
          if (text) {
            ctx.fillStyle = hit ? TEXT : DIM_TEXT;
            ctx.fillText(text, left + 3, y + h / 2 + 0.5);
          }
        }
        i++;
      }
    }

    drawMarkers(ctx, th, y, blockH, strings) {
      const m = th.markers;
      const t0 = this.t0, t1 = this.t1;
      const k = this.plotWidth() / (t1 - t0);
      const search = this.search;
      let i = lowerBound(m.ts, t0, 0, m.n);
      while (i < m.n && m.ts[i] <= t1) {
        const x = GUTTER + (m.ts[i] - t0) * k;
        const kind = m.kind[i];
        const hit = search.hit(m.name[i]);
        ctx.fillStyle = hit ? markerColour(strings, m.name[i], kind) : DIM;
        if (kind === MARK_LOST) {
          ctx.fillRect(x - 1, y, 2, blockH);
          ctx.fillText("lost", x + 3, y + LANE / 2);
        } else {
          ctx.beginPath(); // a small downward triangle
          ctx.moveTo(x - 4, y + 2); ctx.lineTo(x + 4, y + 2); ctx.lineTo(x, y + LANE - 2);
          ctx.closePath();
          ctx.fill();
        }
        const sel = this.selected;
        if (sel && sel.thread === th && sel.marker === i) {
          ctx.strokeStyle = "#111";
          ctx.strokeRect(x - 5.5, y + 0.5, 11, LANE - 1);
        }
        // markers closer than 2 px apart are drawn once
        const next = lowerBound(m.ts, t0 + (x + 2 - GUTTER) / k, i + 1, m.n);
        i = next;
      }
    }

    drawRuler(ctx, w) {
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, w, RULER);
      ctx.strokeStyle = "#c9ced6";
      ctx.beginPath();
      ctx.moveTo(0, RULER - 0.5); ctx.lineTo(w, RULER - 0.5);
      ctx.stroke();
      const span = this.t1 - this.t0;
      const target = span * 90 / this.plotWidth();
      const pow = Math.pow(10, Math.floor(Math.log10(target)));
      const step = [1, 2, 5, 10].map((f) => f * pow).find((s) => s >= target) || 10 * pow;
      ctx.fillStyle = "#4b5563";
      ctx.font = FONT;
      for (let t = Math.ceil(this.t0 / step) * step; t <= this.t1; t += step) {
        const x = Math.round(this.xOf(t)) + 0.5;
        ctx.strokeStyle = "#c9ced6";
        ctx.beginPath();
        ctx.moveTo(x, RULER - 7); ctx.lineTo(x, RULER);
        ctx.stroke();
        ctx.fillText(fmtTick(t, step, this.t1), x + 3, RULER / 2 - 1);
      }
      ctx.fillStyle = "#f3f4f6";
      ctx.fillRect(0, 0, GUTTER, RULER - 1);
      ctx.fillStyle = "#4b5563";
      ctx.fillText("time from the first event", 8, RULER / 2 - 1);
    }

    // -- hit testing --

    blockAt(y) {
      const cy = y - RULER + this.scrollY;
      const blocks = this.blocks;
      let lo = 0, hi = blocks.length;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if (blocks[mid].y <= cy) lo = mid + 1; else hi = mid;
      }
      const b = blocks[lo - 1];
      return b && cy < b.y + b.h ? { b, cy } : null;
    }

    // what is under (x, y): a slice {thread, depth, i}, a marker {thread, marker}, a label
    // {thread}/{proc}, or null
    pick(x, y) {
      if (y < RULER) return null;
      const hitb = this.blockAt(y);
      if (!hitb) return null;
      const { b, cy } = hitb;
      if (b.proc) return { proc: b.proc };
      const th = b.thread;
      if (x < GUTTER) return { thread: th, label: true };
      const t = this.tOf(x);
      if (b.lane && cy < b.y + b.lane) {
        const m = th.markers;
        const slack = 4 * (this.t1 - this.t0) / this.plotWidth();
        let i = lowerBound(m.ts, t - slack, 0, m.n);
        let best = -1;
        for (; i < m.n && m.ts[i] <= t + slack; i++) {
          if (best < 0 || Math.abs(m.ts[i] - t) < Math.abs(m.ts[best] - t)) best = i;
        }
        return best >= 0 ? { thread: th, marker: best } : null;
      }
      const depth = Math.floor((cy - b.rowsY) / ROW);
      if (depth < 0 || depth >= this.threadRows(th)) return null;
      const row = th.rows[depth];
      const i = upperBound(row.end, t, 0, row.n);
      if (i < row.n && row.start[i] <= t) return { thread: th, depth, i };
      // a sliver: the call nearest within a pixel
      const px = (this.t1 - this.t0) / this.plotWidth();
      if (i < row.n && row.start[i] - t <= px) return { thread: th, depth, i };
      if (i > 0 && t - row.end[i - 1] <= px) return { thread: th, depth, i: i - 1 };
      return null;
    }

    describe(hit) {
      const s = this.m.strings;
      const th = hit.thread;
      if (hit.marker !== undefined) {
        const m = th.markers;
        const i = hit.marker;
        return {
          title: s[m.name[i]],
          lines: [
            MARKER_KINDS[m.kind[i]] + " at +" + fmtDur(m.ts[i]),
            th.name + " (tid " + th.tid + ")",
          ],
          info: m.info[i] ? s[m.info[i] - 1] : "",
        };
      }
      const row = th.rows[hit.depth];
      const i = hit.i;
      const dur = row.end[i] - row.start[i];
      let children = 0;
      const below = th.rows[hit.depth + 1];
      if (below) {
        let j = upperBound(below.end, row.start[i], 0, below.n);
        for (; j < below.n && below.start[j] < row.end[i]; j++) children += below.end[j] - below.start[j];
      }
      return {
        title: s[row.name[i]],
        lines: [
          "duration " + fmtDur(dur) + " · self " + fmtDur(Math.max(0, dur - children)) +
            (this.m.raw.aggregated.notes ? " (less the callees on the timeline)" : ""),
          "from +" + fmtDur(row.start[i]) + " to +" + fmtDur(row.end[i]),
          th.name + " (tid " + th.tid + ") · depth " + hit.depth,
        ],
        info: row.info[i] ? s[row.info[i] - 1] : "",
      };
    }

    showDetails(hit) {
      const d = this.details;
      d.textContent = "";
      if (!hit) { d.append("Click a call or a marker for its details."); return; }
      const info = this.describe(hit);
      d.append(el("div", { class: "details-title", text: info.title }));
      d.append(el("div", { class: "details-lines", text: info.lines.join("   ·   ") }));
      if (info.info) d.append(el("pre", { class: "details-info", text: info.info }));
    }

    // -- events --

    bind() {
      const c = this.surface.canvas;
      let drag = null;
      c.addEventListener("wheel", (e) => {
        e.preventDefault();
        const r = c.getBoundingClientRect();
        const x = e.clientX - r.left, y = e.clientY - r.top;
        const dy = e.deltaMode === 1 ? e.deltaY * 16 : e.deltaY;
        const dx = e.deltaMode === 1 ? e.deltaX * 16 : e.deltaX;
        if (e.ctrlKey || e.metaKey || y < RULER) {
          this.zoomBy(Math.exp(dy * 0.002), Math.max(x, GUTTER));
        } else if (e.shiftKey || Math.abs(dx) > Math.abs(dy)) {
          this.panBy(e.shiftKey ? dy : dx);
        } else {
          this.scrollY += dy;
          this.surface.invalidate();
        }
      }, { passive: false });
      c.addEventListener("mousedown", (e) => {
        drag = { x: e.clientX, y: e.clientY, moved: false };
        this.area.focus();
      });
      window.addEventListener("mousemove", (e) => {
        if (drag) {
          const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
          if (Math.abs(dx) + Math.abs(dy) > 2) drag.moved = true;
          if (drag.moved) {
            this.panBy(-dx);
            this.scrollY -= dy;
            drag.x = e.clientX; drag.y = e.clientY;
            this.surface.invalidate();
          }
          return;
        }
        if (e.target !== c) { this.hideTip(); return; }
        const r = c.getBoundingClientRect();
        this.hoverAt(e.clientX - r.left, e.clientY - r.top, e.clientX, e.clientY);
      });
      window.addEventListener("mouseup", (e) => {
        const was = drag;
        drag = null;
        if (!was || was.moved || e.target !== c) return;
        const r = c.getBoundingClientRect();
        this.click(e.clientX - r.left, e.clientY - r.top);
      });
      c.addEventListener("mouseleave", () => this.hideTip());
      c.addEventListener("dblclick", (e) => {
        const r = c.getBoundingClientRect();
        const hit = this.pick(e.clientX - r.left, e.clientY - r.top);
        if (hit && hit.i !== undefined) this.zoomToSlice(hit);
      });
    }

    hoverAt(x, y, cx, cy) {
      const hit = this.pick(x, y);
      if (!hit || hit.label || hit.proc) {
        this.hideTip();
        setCursor(this.surface.canvas, hit && (hit.label || hit.proc) ? "pointer" : "default");
        return;
      }
      setCursor(this.surface.canvas, "pointer");
      const info = this.describe(hit);
      this.tip.textContent = "";
      this.tip.append(el("b", { text: info.title }), el("br"), info.lines[0]);
      if (info.info) this.tip.append(el("div", { class: "tip-info", text: info.info.slice(0, 300) }));
      this.tip.hidden = false;
      const tw = this.tip.offsetWidth, thh = this.tip.offsetHeight;
      this.tip.style.left = Math.min(cx + 14, window.innerWidth - tw - 8) + "px";
      this.tip.style.top = (cy + 16 + thh > window.innerHeight ? cy - thh - 8 : cy + 16) + "px";
    }

    hideTip() { this.tip.hidden = true; }

    click(x, y) {
      const hit = this.pick(x, y);
      if (hit && hit.proc) {
        hit.proc.collapsed = !hit.proc.collapsed;
        this.layout();
        this.surface.invalidate();
        return;
      }
      if (hit && hit.label) {
        hit.thread.collapsed = !hit.thread.collapsed;
        this.layout();
        this.surface.invalidate();
        return;
      }
      this.select(hit);
    }

    select(hit) {
      this.selected = hit;
      this.showDetails(hit);
      this.surface.invalidate();
    }

    zoomToSlice(hit) {
      const row = hit.thread.rows[hit.depth];
      const s = row.start[hit.i], e = row.end[hit.i];
      const pad = Math.max((e - s) * 0.1, 10);
      this.setRange(s - pad, e + pad);
    }

    // bring a slice into view: zoom so it is visible and scroll to its row
    reveal(hit) {
      const row = hit.thread.rows[hit.depth];
      const s = row.start[hit.i], e = row.end[hit.i];
      const span = this.t1 - this.t0;
      if (s < this.t0 || e > this.t1 || (e - s) * this.plotWidth() / span < 3) this.zoomToSlice(hit);
      const th = hit.thread;
      if (th.collapsed && hit.depth > 0) { th.collapsed = false; this.layout(); }
      if (th.process.collapsed) { th.process.collapsed = false; this.layout(); }
      const b = this.blocks.find((bb) => bb.thread === th);
      const y = b.rowsY + hit.depth * ROW;
      const viewH = this.surface.height - RULER;
      if (y < this.scrollY || y + ROW > this.scrollY + viewH) this.scrollY = y - viewH / 3;
      this.select(hit);
    }

    // -- search --

    searchChanged() {
      this.matchList = null;
      this.matchIndex = -1;
      this.surface.invalidate();
    }

    matches() {
      if (this.matchList) return this.matchList;
      const list = [];
      if (this.search.active()) {
        for (const th of this.m.threads) {
          th.rows.forEach((row, depth) => {
            for (let i = 0; i < row.n; i++) {
              if (this.search.hit(row.name[i])) list.push({ thread: th, depth, i });
            }
          });
        }
        list.sort((a, b) => a.thread.rows[a.depth].start[a.i] - b.thread.rows[b.depth].start[b.i]);
      }
      this.matchList = list;
      return list;
    }

    markerMatches() {
      let n = 0;
      if (!this.search.active()) return 0;
      for (const th of this.m.threads) {
        const m = th.markers;
        for (let i = 0; i < m.n; i++) if (this.search.hit(m.name[i])) n++;
      }
      return n;
    }

    step(dir) {
      const list = this.matches();
      if (!list.length) return null;
      this.matchIndex = (this.matchIndex + dir + list.length) % list.length;
      this.reveal(list[this.matchIndex]);
      return list[this.matchIndex];
    }
  }

  function setCursor(canvas, cursor) { if (canvas.style.cursor !== cursor) canvas.style.cursor = cursor; }

  // ---------------------------------------------------------------------------------------
  // The call tree as a flame graph (root at the bottom) or an icicle (root at the top).
  // Widths are the nodes' totals; clicking a frame zooms into it.

  const FRAME = 18;

  class TreeView {
    constructor(model, search, root, icicle) {
      this.m = model;
      this.p = model.profile;
      this.search = search;
      this.icicle = icicle;
      this.focus = 0;
      this.hover = -1;
      this.rects = []; // per depth: [node, x, w] triples drawn last time
      this.labelCache = {};
      const unit = this.p.unit === "calls" ? "call counts" : "time in calls (inclusive)";
      this.crumbs = el("span", { class: "crumbs" });
      this.toolbar = el("div", { class: "toolbar" },
        el("button", { type: "button", text: "Reset zoom", onclick: () => this.zoom(0) }),
        this.crumbs,
        el("span", { class: "hint", text: (icicle ? "Icicle" : "Flame graph") + ": widths are " +
          unit + ", every call of the trace counted; callers " + (icicle ? "above" : "below") +
          " their callees; click a frame to zoom into it" }));
      this.scroller = el("div", { class: "canvas-area scroll" });
      this.details = el("div", { class: "details", text: "Hover over a frame for its totals." });
      root.append(this.toolbar, this.scroller, this.details);
      this.surface = new Surface(this.scroller, (ctx, w, h) => this.draw(ctx, w, h),
                                 () => Math.max(this.height(), this.scroller.clientHeight));
      this.scrolledOnce = false;
      this.bind();
      this.updateCrumbs();
    }

    height() { return Math.max((this.p.maxDepth + 1) * FRAME + 8, 60); }

    shown() {
      // size the canvas to the tree; the flame graph starts scrolled to its root
      this.surface.resize();
      if (!this.icicle && !this.scrolledOnce) {
        this.scroller.scrollTop = this.scroller.scrollHeight;
        this.scrolledOnce = true;
      }
      this.surface.invalidate();
    }

    yOf(depth, h) { return this.icicle ? depth * FRAME + 4 : h - (depth + 1) * FRAME - 4; }

    draw(ctx, w, h) {
      const p = this.p, strings = this.m.strings;
      ctx.font = FONT;
      ctx.textBaseline = "middle";
      this.rects = Array.from({ length: p.maxDepth + 1 }, () => []);
      if (p.n <= 1 || p.total[0] <= 0) {
        ctx.fillStyle = "#6b7280";
        ctx.fillText(this.m.threads.some((t) => t.markerCount) && !this.m.threads.some((t) => t.slices)
          ? "No calls in this trace (events only): record with -p function_graph for a flame graph."
          : "No calls in this trace.", 12, 24);
        return;
      }
      const focus = this.focus;
      // the focused node's ancestors span the whole width
      for (let a = focus; a >= 0; a = p.parent[a]) this.frame(ctx, a, 0, w, h, strings, a !== focus);
      if (p.total[focus] <= 0) return;
      const stack = [[focus, 0, w]];
      const k = w / p.total[focus];
      while (stack.length) {
        const [node, x, width] = stack.pop();
        if (node !== focus) this.frame(ctx, node, x, width, h, strings, false);
        let cx = x;
        for (const child of p.children[node]) {
          const cw = p.total[child] * k;
          if (cw >= 0.5) stack.push([child, cx, cw]);
          cx += cw;
        }
      }
    }

    frame(ctx, node, x, width, h, strings, ancestor) {
      const p = this.p;
      const depth = p.depth[node];
      const y = this.yOf(depth, h);
      const name = p.name[node];
      const structural = depth <= 2; // all, a process, a thread
      const hit = this.search.hit(name);
      let fill;
      if (!hit) fill = DIM;
      else if (structural) fill = depth === 0 ? "#c8ccd3" : depth === 1 ? "#d3d7dd" : "#dde0e5";
      else fill = nameColour(strings, name);
      ctx.globalAlpha = ancestor ? 0.6 : 1;
      ctx.fillStyle = fill;
      ctx.fillRect(x, y, Math.max(width - (width > 3 ? 1 : 0), 0.5), FRAME - 1);
      if (this.search.active() && hit && !structural) {
        ctx.strokeStyle = "#d9480f";
        ctx.lineWidth = 1.5;
        ctx.strokeRect(x + 0.75, y + 0.75, width - 2.5, FRAME - 2.5);
        ctx.lineWidth = 1;
      }
      if (node === this.hover) {
        ctx.strokeStyle = "#111";
        ctx.strokeRect(x + 0.5, y + 0.5, width - 2, FRAME - 2);
      }
      if (width > 24) {
        const text = fitLabel(ctx, strings[name], width - 6, this.labelCache);
        if (text) {
          ctx.fillStyle = hit ? TEXT : DIM_TEXT;
          ctx.fillText(text, x + 3, y + FRAME / 2);
        }
      }
      ctx.globalAlpha = 1;
      this.rects[depth].push([node, x, width]);
    }

    nodeAt(x, y) {
      const h = this.surface.height;
      for (let d = 0; d < this.rects.length; d++) {
        const fy = this.yOf(d, h);
        if (y < fy || y >= fy + FRAME) continue;
        for (const [node, fx, fw] of this.rects[d]) if (x >= fx && x < fx + fw) return node;
      }
      return -1;
    }

    describe(node) {
      const p = this.p, s = this.m.strings;
      const root = p.total[0];
      const parts = [fmtValue(p.total[node], p.unit) + " total (" + fmtPct(p.total[node], root) + ")"];
      if (p.depth[node] > 2 || p.children[node].length === 0) {
        parts.push(fmtValue(p.self[node], p.unit) + " self (" + fmtPct(p.self[node], root) + ")");
      }
      if (p.count[node]) parts.push(counted(p.count[node], p.unit === "calls" ? "hit" : "call"));
      return { title: s[p.name[node]], line: parts.join(" · ") };
    }

    bind() {
      const c = this.surface.canvas;
      c.addEventListener("mousemove", (e) => {
        const r = c.getBoundingClientRect();
        const node = this.nodeAt(e.clientX - r.left, e.clientY - r.top);
        if (node !== this.hover) {
          this.hover = node;
          this.showDetails(node >= 0 ? node : this.focus);
          setCursor(c, node >= 0 ? "pointer" : "default");
          this.surface.invalidate();
        }
      });
      c.addEventListener("mouseleave", () => {
        this.hover = -1;
        this.showDetails(this.focus);
        this.surface.invalidate();
      });
      c.addEventListener("click", (e) => {
        const r = c.getBoundingClientRect();
        const node = this.nodeAt(e.clientX - r.left, e.clientY - r.top);
        if (node >= 0) this.zoom(node);
      });
    }

    showDetails(node) {
      const d = this.details;
      d.textContent = "";
      const info = this.describe(node);
      d.append(el("div", { class: "details-title", text: info.title }),
               el("div", { class: "details-lines", text: info.line }));
      if (this.search.active()) {
        d.append(el("div", { class: "details-lines", text: "matched: " + this.matchedText() }));
      }
    }

    zoom(node) {
      this.focus = node;
      this.updateCrumbs();
      this.showDetails(node);
      this.surface.invalidate();
    }

    updateCrumbs() {
      const p = this.p, s = this.m.strings;
      this.crumbs.textContent = "";
      const path = [];
      for (let a = this.focus; a > 0; a = p.parent[a]) path.unshift(a);
      for (const node of path) {
        this.crumbs.append(" › ", el("a", { href: "#", text: s[p.name[node]],
          onclick: (e) => { e.preventDefault(); this.zoom(node); } }));
      }
    }

    // the share of the focused subtree spent in matching frames (not counting a match inside
    // another match twice)
    matched() {
      const p = this.p;
      if (!this.search.active()) return 0;
      let sum = 0;
      const stack = [this.focus];
      while (stack.length) {
        const node = stack.pop();
        if (p.depth[node] > 2 && this.search.hit(p.name[node])) { sum += p.total[node]; continue; }
        for (const c of p.children[node]) stack.push(c);
      }
      return sum;
    }

    matchedText() {
      const m = this.matched();
      return fmtValue(m, this.p.unit) + " (" + fmtPct(m, this.p.total[this.focus]) + ")";
    }

    searchChanged() {
      this.showDetails(this.hover >= 0 ? this.hover : this.focus);
      this.surface.invalidate();
    }
  }

  // ---------------------------------------------------------------------------------------
  // Histograms: the hist triggers' tables (META "histograms"), as bars and as ftrace text

  function histogramsPanel(model, root) {
    const hists = model.raw.histograms;
    if (!hists.length) {
      root.append(el("p", { class: "empty", text: "No histograms in this trace. A hist " +
        "trigger on a probe event makes one, e.g. rethook record -p nop -e " +
        "'r:myapp.send url ret=$retval:s64' -R 'hist:keys=ret' -- app.py" }));
      return;
    }
    for (const h of hists) {
      const section = el("section", { class: "hist" }, el("h2", { text: h.event }));
      for (const sec of h.sections) {
        section.append(el("div", { class: "trigger" }, el("code", { text: sec.trigger })));
        const max = sec.rows.reduce((m, r) => Math.max(m, r[1]), 0) || 1;
        const table = el("table", { class: "hist-table" });
        const head = el("tr", null, el("th", { text: "key" }),
                        el("th", { class: "num", text: "hitcount" }), el("th", { text: "" }));
        for (const v of sec.vals) head.append(el("th", { class: "num", text: v }));
        table.append(head);
        const limit = 500;
        sec.rows.slice(0, limit).forEach((r) => {
          const bar = el("div", { class: "bar" });
          bar.style.width = (100 * r[1] / max).toFixed(2) + "%";
          const tr = el("tr", null, el("td", { class: "key", text: r[0] }),
                        el("td", { class: "num", text: fmtCount(r[1]) }),
                        el("td", { class: "barcell" }, bar));
          for (const v of r.slice(2)) tr.append(el("td", { class: "num", text: String(v) }));
          table.append(tr);
        });
        section.append(table);
        if (sec.rows.length > limit) {
          section.append(el("p", { class: "empty", text: (sec.rows.length - limit) +
            " more entries: see the text below" }));
        }
        const t = sec.totals;
        section.append(el("p", { class: "totals", text: "Hits: " + fmtCount(t.hits || 0) +
          " · Entries: " + fmtCount(t.entries || 0) + " · Dropped: " + fmtCount(t.dropped || 0) }));
      }
      section.append(el("details", null, el("summary", { text: "as ftrace prints it (rethook hist)" }),
                        el("pre", { text: h.text })));
      root.append(section);
    }
  }

  // ---------------------------------------------------------------------------------------
  // Info: the trace's metadata, its processes and threads, and what aggregation left out

  function infoPanel(model, root) {
    const meta = model.raw.meta;
    const rows = [];
    const add = (k, v) => { if (v !== undefined && v !== null && v !== "") rows.push([k, v]); };
    const list = (v) => Array.isArray(v) ? v.join(" ") : v;
    add("program", list(meta.argv));
    add("recorded with", list(meta.rethook_command));
    add("tracer", meta.tracer);
    if (meta.options && typeof meta.options === "object") {
      add("options on", Object.keys(meta.options).filter((k) => meta.options[k] === true).join(", "));
    }
    add("functions (-l)", list(meta.filter));
    if (meta.start_time) add("started", new Date(meta.start_time * 1000).toISOString());
    add("duration", fmtDur(model.raw.duration));
    add("clock", [meta.clock, meta.clock_source].filter(Boolean).join(", "));
    add("python", [meta.python_implementation, meta.python].filter(Boolean).join(" "));
    add("engine", meta.engine);
    add("rethook", meta.rethook_version);
    const table = el("table", { class: "meta" });
    for (const [k, v] of rows) table.append(el("tr", null, el("th", { text: k }), el("td", { text: String(v) })));
    root.append(el("h2", { text: "Trace" }), table);

    const threads = el("table", { class: "threads", id: "thread-table" });
    threads.append(el("tr", null, ...["process", "thread"].map((t) => el("th", { text: t })),
      ...["tid", "calls", "on the timeline", "markers", "lost"].map((t) => el("th", { class: "num", text: t }))));
    for (const th of model.threads) {
      threads.append(el("tr", { "data-pid": th.pid, "data-tid": th.tid, "data-slices": th.slices,
        "data-shown": th.shown, "data-markers": th.markerCount },
        el("td", { text: th.process.name }), el("td", { text: th.name }),
        el("td", { class: "num", text: String(th.tid) }), el("td", { class: "num", text: fmtCount(th.slices) }),
        el("td", { class: "num", text: fmtCount(th.shown) }),
        el("td", { class: "num", text: fmtCount(th.markerCount) }),
        el("td", { class: "num", text: fmtCount(th.lost) })));
    }
    root.append(el("h2", { text: "Processes and threads" }), threads);
    const notes = (model.raw.aggregated.notes || []);
    if (notes.length) {
      root.append(el("h2", { text: "Aggregated" }), el("ul", null, ...notes.map((n) => el("li", { text: n }))));
    }
    root.append(el("details", null, el("summary", { text: "all metadata (JSON)" }),
                   el("pre", { text: JSON.stringify(meta, null, 2) })));
  }

  // ---------------------------------------------------------------------------------------
  // The page

  function main() {
    let model;
    try {
      model = decode(JSON.parse(document.getElementById("rethook-data").textContent));
    } catch (err) {
      document.getElementById("main").append(el("p", { class: "error",
        text: "This trace view cannot be shown: " + err.message }));
      throw err;
    }
    const raw = model.raw;
    document.getElementById("title").textContent = raw.title;
    const calls = model.threads.reduce((s, t) => s + t.slices, 0);
    const markers = model.threads.reduce((s, t) => s + t.markerCount, 0);
    const sub = [raw.meta.tracer || "trace", fmtDur(raw.duration),
                 counted(model.threads.length, "thread")];
    if (model.processes.length > 1) sub.push(model.processes.length + " processes");
    if (calls) sub.push(counted(calls, "call"));
    if (markers) sub.push(counted(markers, "event"));
    const lost = model.threads.reduce((s, t) => s + t.lost, 0);
    if (lost) sub.push(fmtCount(lost) + " lost");
    document.getElementById("subtitle").textContent = sub.join(" · ");

    const notice = document.getElementById("notice");
    if (raw.damage) {
      notice.hidden = false;
      notice.classList.add("damage");
      notice.append(el("div", null, el("b", { text: "A damaged trace file: " }),
        "this page shows what comes before the damage (" + raw.damage + ")."));
    }
    const notes = raw.aggregated.notes || [];
    if (notes.length) {
      notice.hidden = false;
      notice.append(el("div", null, el("b", { text: "A big trace, aggregated: " }),
        notes.join("; ") + ". Perfetto shows every event: ",
        el("code", { text: "rethook export --format perfetto" }),
        ", then open the file in ui.perfetto.dev."));
    }

    const search = new Search(model.strings);
    const mainEl = document.getElementById("main");
    const tabsEl = document.getElementById("tabs");
    const panels = {};
    const views = {};
    const tabs = [["timeline", "Timeline"], ["flame", "Flame graph"], ["icicle", "Icicle"],
                  ["histograms", "Histograms" + (raw.histograms.length ? " (" + raw.histograms.length + ")" : "")],
                  ["info", "Info"]];
    let current = null;
    function show(name) {
      if (!panels[name]) return;
      current = name;
      for (const [key] of tabs) {
        panels[key].hidden = key !== name;
        tabsEl.querySelector("[data-tab=" + key + "]").setAttribute("aria-selected", String(key === name));
      }
      const v = views[name];
      if (v instanceof TreeView) v.shown();
      else if (v) v.surface.resize();
      updateCount();
    }
    for (const [key, label] of tabs) {
      tabsEl.append(el("button", { type: "button", role: "tab", "data-tab": key, text: label,
        onclick: () => show(key) }));
      panels[key] = el("div", { class: "panel panel-" + key, id: "panel-" + key, hidden: "" });
      mainEl.append(panels[key]);
    }
    views.timeline = new Timeline(model, search, panels.timeline);
    views.flame = new TreeView(model, search, panels.flame, false);
    views.icicle = new TreeView(model, search, panels.icicle, true);
    histogramsPanel(model, panels.histograms);
    infoPanel(model, panels.info);

    const input = document.getElementById("search-input");
    const count = document.getElementById("search-count");
    function updateCount() {
      if (!search.active()) { count.textContent = ""; return; }
      if (current === "flame" || current === "icicle") {
        count.textContent = views[current].matchedText();
      } else {
        const n = views.timeline.matches().length, m = views.timeline.markerMatches();
        count.textContent = counted(n, "call") + (m ? ", " + counted(m, "marker") : "");
      }
    }
    function runSearch() {
      if (!search.set(input.value)) return;
      views.timeline.searchChanged();
      views.flame.searchChanged();
      views.icicle.searchChanged();
      updateCount();
    }
    input.addEventListener("input", runSearch);
    function step(dir) {
      runSearch();
      if (current !== "timeline") show("timeline");
      views.timeline.step(dir);
    }
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") { e.preventDefault(); step(e.shiftKey ? -1 : 1); }
      if (e.key === "Escape") { input.value = ""; runSearch(); input.blur(); }
    });
    document.getElementById("search-next").addEventListener("click", () => step(1));
    document.getElementById("search-prev").addEventListener("click", () => step(-1));

    document.addEventListener("keydown", (e) => {
      if (e.target === input || e.ctrlKey || e.metaKey || e.altKey) return;
      const tl = views.timeline;
      if (e.key === "/") { e.preventDefault(); input.focus(); input.select(); return; }
      if (current !== "timeline") return;
      const k = e.key.toLowerCase();
      if (k === "w" || k === "+" || k === "=") tl.zoomBy(0.7);
      else if (k === "s" || k === "-") tl.zoomBy(1 / 0.7);
      else if (k === "a" || e.key === "ArrowLeft") tl.panBy(-tl.plotWidth() / 6);
      else if (k === "d" || e.key === "ArrowRight") tl.panBy(tl.plotWidth() / 6);
      else if (k === "0") tl.reset();
      else if (e.key === "Escape") tl.select(null);
      else return;
      e.preventDefault();
    });

    show(calls || markers ? "timeline" : "info");

    // The test hook (tests/test_view.py) and a console API: counts, the visible range, zoom,
    // search, tabs. Numbers are the viewer's own, read from the decoded data.
    window.rethookView = {
      threads: () => model.threads.map((t) => ({ pid: t.pid, tid: t.tid, name: t.name,
        slices: t.slices, shown: t.shown, markers: t.markerCount, lost: t.lost })),
      view: () => ({ start: views.timeline.t0, end: views.timeline.t1, duration: model.duration }),
      zoom: (start, end) => views.timeline.setRange(start, end),
      search: (q) => { input.value = q; runSearch(); return views.timeline.matches().length; },
      matches: () => views.timeline.matches().length,
      selected: () => {
        const s = views.timeline.selected;
        if (!s) return null;
        const name = views.timeline.describe(s).title;
        if (s.marker !== undefined) {
          const t = s.thread.markers.ts[s.marker];
          return { name, tid: s.thread.tid, start: t, end: t };
        }
        const row = s.thread.rows[s.depth];
        return { name, tid: s.thread.tid, start: row.start[s.i], end: row.end[s.i] };
      },
      tab: (name) => { if (name) show(name); return current; },
      profile: () => ({ nodes: model.profile.n, total: model.profile.total[0], unit: model.profile.unit,
        focus: views.flame.focus, matched: views.flame.matched() }),
    };
    document.documentElement.dataset.ready = "1";
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", main);
  else main();
})();
