// Inline SVG charts for the dashboard: lines, stacked bars and bars. No dependencies.
"use strict";
const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2f5bd3", "#d92d20", "#12b76a", "#f79009", "#7a5af8", "#06aed4", "#ee46bc", "#667085", "#84cc16", "#a15c07"];
  const REASON_COLORS = { submitted: "#12b76a", max_turns: "#f79009", context_exhausted: "#fdb022", episode_timeout: "#b54708",
    format_error: "#ee46bc", tool_error_limit: "#9e165f", policy_error: "#7a5af8", sandbox_error: "#d92d20",
    judge_error: "#c4320a", worker_lost: "#912018", cancelled: "#98a2b3" };
  const M = { top: 10, right: 26, bottom: 26, left: 46 };

  function node(tag, attrs, parent) {
    const el = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    if (parent) parent.appendChild(el);
    return el;
  }
  function color(i, name) { return REASON_COLORS[name] || PALETTE[i % PALETTE.length]; }
  function fmt(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a < 0.01 || a >= 1e5)) return v.toExponential(1);
    return Number.isInteger(v) ? String(v) : v.toFixed(a < 1 ? 3 : 2);
  }
  function ticks(lo, hi, n, integers) {
    if (lo === hi) { lo -= 1; hi += 1; }
    const step0 = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(step0)));
    let step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= step0) || step0;
    if (integers) step = Math.max(1, Math.round(step));
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9; t += step) out.push(+t.toFixed(10));
    return out;
  }
  // opts: {x: [lo, hi], y: [lo, hi], xTicks: [[x, label]...] (default: integer ticks), width, height}
  function frame(container, opts) {
    container.textContent = "";
    const W = opts.width || 480, H = opts.height || 210;
    const svg = node("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" }, container);
    let [x0, x1] = opts.x, [y0, y1] = opts.y;
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
    const sx = v => M.left + (v - x0) / (x1 - x0) * (W - M.left - M.right);
    const sy = v => H - M.bottom - (v - y0) / (y1 - y0) * (H - M.top - M.bottom);
    for (const t of ticks(y0, y1, 4, false)) {
      node("line", { x1: M.left, x2: W - M.right, y1: sy(t), y2: sy(t), class: "grid" }, svg);
      node("text", { x: M.left - 4, y: sy(t) + 3, "text-anchor": "end" }, svg).textContent = fmt(t);
    }
    const xt = opts.xTicks || ticks(x0, x1, 6, true).filter(t => t >= opts.x[0] && t <= opts.x[1]).map(t => [t, fmt(t)]);
    const every = Math.max(1, Math.ceil(xt.length / 8));
    xt.forEach(([t, label], i) => {
      if (i % every === 0) node("text", { x: sx(t), y: H - M.bottom + 14, "text-anchor": "middle" }, svg).textContent = label;
    });
    node("line", { x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom, class: "axis" }, svg);
    node("line", { x1: M.left, x2: M.left, y1: M.top, y2: H - M.bottom, class: "axis" }, svg);
    return { svg, sx, sy, W, H };
  }
  function legend(container, names) {
    const div = document.createElement("div");
    div.className = "legend";
    names.forEach((name, i) => {
      const span = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = color(i, name);
      span.append(swatch, name);
      div.appendChild(span);
    });
    container.appendChild(div);
  }
  function empty(container, text) {
    container.textContent = "";
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = text || "No data yet.";
    container.appendChild(p);
  }
  function link(parent, href) { return href ? node("a", { href }, parent) : parent; }

  // series: [{name, points: [[x, y], ...]}]; href(series, x) → URL or null for each point.
  function line(container, { series, href, xLabels, width, height, zero }) {
    const pts = series.flatMap(s => s.points);
    if (!pts.length) return empty(container);
    const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
    const xTicks = xLabels ? xLabels.map((label, i) => [i, label]) : null;
    const { svg, sx, sy } = frame(container, { x: [Math.min(...xs), Math.max(...xs)], y: [zero ? Math.min(0, ...ys) : Math.min(...ys), Math.max(...ys)],
                                               xTicks, width, height });
    series.forEach((s, i) => {
      const c = color(i, s.name);
      if (s.points.length > 1) {
        const d = s.points.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
        node("path", { d, fill: "none", stroke: c, "stroke-width": 1.6 }, svg);
      }
      const dense = s.points.length > 80;  // many points: the line shows them, the dots only carry tooltips
      for (const p of s.points) {
        const dot = node("circle", { cx: sx(p[0]), cy: sy(p[1]), r: dense ? 2 : 2.6, fill: c, class: "point",
                                     "fill-opacity": dense ? 0 : 1 }, link(svg, href && href(s, p[0])));
        node("title", {}, dot).textContent = `${s.name} @ ${xLabels ? xLabels[p[0]] : p[0]}: ${fmt(p[1])}`;
      }
    });
    legend(container, series.map(s => s.name));
  }

  // xs: [x...]; keys: [name...]; counts[key][i] for xs[i]; stacked, each bar sums to the total at x.
  function stacked(container, { xs, keys, counts, href, normalize }) {
    if (!xs.length || !keys.length) return empty(container);
    const totals = xs.map((_, i) => keys.reduce((a, k) => a + (counts[k][i] || 0), 0));
    const top = normalize ? 1 : Math.max(...totals, 1);
    const { svg, sx, sy } = frame(container, { x: [xs[0] - 0.5, xs[xs.length - 1] + 0.5], y: [0, top],
                                               xTicks: xs.map(x => [x, String(x)]) });
    const width = Math.max(2, (sx(xs[0] + 1) - sx(xs[0])) * 0.8 || 8);
    xs.forEach((x, i) => {
      let base = 0;
      keys.forEach((k, j) => {
        const v = (counts[k][i] || 0) / (normalize ? (totals[i] || 1) : 1);
        if (!v) return;
        const rect = node("rect", { x: sx(x) - width / 2, y: sy(base + v), width, height: Math.max(0.5, sy(base) - sy(base + v)),
                                    fill: color(j, k), class: "point" }, link(svg, href && href(k, x)));
        node("title", {}, rect).textContent = `${k} @ ${x}: ${counts[k][i]} of ${totals[i]}`;
        base += v;
      });
    });
    legend(container, keys);
  }

  // labels: [..]; values: [..]; vertical bars.
  function bars(container, { labels, values, href, colorOf }) {
    if (!values.length) return empty(container);
    const xs = labels.map((_, i) => i);
    const { svg, sx, sy } = frame(container, { x: [-0.5, labels.length - 0.5], y: [0, Math.max(...values, 1)],
                                               xTicks: labels.map((label, i) => [i, label]) });
    const width = Math.max(3, (sx(1) - sx(0)) * 0.75);
    xs.forEach(i => {
      const rect = node("rect", { x: sx(i) - width / 2, y: sy(values[i]), width, height: Math.max(0.5, sy(0) - sy(values[i])),
                                  fill: colorOf ? colorOf(i) : PALETTE[0], class: "point" }, link(svg, href && href(labels[i])));
      node("title", {}, rect).textContent = `${labels[i]}: ${fmt(values[i])}`;
    });
  }

  // One horizontal bar split into parts (where the time goes).
  function split(container, parts) {
    const entries = Object.entries(parts).filter(([, v]) => v > 0);
    if (!entries.length) return empty(container);
    container.textContent = "";
    const total = entries.reduce((a, [, v]) => a + v, 0);
    const W = 480;
    const svg = node("svg", { viewBox: `0 0 ${W} 48`, role: "img" }, container);
    let x = 0;
    entries.forEach(([name, v], i) => {
      const w = v / total * W;
      const rect = node("rect", { x, y: 6, width: Math.max(w, 0.5), height: 30, fill: color(i, name) }, svg);
      node("title", {}, rect).textContent = `${name}: ${fmt(v)} s (${(100 * v / total).toFixed(1)}%)`;
      if (w > 60) node("text", { x: x + 4, y: 25, style: "fill: #fff" }, svg).textContent = `${name} ${(100 * v / total).toFixed(0)}%`;
      x += w;
    });
    legend(container, entries.map(([name, v]) => `${name} ${fmt(v)} s`));
  }

  return { line, stacked, bars, split, color, fmt, empty };
})();
