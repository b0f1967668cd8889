// Channels with their rollouts, and one rollout: live health as charts (adoption over time,
// patch vs full bytes, shadow verdicts, divergence and latency against the thresholds) and
// the ramp / pause / resume / promote / halt controls (a token with scope `rollout`), and its
// ramp schedule if it has one (docs/shadow.md "Ramp schedules").

import { api } from "./api.js";
import { hbars, lineChart, stackedBars } from "./charts.js";
import { badge, bytes, h, replace, seg, table, when } from "./dom.js";

export function channelsPage(root) {
  const list = h("div");
  replace(root, h("h1", null, "Channels and rollouts"), list);
  return {
    async refresh() {
      const channels = await api("/v1/channels");
      const rollouts = await Promise.all(channels.map((c) =>
        api(`/v1/channels/${seg(c.name)}/rollouts`)));
      replace(list, channels.length ? channels.map((c, i) => h("section", { class: "card" },
        h("h2", null, c.name, h("span", { class: "muted small" },
          ` manifest serial ${c.serial ?? "–"} · expires `, when(c.expires))),
        c.description ? h("p", { class: "description" }, c.description) : null,
        table(["rollout", "model", "version", "share", "mode", "state", "reason"],
          rollouts[i].map((r) => [h("a", { href: `#/rollouts/${r.id}` }, `#${r.id}`), r.model,
            r.version, `${r.percentage}%`, r.mode, badge(r.state), r.state_reason || ""]),
          { empty: "No rollouts on this channel." }))) :
        h("p", { class: "muted" }, "No channels yet."));
    },
  };
}

const fmtInt = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1));
const fmtMicro = (v) => (v / 1e6).toFixed(4);
const fmtUs = (v) => (v >= 1000 ? `${(v / 1000).toFixed(1)} ms` : `${Math.round(v)} µs`);

const COUNTED = ["offered", "downloaded", "shadow", "passed", "failed", "active", "rolled_back"];
// Devices whose reports were stored but never counted (docs/shadow.md "What a device can
// influence"), and revoked devices whose votes were removed.
const NOT_COUNTED = ["not_offered", "forged", "unattested", "revoked"];

function tiles(devices) {
  const tile = (k) => h("div", { class: `tile t-${k}` },
    h("span", { class: "tile-value", "data-count": k }, String(devices[k] ?? 0)),
    h("span", { class: "tile-label" }, k.replace("_", " ")));
  return h("div", null, h("div", { class: "tiles" }, COUNTED.map(tile)),
    h("p", { class: "muted small" }, "not counted (stored, shown apart):"),
    h("div", { class: "tiles not-counted", id: "not-counted" }, NOT_COUNTED.map(tile)));
}

function charts(rollout, timeline) {
  const b = timeline.buckets;
  const starts = b.map((x) => x.start);
  const health = rollout.health;
  const shadow = rollout.shadow || {};
  return h("div", { class: "charts" },
    lineChart("adoption", "Adoption over time (devices on this version)",
      b.map((x) => ({ x: x.start, y: x.adoption })), { fmt: fmtInt,
        legend: [["s-adopt", `now ${b.length ? b[b.length - 1].adoption : 0} devices`]] }),
    stackedBars("bytes", "Bytes downloaded: patch vs full", starts, [
      { cls: "s-patch", label: "patch", values: b.map((x) => x.bytes_via.patch) },
      { cls: "s-full", label: "full", values: b.map((x) => x.bytes_via.full) }],
    { fmt: bytes, binary: true }),
    stackedBars("shadow", "Shadow reports: passed / failed / pending", starts, [
      { cls: "s-pass", label: "passed", values: b.map((x) => x.shadow.passed) },
      { cls: "s-fail", label: "failed", values: b.map((x) => x.shadow.failed) },
      { cls: "s-pending", label: "pending", values: b.map((x) => x.shadow.pending) }],
    { fmt: fmtInt }),
    stackedBars("events", "Update steps reported", starts, [
      { cls: "s-adopt", label: "activated", values: b.map((x) => x.events.activated) },
      { cls: "s-patch", label: "downloaded", values: b.map((x) => x.events.downloaded) },
      { cls: "s-fail", label: "failed", values: b.map((x) => x.events.failed) },
      { cls: "s-back", label: "rolled back", values: b.map((x) => x.events.rolled_back) }],
    { fmt: fmtInt }),
    hbars("divergence", "Divergence (KL) across devices", [
      { label: "p50 of means", value: health.kl_micro.p50, cls: "s-adopt", judged: true },
      { label: "p99 of means", value: health.kl_micro.p99, cls: "s-patch", judged: true },
      { label: "max of maxima", value: health.kl_micro.max, cls: "s-full" }],
    { fmt: fmtMicro, limit: shadow.max_kl_micro ?? null, limitLabel: "limit (mean)" }),
    hbars("latency", "Latency across devices", [
      { label: "active p50", value: health.latency_p99_us.active_p50, cls: "s-adopt" },
      { label: "candidate p50", value: health.latency_p99_us.candidate_p50, cls: "s-patch" },
      { label: "candidate p99", value: health.latency_p99_us.candidate_p99, cls: "s-full",
        judged: true }],
    { fmt: fmtUs, limit: health.guard.max_latency_p99_us ?? shadow.max_latency_p99_us ?? null,
      limitLabel: "limit (p99)" }));
}

const RAMP_STATES = {
  scheduled: "steps up while healthy",
  waiting_for_promotion: "steps once promoted to active",
  paused: "paused: resuming restarts the wait",
  done: "no step left",
  taken_over: "a manual ramp cleared the remaining steps",
  halted: "halted: the schedule ended",
};

// The steps as a row of pills: the ones passed, the one the share is at (aria-current), the
// ones still ahead; then when the next one is due and what the schedule is doing. Once a
// manual ramp took over, the share is no step's: none is current, the rest are struck out.
function rampCard(ramp) {
  if (!ramp) return null;
  const minutes = ramp.interval_seconds / 60;
  const every = minutes >= 60 && minutes % 60 === 0 ? `${minutes / 60} h` : `${minutes} min`;
  const over = ramp.state === "taken_over";
  const kind = (n) => (n < ramp.step || (over && n === ramp.step) ? "past"
    : over ? "cleared" : n === ramp.step ? "current" : "ahead");
  return h("section", { class: "card ramp", id: "ramp-schedule" },
    h("h2", null, "Ramp schedule ", h("span", { id: "ramp-state" }, badge(ramp.state))),
    h("ol", { class: "steps", "aria-label": "ramp steps" }, ramp.steps.map((p, i) => h("li", {
      class: `step ${kind(i + 1)}`, "aria-current": kind(i + 1) === "current" ? "step" : null,
      "data-step": String(i + 1) }, `${p}%`))),
    h("p", { class: "muted small" }, `step ${ramp.step} of ${ramp.steps.length} · every ${every}` +
      " · next step ", h("strong", { id: "ramp-next" }, when(ramp.next_step_at)),
      ` · ${RAMP_STATES[ramp.state] ?? ramp.state}`));
}

function controls(id, onDone) {
  const percent = h("input", { id: "ramp-percentage", type: "number", min: "0", max: "100",
    step: "0.0001", placeholder: "%", "aria-label": "new share in percent" });
  const reason = h("input", { id: "halt-reason", type: "text", maxlength: "2000",
    placeholder: "reason (kept in the audit log; needed to resume a halt)",
    "aria-label": "reason for a halt or a resume" });
  const dialogText = h("p");
  const dialog = h("dialog", { id: "confirm-dialog" }, h("form", { method: "dialog" },
    dialogText, h("menu", null,
      h("button", { value: "cancel", id: "confirm-cancel" }, "Cancel"),
      h("button", { value: "ok", id: "confirm-ok", class: "danger" }, "Confirm"))));
  const act = (label, path, body, method = "POST") => () => {
    dialogText.textContent = `${label} rollout #${id}?`;
    dialog.returnValue = "";
    dialog.onclose = async () => {
      if (dialog.returnValue !== "ok") return;
      await onDone(() => api(`/v1/rollouts/${id}${path}`, { method, body: body() }), label);
    };
    dialog.showModal();
  };
  return h("section", { class: "card controls", id: "controls" }, h("h2", null, "Controls"),
    h("p", { class: "muted small" }, "Changes need a token with scope rollout; each one " +
      "signs a new manifest."),
    h("div", { class: "row" }, percent,
      h("button", { id: "ramp", type: "button", onclick: act("Ramp", "", () =>
        ({ percentage: percent.value }), "PATCH") }, "Ramp"),
      h("button", { id: "promote", type: "button", onclick: act("Promote", "", () =>
        ({ mode: "active" }), "PATCH") }, "Promote to active"),
      h("button", { id: "pause", type: "button", onclick: act("Pause", "/pause", () =>
        ({ reason: "" })) }, "Pause"),
      h("button", { id: "resume", type: "button", onclick: act("Resume", "/resume",
        () => (reason.value ? { reason: reason.value } : undefined)) }, "Resume")),
    h("div", { class: "row" }, reason,
      h("button", { id: "halt", type: "button", class: "danger", onclick: act("Halt",
        "/halt", () => ({ reason: reason.value })) }, "Halt (roll back)")),
    dialog);
}

export function rolloutPage(root, { id }, { notify }) {
  const head = h("div");
  const live = h("div");
  const page = {
    async refresh() {
      const [rollout, timeline, channels] = await Promise.all([
        api(`/v1/rollouts/${seg(id)}`), api(`/v1/rollouts/${seg(id)}/timeline`),
        api("/v1/channels")]);
      const channel = channels.find((c) => c.name === rollout.channel) || {};
      replace(head, h("h1", null, `${rollout.model} ${rollout.version} `,
        h("span", { class: "muted" }, `on ${rollout.channel} `), badge(rollout.state)),
      h("p", { class: "summary" }, `rollout #${rollout.id} · ${rollout.mode} · share `,
        h("strong", { id: "share" }, `${rollout.percentage}%`), " · manifest serial ",
        h("strong", { id: "manifest-serial" }, String(channel.serial ?? "–")),
        " · ", h("a", { href: `#/models/${seg(rollout.model)}/versions/${seg(rollout.version)}` },
          "builds and gates")),
      rollout.state_reason ? h("p", { class: "reason" }, "reason: ",
        h("span", { id: "state-reason" }, rollout.state_reason)) : null,
      rampCard(rollout.ramp));
      // A halted rollout takes only a resume, with a reason (docs/shadow.md).
      for (const el of root.querySelectorAll("#controls input, #controls .row button")) {
        el.disabled = rollout.state === "halted" && el.id !== "resume" && el.id !== "halt-reason";
      }
      root.querySelector("#promote").hidden = rollout.mode !== "shadow";
      replace(live, tiles(rollout.health.devices), charts(rollout, timeline),
        h("p", { class: "muted small" }, `buckets of ${timeline.bucket_seconds} s since `,
          when(timeline.start)));
    },
  };
  const done = async (call, label) => {
    const changed = await call();
    notify(`${label}: ${changed.serial === null ? "no change" :
      `signed manifest serial ${changed.serial}`}`);
    for (const el of root.querySelectorAll("#controls input")) el.value = "";
    await page.refresh();
  };
  replace(root, h("p", { class: "crumbs" }, h("a", { href: "#/channels" }, "Channels"),
    ` / rollout #${id}`), head, live, controls(seg(id), async (call, label) => {
    try {
      await done(call, label);
    } catch (e) {
      notify(e.message + (e.fix ? ` — ${e.fix}` : ""), true);
    }
  }));
  return page;
}
