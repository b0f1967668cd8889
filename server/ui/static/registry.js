// Models, their versions, and a version's builds with gate reports and its delta-patch job
// (open reads: no token).

import { api } from "./api.js";
import { badge, bytes, h, replace, seg, table, when } from "./dom.js";
import { layerHeatmap } from "./layers.js";

export function modelsPage(root) {
  const list = h("div");
  replace(root, h("h1", null, "Models"), list);
  return {
    async refresh() {
      const { models } = await api("/v1/models?limit=500");
      replace(list, table(["model", "task", "owner", "versions", "description", "created"],
        models.map((m) => [h("a", { href: `#/models/${seg(m.name)}` }, m.name), m.task,
          m.owner || "–", String(m.version_count), m.description, when(m.created_at)]),
        { empty: "No models yet: `modelfleet publish` uploads one (docs/cli.md)." }));
    },
  };
}

export function modelPage(root, { name }) {
  const head = h("div");
  const list = h("div");
  replace(root, h("p", { class: "crumbs" }, h("a", { href: "#/models" }, "Models"), " / ", name),
    head, h("h2", null, "Versions"), list);
  return {
    async refresh() {
      const [model, { versions }] = await Promise.all([
        api(`/v1/models/${seg(name)}`), api(`/v1/models/${seg(name)}/versions`)]);
      replace(head, h("h1", null, model.name),
        h("p", { class: "muted" }, `${model.task} · owner ${model.owner || "–"} · created `,
          when(model.created_at), ` by ${model.created_by || "–"}`),
        model.description ? h("p", { class: "description" }, model.description) : null);
      replace(list, table(["version", "state", "source", "builds", "created"],
        versions.map((v) => [
          h("a", { href: `#/models/${seg(name)}/versions/${seg(v.version)}` }, v.version),
          badge(v.state), `${v.source_format} · ${bytes(v.length)}`,
          h("span", null, v.builds.map((b) => [badge(b.state), ` ${b.platform}`,
            b.variant ? `/${b.variant}` : "", " "])),
          when(v.created_at)]), { empty: "No versions yet." }));
    },
  };
}

function gateRows(gates) {
  if (!gates) return h("p", { class: "muted" }, "no gate report");
  return h("dl", { class: "gates" }, Object.entries(gates).map(([key, value]) => [
    h("dt", null, key),
    h("dd", null, typeof value === "object" && value !== null
      ? h("pre", null, JSON.stringify(value, null, 2)) : String(value))]));
}

// The delta-patch job (docs/publishing.md): made before the version turns ready; a failure
// never holds the release back, devices then download in full.
function patchesLine(p) {
  if (!p) {
    return h("p", { class: "muted small", id: "patches" }, "delta patches: none needed yet");
  }
  return h("div", { id: "patches" }, h("p", { class: "muted small" }, "delta patches: ",
    h("span", { id: "patches-state" }, badge(p.state)), " · ",
    h("strong", { id: "patches-count" }, String(p.patches)),
    ` made · attempts ${p.attempts}`,
    p.state === "failed" ? " · devices download the full artifacts" : ""),
  p.error ? h("p", { class: "error", id: "patches-error" }, p.error) : null);
}

export function versionPage(root, { name, version }) {
  const head = h("div");
  const builds = h("div");
  const heat = layerHeatmap(name, version);
  let heatLoaded = false;
  replace(root, h("p", { class: "crumbs" }, h("a", { href: "#/models" }, "Models"), " / ",
    h("a", { href: `#/models/${seg(name)}` }, name), " / ", version), head,
  h("h2", null, "Per-layer diff against the FP32 source"), heat.box,
  h("h2", null, "Builds and gate reports"), builds);
  return {
    async refresh() {
      const base = `/v1/models/${seg(name)}/versions/${seg(version)}`;
      const [v, list] = await Promise.all([api(base), api(`${base}/builds?logs=false`)]);
      if (!heatLoaded) { heatLoaded = true; await heat.load(); } // paged by hand, not polled
      replace(head, h("h1", null, `${name} ${v.version} `, badge(v.state)),
        h("p", { class: "muted" }, `${v.source_format} · ${bytes(v.length)} · sha256 `,
          h("code", null, v.sha256.slice(0, 16)), "… · uploaded ", when(v.created_at),
          ` by ${v.created_by || "–"}`),
        v.error ? h("p", { class: "error" }, v.error) : null,
        patchesLine(v.patches),
        v.notes ? h("p", { class: "description" }, v.notes) : null);
      replace(builds, list.length ? list.map((b) => h("section", { class: "card" },
        h("h3", null, `${b.platform}${b.variant ? ` · ${b.variant}` : ""} `, badge(b.state),
          h("span", { class: "muted small" }, ` attempts ${b.attempts}`)),
        b.artifact ? h("p", { class: "muted small" }, `${b.artifact.format} · `,
          bytes(b.artifact.length), " · ", h("code", null, b.artifact.sha256.slice(0, 16)), "…")
          : null,
        b.error ? h("p", { class: "error" }, b.error) : null,
        gateRows(b.gates))) : h("p", { class: "muted" }, "No builds."));
    },
  };
}
