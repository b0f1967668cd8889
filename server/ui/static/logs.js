// The audit log (paged by before_id) and the devices the server has seen (any token).

import { api } from "./api.js";
import { h, replace, table, when } from "./dom.js";

function detailText(details) {
  return Object.entries(details || {}).map(([k, v]) =>
    `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(" · ");
}

export function auditPage(root) {
  const list = h("div");
  const pager = h("p");
  let before = null;  // the page shown: null = newest
  const newer = [];
  replace(root, h("h1", null, "Audit log"), list, pager);
  const page = {
    async refresh() {
      const query = new URLSearchParams({ limit: "50" });
      if (before) query.set("before_id", String(before));
      const { events, next_before_id: next } = await api(`/v1/audit?${query}`);
      replace(list, table(["when", "actor", "action", "target", "details"],
        events.map((e) => [when(e.at), e.actor, h("code", null, e.action), e.target,
          h("span", { class: "details" }, detailText(e.details))]),
        { empty: "No audit events.", cls: "audit" }));
      replace(pager,
        newer.length ? h("button", { type: "button", onclick: () => {
          before = newer.pop(); page.refresh(); } }, "Newer") : null, " ",
        next ? h("button", { type: "button", onclick: () => {
          newer.push(before); before = next; page.refresh(); } }, "Older") : null);
    },
  };
  return page;
}

export function devicesPage(root) {
  const list = h("div");
  replace(root, h("h1", null, "Devices"), list);
  return {
    async refresh() {
      const { devices } = await api("/v1/devices?limit=200");
      replace(list, table(["device", "platform", "soc", "arch", "os", "app", "first seen",
        "last seen"], devices.map((d) => [h("code", null, d.id), d.profile.platform || "–",
        d.profile.soc || "–", d.profile.arch || "–", d.profile.os_version || "–",
        d.profile.app_version || "–", when(d.first_seen_at), when(d.last_seen_at)]),
      { empty: "No device has enrolled or reported yet." }));
    },
  };
}
