// The per-layer diff heatmap of a version (GET …/layers): rows are the source's tensors in
// node order, columns the artifacts (platform · variant · precision); a cell's shade is its
// SNR against the FP32 source, and a cell below its column's thresholds is marked.

import { api } from "./api.js";
import { h, replace, seg } from "./dom.js";

const PAGE = 100;

// SNR (dB) bands for the shades heat-0 (worst) … heat-4 (best).
function band(snr) {
  const v = snr === "inf" ? Infinity : snr === "-inf" ? -Infinity : Number(snr);
  if (v >= 60) return 4;
  if (v >= 40) return 3;
  if (v >= 30) return 2;
  if (v >= 20) return 1;
  return 0;
}

function below(cell, column) {
  const t = column.thresholds;
  if (!t || !cell) return false;
  const num = (x) => (x === "inf" ? Infinity : x === "-inf" ? -Infinity : Number(x));
  return !(num(cell[0]) > t.min_cosine && num(cell[1]) > t.min_snr_db);
}

function label(c) {
  return `${c.platform}${c.variant ? ` · ${c.variant}` : ""} (${c.precision || "?"})`;
}

function firstBelow(c) {
  if (c.unavailable) return h("li", null, `${label(c)}: no per-layer diff (${c.unavailable})`);
  const f = c.first_below;
  return h("li", null, `${label(c)}: `, f
    ? [`first layer below the ${c.precision.toUpperCase()} thresholds: `,
      h("code", { class: "first-below" }, f.node), ` (${f.op}, cosine ${f.cosine}, SNR ${f.snr_db} dB)`]
    : `every compared layer meets cosine > ${c.thresholds?.min_cosine}, SNR > ${c.thresholds?.min_snr_db} dB`,
  c.truncated ? ` · first ${c.total > 1000 ? 1000 : c.total} of ${c.total} tensors` : "");
}

export function layerHeatmap(name, version) {
  const box = h("div", { id: "layer-diff" });
  let offset = 0;
  async function load() {
    const base = `/v1/models/${seg(name)}/versions/${seg(version)}/layers`;
    const p = await api(`${base}?offset=${offset}&limit=${PAGE}`);
    if (!p.columns.length) {
      replace(box, h("p", { class: "muted" }, "no per-layer diff (the version has no reference inputs, or its builds predate it)"));
      return;
    }
    const shown = p.columns.map((c, i) => [c, i]).filter(([c]) => !c.unavailable);
    const head = h("tr", null, h("th", null, "layer"), h("th", null, "op"),
      shown.map(([c]) => h("th", { class: "heat-col" }, label(c))));
    const rows = p.layers.map((r) => h("tr", null, h("td", null, h("code", null, r.node)),
      h("td", null, r.op), shown.map(([c, i]) => {
        const cell = r.cells[i];
        if (!cell) return h("td", { class: "heat heat-none", title: "not compared" }, "·");
        const cls = `heat heat-${band(cell[1])}${below(cell, c) ? " below" : ""}`;
        return h("td", { class: cls, title: `cosine ${cell[0]}, SNR ${cell[1]} dB` },
          cell[1] === "inf" ? "∞" : Number(cell[1]).toFixed(0));
      })));
    const nav = h("p", { class: "muted small" }, `layers ${p.total ? p.offset + 1 : 0}–${p.offset + p.layers.length} of ${p.total} `,
      p.offset > 0 ? h("button", { type: "button", onclick: () => { offset = Math.max(0, offset - PAGE); load(); } }, "previous") : null,
      p.next_offset !== null ? h("button", { type: "button", id: "layers-next", onclick: () => { offset = p.next_offset; load(); } }, "next") : null);
    replace(box, h("ul", { class: "small" }, p.columns.map(firstBelow)),
      h("table", { class: "heatmap", id: "layer-heatmap" }, h("thead", null, head), h("tbody", null, rows)),
      nav, h("p", { class: "muted small" }, "cell: SNR in dB against the FP32 source (darker = closer); outlined: below the column's thresholds"));
  }
  return { box, load };
}
