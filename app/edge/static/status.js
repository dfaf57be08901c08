/* llmgate status page: polls status.json every 2 s, keeps 15 minutes of snapshots in this
   tab and draws them as small SVG line charts. No dependencies, no network but this gateway.

   The first poll asks for the snapshots the gateway kept of the last 15 minutes
   (status.json?since=0, app/edge/status_history.py), so the charts have data the moment the page opens;
   every later poll asks for those newer than the newest held (a tab the browser throttled
   gets its gaps filled). Snapshots are cumulative since the gateway started, so every figure
   comes from two of them: rates are counter deltas over the server's clock; latency
   quantiles and the cache hit ratio use the deltas over a sliding window (WINDOW_S). Each
   chart element exposes data-points (points plotted), data-last (its first series' latest
   value), data-max (its first series' largest) and data-last-<series> for every series, for
   tests and scripts. Each snapshot polled is also sent to the page as the event
   "llmgate:status" (status-keys.js draws the gateway keys table from it). */
"use strict";

(() => {
  const POLL_MS = 2000;
  const KEEP_S = 900;
  const WINDOW_S = 30;
  const FETCH_TIMEOUT_MS = 5000;
  const DOTS_UP_TO = 12; // points are drawn as dots too while a series is this short
  const SVG = "http://www.w3.org/2000/svg";
  const HITS = ["hit_l1", "hit_l2", "coalesced"];
  const MISSES = ["miss", "refresh"]; // bypass is not a lookup: the request was not cacheable

  const samples = []; // snapshots, oldest first
  const kept = new WeakSet(); // those of them that came from the gateway's own history

  // ---- figures from snapshots (pure: samples in, numbers or null out) -------------------

  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : 0);
  const bound = (le) => (le === "+Inf" || le === "Inf" ? Infinity : Number(le));
  const sum = (obj, keys) => keys.reduce((total, k) => total + num(obj && obj[k]), 0);

  // Prometheus' histogram_quantile on cumulative bucket counts: find the bucket holding the
  // rank-th observation and interpolate linearly inside it (the first bucket starts at 0);
  // a rank in the +Inf bucket answers the highest finite bound. null when nothing observed.
  function histogramQuantile(q, bounds, counts) {
    const n = counts.length;
    if (n < 2 || !(counts[n - 1] > 0)) return null;
    const rank = q * counts[n - 1];
    let b = 0;
    while (b < n - 1 && counts[b] < rank) b += 1;
    if (b === n - 1) return bounds[n - 2];
    const upper = bounds[b];
    if (b === 0 && upper <= 0) return upper;
    const lower = b === 0 ? 0 : bounds[b - 1];
    const below = b === 0 ? 0 : counts[b - 1];
    return lower + ((upper - lower) * (rank - below)) / (counts[b] - below);
  }

  // The sample a window ending at sample i starts from: the newest one at least WINDOW_S
  // older, or the oldest one while the history is shorter than the window.
  function windowStart(i) {
    let j = i - 1;
    while (j > 0 && samples[i].time - samples[j].time < WINDOW_S) j -= 1;
    return j;
  }

  const perSecond = (read) => (i) => {
    if (i === 0) return null;
    const dt = samples[i].time - samples[i - 1].time;
    return dt > 0 ? (read(samples[i]) - read(samples[i - 1])) / dt : null;
  };

  const gauge = (read) => (i) => read(samples[i]);

  // A histogram nothing was observed in yet has no buckets at all: it counts as zeros.
  const buckets = (s, name) => (s.histograms && s.histograms[name]) || { le: [], counts: [] };

  const quantile = (name, q) => (i) => {
    if (i === 0) return null;
    const now = buckets(samples[i], name), then = buckets(samples[windowStart(i)], name);
    if (then.counts.length && then.counts.length !== now.counts.length) return null;
    const delta = now.counts.map((c, k) => num(c) - num(then.counts[k]));
    return histogramQuantile(q, now.le.map(bound), delta);
  };

  function hitRatio(i) {
    if (i === 0) return null;
    const now = samples[i].cache;
    const then = samples[windowStart(i)].cache;
    const hits = sum(now, HITS) - sum(then, HITS);
    const lookups = hits + sum(now, MISSES) - sum(then, MISSES);
    return lookups > 0 ? hits / lookups : null;
  }

  const quantiles = (name) => [
    { key: "p50", label: "P50", value: quantile(name, 0.5) },
    { key: "p95", label: "P95", value: quantile(name, 0.95) },
    { key: "p99", label: "P99", value: quantile(name, 0.99) },
  ];

  // Fields of an object that changed over the history: only those get a line.
  function changed(read) {
    const first = read(samples[0]) || {}, last = read(samples[samples.length - 1]) || {};
    return Object.keys(last).filter((k) => num(last[k]) !== num(first[k]));
  }

  function requestSeries() {
    const classes = changed((s) => s.requests && s.requests.by_class).sort();
    return [
      { key: "total", label: "all", value: perSecond((s) => num(s.requests && s.requests.total)) },
      ...classes.map((c) => ({
        key: c, label: c, value: perSecond((s) => num(s.requests && s.requests.by_class && s.requests.by_class[c])),
      })),
    ];
  }

  function errorSeries() {
    const seen = changed((s) => s.errors);
    const all = Object.keys(samples[samples.length - 1].errors || {});
    return [
      { key: "total", label: "all causes", dashed: true, value: perSecond((s) => sum(s.errors, all)) },
      ...seen.map((c) => ({ key: c, label: c.replace(/_/g, " "), value: perSecond((s) => num((s.errors || {})[c])) })),
    ];
  }

  const CHARTS = [
    { id: "chart-ttft", unit: "seconds", series: () => quantiles("ttft_seconds") },
    { id: "chart-latency", unit: "seconds", series: () => quantiles("request_duration_seconds") },
    { id: "chart-rps", unit: "rate", series: requestSeries },
    { id: "chart-errors", unit: "rate", series: errorSeries },
    { id: "chart-cache", unit: "ratio", max: 1, series: () => [{ key: "ratio", label: "hits / lookups", value: hitRatio }] },
    { id: "chart-streams", unit: "count", series: () => [{ key: "active", label: "active", value: gauge((s) => num(s.streams_active)) }] },
    {
      id: "chart-pool", unit: "count", series: () => [
        { key: "in_use", label: "in use", value: gauge((s) => num(s.pool && s.pool.in_use)) },
        { key: "idle", label: "idle", value: gauge((s) => num(s.pool && s.pool.idle)) },
      ],
    },
    {
      id: "chart-activity", unit: "rate", series: () => [
        { key: "retries", label: "retries", value: perSecond((s) => num(s.retries)) },
        { key: "heartbeats", label: "heartbeats", value: perSecond((s) => num(s.heartbeats)) },
      ],
    },
  ];

  // ---- formatting ------------------------------------------------------------------------

  const FORMAT = {
    seconds: (v) => (v >= 1 ? `${v.toFixed(v >= 10 ? 1 : 2)} s` : `${(v * 1000).toFixed(v >= 0.01 || v === 0 ? 0 : 1)} ms`),
    rate: (v) => `${v.toFixed(v >= 100 || v === 0 ? 0 : v >= 10 ? 1 : 2)}/s`,
    ratio: (v) => `${(v * 100).toFixed(v === 0 || v === 1 ? 0 : 1)} %`,
    count: (v) => String(Math.round(v)),
  };
  // Axis labels without trailing zeros: "6.00/s" → "6/s", "0.50/s" → "0.5/s".
  const tidy = (text) => text.replace(/(\.\d*?)0+(?!\d)/, "$1").replace(/\.(?!\d)/, "");
  const integer = (v) => Math.round(num(v)).toLocaleString("en-US");
  const clock = (t) => new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false });

  function duration(s) {
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
    return `${m}m ${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  }

  // A round axis top and step (1, 2, 2.5 or 5 × 10^k) for values up to max; whole steps
  // for counts.
  function axis(max, whole) {
    const raw = max / 4;
    const power = 10 ** Math.floor(Math.log10(raw));
    let step = [1, 2, 2.5, 5, 10].map((f) => f * power).find((s) => s >= raw);
    if (whole) step = step < 1 ? 1 : Math.ceil(step);
    return { step, top: Math.ceil(max / step - 1e-9) * step };
  }

  // ---- drawing ---------------------------------------------------------------------------

  function node(name, attrs, parent, text) {
    const el = name === "svg" || parent instanceof SVGElement ? document.createElementNS(SVG, name) : document.createElement(name);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    if (parent) parent.appendChild(el);
    return el;
  }

  function drawChart(spec) {
    const fig = document.getElementById(spec.id);
    const n = samples.length;
    const series = spec.series().map((s, k) => {
      const values = samples.map((_, i) => {
        const v = s.value(i);
        return typeof v === "number" && Number.isFinite(v) ? v : null;
      });
      const lastIndex = values.findLastIndex((v) => v !== null);
      return { ...s, cls: `s${k}`, values, last: lastIndex < 0 ? null : values[lastIndex] };
    });
    const plotted = samples.map((_, i) => i).filter((i) => series.some((s) => s.values[i] !== null));

    for (const name of fig.getAttributeNames()) if (name.startsWith("data-last-")) fig.removeAttribute(name);
    fig.dataset.points = String(plotted.length);
    fig.dataset.last = series[0].last === null ? "" : String(series[0].last);
    const firsts = series[0].values.filter((v) => v !== null);
    fig.dataset.max = firsts.length ? String(Math.max(...firsts)) : "";
    for (const s of series) fig.setAttribute(`data-last-${s.key}`, s.last === null ? "" : String(s.last));

    const legend = fig.querySelector(".legend");
    legend.replaceChildren();
    for (const s of series) {
      const item = node("span", { class: "item" }, legend);
      node("i", { class: `swatch ${s.cls}` }, item);
      item.append(`${s.label} `);
      node("b", {}, item, s.last === null ? "–" : FORMAT[spec.unit](s.last));
    }
    drawPlot(fig.querySelector(".plot"), spec, series, plotted, n);
  }

  function drawPlot(box, spec, series, plotted, n) {
    const w = Math.max(box.clientWidth, 100), h = Math.max(box.clientHeight, 60);
    const m = { left: 58, right: 12, top: 8, bottom: 20 };
    const svg = node("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" });
    box.replaceChildren(svg);
    if (!plotted.length) {
      const why = n < 2 && spec.unit !== "count" ? "waiting for a second sample…" : "no data in this window";
      node("text", { x: w / 2, y: h / 2, class: "empty", "text-anchor": "middle" }, svg, why);
      return;
    }
    const tEnd = samples[n - 1].time;
    const tStart = tEnd - Math.max(tEnd - samples[plotted[0]].time, 2 * (POLL_MS / 1000));
    const peak = Math.max(...series.flatMap((s) => s.values.filter((v) => v !== null)));
    const { step, top } = spec.max ? { step: spec.max / 4, top: spec.max } : axis(peak > 0 ? peak : 1, spec.unit === "count");
    const x = (t) => m.left + ((t - tStart) / (tEnd - tStart)) * (w - m.left - m.right);
    const y = (v) => h - m.bottom - (v / top) * (h - m.top - m.bottom);

    for (let k = 0; k <= Math.round(top / step); k += 1) {
      const v = k * step;
      node("line", { x1: m.left, x2: w - m.right, y1: y(v), y2: y(v), class: v === 0 ? "axis" : "grid" }, svg);
      node("text", { x: m.left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick" }, svg, tidy(FORMAT[spec.unit](v)));
    }
    [tStart, (tStart + tEnd) / 2, tEnd].forEach((t, k) => {
      const anchor = ["start", "middle", "end"][k];
      node("text", { x: x(t), y: h - 5, "text-anchor": anchor, class: "tick" }, svg, clock(t));
    });

    for (const s of [...series].reverse()) { // the first series is drawn last, on top
      let path = "", pen = false, count = 0;
      s.values.forEach((v, i) => {
        if (v === null) { pen = false; return; }
        path += `${pen ? "L" : "M"}${x(samples[i].time).toFixed(1)},${y(v).toFixed(1)}`;
        pen = true;
        count += 1;
      });
      node("path", { d: path, class: `line ${s.cls}${s.dashed ? " dashed" : ""}` }, svg);
      if (count <= DOTS_UP_TO) {
        s.values.forEach((v, i) => {
          if (v !== null) node("circle", { cx: x(samples[i].time), cy: y(v), r: 2.5, class: `dot ${s.cls}` }, svg);
        });
      }
    }
  }

  function drawTotals() {
    const s = samples[samples.length - 1];
    const req = s.requests || {}, byClass = req.by_class || {};
    const classes = Object.keys(byClass).sort();
    const rows = [
      ["Up", duration(Math.max(0, num(s.time) - num(s.started)))],
      ["Requests", integer(req.total)],
      [`  ${classes.join(" / ")}`, classes.map((c) => integer(byClass[c])).join(" / ")],
      ["Upstream errors", integer(sum(s.errors, Object.keys(s.errors || {})))],
      ["Cache hits / lookups", `${integer(sum(s.cache, HITS))} / ${integer(sum(s.cache, [...HITS, ...MISSES]))}`],
      ["Cache bypass", integer(s.cache && s.cache.bypass)],
      ["Retries", integer(s.retries)],
      ["Heartbeats", integer(s.heartbeats)],
      ["Connections opened", integer(s.pool && s.pool.opened)],
    ];
    // One row per upstream: its circuit breaker state, attempts by result, and the share of
    // the prompt tokens it was sent that its prompt cache served (docs/providers.md).
    for (const [name, up] of Object.entries(s.upstreams || {}).sort()) {
      const at = up.attempts || {};
      const pc = up.prompt_cache;
      const hits = pc && pc.hit_ratio !== null ? ` · prompt cache ${(100 * pc.hit_ratio).toFixed(0)} % read` : "";
      rows.push([`Upstream ${name}`, `${up.state} · ok ${integer(at.ok)} · 429 ${integer(at.rate_limited)} · failed ${integer(at.failed)} · cancelled ${integer(at.cancelled)}${hits}`]);
    }
    const dl = document.getElementById("totals");
    dl.replaceChildren();
    for (const [term, value] of rows) {
      node("dt", term.startsWith("  ") ? { class: "sub" } : {}, dl, term.trim());
      node("dd", {}, dl, value);
    }
  }

  function render() {
    const main = document.getElementById("charts");
    main.dataset.samples = String(samples.length);
    main.dataset.history = String(samples.filter((s) => kept.has(s)).length);
    main.dataset.from = samples.length ? String(samples[0].time) : "";
    if (!samples.length) return;
    for (const spec of CHARTS) drawChart(spec);
    drawTotals();
  }

  // ---- polling ---------------------------------------------------------------------------

  // Counters only grow while the gateway runs, so a smaller total means it restarted.
  // (Not "started": under gunicorn it can differ between the workers answering.)
  function add(snapshot, fromHistory) {
    const total = (s) => num(s.requests && s.requests.total);
    const last = samples[samples.length - 1];
    if (last && total(snapshot) < total(last)) {
      samples.length = 0;
    } else if (last && !(snapshot.time > last.time)) {
      return;
    }
    samples.push(snapshot);
    if (fromHistory) kept.add(snapshot);
    while (samples.length > 2 && snapshot.time - samples[0].time > KEEP_S) samples.shift();
  }

  // The gateway's history newer than what this tab holds, then the snapshot of now.
  function take(answer) {
    const history = Array.isArray(answer.history) ? answer.history : [];
    delete answer.history;
    for (const snapshot of history) add(snapshot, true);
    add(answer, false);
  }

  function setState(state, text) {
    const el = document.getElementById("state");
    el.dataset.state = state;
    el.textContent = text;
    document.body.classList.toggle("stale", state === "error");
  }

  async function poll() {
    const started = Date.now();
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
    try {
      const since = samples.length ? samples[samples.length - 1].time : 0;
      const url = `status.json?since=${encodeURIComponent(since)}`;
      const response = await fetch(url, { cache: "no-store", signal: abort.signal });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const answer = await response.json();
      take(answer);
      const s = samples[samples.length - 1];
      setState("live", `live · ${clock(s.time)} · up ${duration(Math.max(0, s.time - s.started))}`);
      render();
      document.dispatchEvent(new CustomEvent("llmgate:status", { detail: answer }));
    } catch (err) {
      const since = samples.length ? ` since ${clock(samples[samples.length - 1].time)}` : "";
      setState("error", `no answer from status.json${since} (${err.message || err}); retrying`);
    } finally {
      clearTimeout(timer);
      setTimeout(poll, Math.max(0, POLL_MS - (Date.now() - started)));
    }
  }

  let resizing = false;
  window.addEventListener("resize", () => {
    if (resizing) return;
    resizing = true;
    requestAnimationFrame(() => { resizing = false; render(); });
  });
  poll();
})();
