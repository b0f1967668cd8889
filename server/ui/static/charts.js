// Small inline-SVG charts (no library): a line chart for a running total, stacked bars per
// time bucket, and horizontal bars for distributions against a threshold. Each chart is a
// <figure> with its title, the SVG and a legend; data points carry class "point" / "bar".

import { h, s } from "./dom.js";

const W = 520;
const H = 180;
const PAD = { left: 54, right: 12, top: 10, bottom: 26 };

function niceMax(value, binary = false) {
  if (value <= 0) return 1;
  if (binary) return 2 ** Math.ceil(Math.log2(value));  // bytes: 512 KiB, 1 MiB, …
  const p = 10 ** Math.floor(Math.log10(value));
  const m = value / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

function clock(seconds) {
  return new Date(seconds * 1000).toISOString().slice(11, 19);
}

function frame(title, legend, body, { label = "" } = {}) {
  return h("figure", { class: "chart" },
    h("figcaption", null, title),
    body,
    legend.length ? h("ul", { class: "legend" }, legend.map(([cls, text]) =>
      h("li", null, h("span", { class: `swatch ${cls}` }), text))) : null,
    label ? h("p", { class: "muted small" }, label) : null);
}

function axes(svg, maxY, fmt, xStart, xEnd) {
  const innerH = H - PAD.top - PAD.bottom;
  for (const f of [0, 0.5, 1]) {
    const y = PAD.top + innerH * (1 - f);
    svg.append(s("line", { class: "grid", x1: PAD.left, x2: W - PAD.right, y1: y, y2: y }));
    svg.append(s("text", { class: "tick", x: PAD.left - 6, y: y + 4, "text-anchor": "end" },
      fmt(maxY * f)));
  }
  if (xStart !== undefined) {
    svg.append(s("text", { class: "tick", x: PAD.left, y: H - 8 }, clock(xStart)));
    svg.append(s("text", { class: "tick", x: W - PAD.right, y: H - 8, "text-anchor": "end" },
      clock(xEnd)));
  }
}

function svgRoot(name) {
  return s("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img", "aria-label": name,
    "data-chart": name });
}

/** points: [{x: unix seconds, y}] drawn as a step line with a dot per bucket. */
export function lineChart(name, title, points, { fmt = String, cls = "s-adopt", legend } = {}) {
  const svg = svgRoot(name);
  const maxY = niceMax(Math.max(1, ...points.map((p) => p.y)));
  const x0 = points.length ? points[0].x : 0;
  const x1 = points.length ? points[points.length - 1].x : 1;
  axes(svg, maxY, fmt, x0, x1);
  const innerW = W - PAD.left - PAD.right;
  const innerH = H - PAD.top - PAD.bottom;
  const px = (x) => PAD.left + (x1 === x0 ? innerW : ((x - x0) / (x1 - x0)) * innerW);
  const py = (y) => PAD.top + innerH * (1 - y / maxY);
  if (points.length) {
    const d = points.map((p, i) => `${i ? "L" : "M"}${px(p.x).toFixed(1)},${py(p.y).toFixed(1)}`);
    svg.append(s("path", { class: `line ${cls}`, d: d.join(" ") }));
    for (const p of points) {
      svg.append(s("circle", { class: `point ${cls}`, cx: px(p.x).toFixed(1),
        cy: py(p.y).toFixed(1), r: 2.5 }, s("title", null, `${clock(p.x)}: ${fmt(p.y)}`)));
    }
  }
  return frame(title, legend || [], svg);
}

/** series: [{cls, label, values: [number per bucket]}], starts: bucket start times. */
export function stackedBars(name, title, starts, series, { fmt = String, binary = false } = {}) {
  const svg = svgRoot(name);
  const totals = starts.map((_, i) => series.reduce((sum, sr) => sum + (sr.values[i] || 0), 0));
  const maxY = niceMax(Math.max(1, ...totals), binary);
  axes(svg, maxY, fmt, starts[0], starts[starts.length - 1]);
  const innerW = W - PAD.left - PAD.right;
  const innerH = H - PAD.top - PAD.bottom;
  const slot = innerW / Math.max(1, starts.length);
  const barW = Math.max(1, Math.min(slot * 0.8, 36));
  starts.forEach((start, i) => {
    let base = 0;
    for (const sr of series) {
      const v = sr.values[i] || 0;
      if (!v) continue;
      const y = PAD.top + innerH * (1 - (base + v) / maxY);
      const height = (innerH * v) / maxY;
      svg.append(s("rect", { class: `bar ${sr.cls}`, x: (PAD.left + i * slot + (slot - barW) / 2)
        .toFixed(1), y: y.toFixed(1), width: barW.toFixed(1), height: height.toFixed(1) },
      s("title", null, `${clock(start)} ${sr.label}: ${fmt(v)}`)));
      base += v;
    }
  });
  const sums = series.map((sr) => sr.values.reduce((a, b) => a + b, 0));
  return frame(title, series.map((sr, i) => [sr.cls, `${sr.label} (${fmt(sums[i])})`]), svg);
}

/** bars: [{label, value|null, cls, judged}], limit: a threshold line (or null); a judged bar
 * past it turns red. */
export function hbars(name, title, bars, { fmt = String, limit = null, limitLabel = "" } = {}) {
  const rowH = 26;
  const height = bars.length * rowH + 24;
  const svg = s("svg", { viewBox: `0 0 ${W} ${height}`, class: "plot", role: "img",
    "aria-label": name, "data-chart": name });
  const left = 130;
  const innerW = W - left - 70;
  const maxV = niceMax(Math.max(1, limit || 0, ...bars.map((b) => b.value || 0)));
  bars.forEach((b, i) => {
    const y = 8 + i * rowH;
    svg.append(s("text", { class: "tick", x: left - 8, y: y + 14, "text-anchor": "end" },
      b.label));
    if (b.value === null || b.value === undefined) {
      svg.append(s("text", { class: "tick muted", x: left + 4, y: y + 14 }, "no reports yet"));
      return;
    }
    const w = Math.max(1, (b.value / maxV) * innerW);
    const over = limit !== null && b.judged && b.value > limit;  // only what the limit applies to
    svg.append(s("rect", { class: `bar ${over ? "s-fail" : b.cls}`, x: left, y, width:
      w.toFixed(1), height: rowH - 8 }, s("title", null, `${b.label}: ${fmt(b.value)}`)));
    svg.append(s("text", { class: "tick", x: left + w + 6, y: y + 14 }, fmt(b.value)));
  });
  if (limit !== null) {
    const x = left + (limit / maxV) * innerW;
    svg.append(s("line", { class: "limit", x1: x, x2: x, y1: 2, y2: height - 18 }));
    svg.append(s("text", { class: "tick limit-label", x, y: height - 4, "text-anchor":
      "middle" }, `${limitLabel} ${fmt(limit)}`));
  }
  return frame(title, [], svg);
}
