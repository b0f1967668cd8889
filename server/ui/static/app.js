// The dashboard shell: hash routes to pages, the token form, the status line, and the live
// refresh (every REFRESH_MS the current page fetches its data again).

import { ApiError, token } from "./api.js";
import { replace } from "./dom.js";
import { channelsPage, rolloutPage } from "./fleet.js";
import { auditPage, devicesPage } from "./logs.js";
import { modelPage, modelsPage, versionPage } from "./registry.js";

const REFRESH_MS = 5000;
const ROUTES = [
  [/^models$/, modelsPage, []],
  [/^models\/([^/]+)$/, modelPage, ["name"]],
  [/^models\/([^/]+)\/versions\/([^/]+)$/, versionPage, ["name", "version"]],
  [/^channels$/, channelsPage, []],
  [/^rollouts\/(\d+)$/, rolloutPage, ["id"]],
  [/^audit$/, auditPage, []],
  [/^devices$/, devicesPage, []],
];

const view = document.getElementById("view");
const status = document.getElementById("status");
let current = null;
let generation = 0;

// Messages of the user's own actions stay until the next one; a failed refresh clears itself
// once a refresh succeeds again.
function notify(message, isError = false, sticky = true) {
  status.textContent = message;
  status.className = message ? (isError ? "error" : "ok") : "";
  status.dataset.sticky = sticky ? "1" : "";
}

function describe(error) {
  if (error instanceof ApiError && error.status === 401) {
    return "This page needs an API token: paste one above (any scope reads; scope rollout " +
      "changes rollouts).";
  }
  return error.message + (error.fix ? ` — ${error.fix}` : "");
}

async function refresh(mine) {
  if (!current || mine !== generation) return;
  try {
    await current.refresh();
    if (mine !== generation) return;
    document.getElementById("refreshed").textContent =
      `updated ${new Date().toISOString().slice(11, 19)}Z`;
    if (status.dataset.sticky !== "1") notify("");
  } catch (error) {
    notify(describe(error), true, false);
  }
}

function route() {
  const path = decodeURIComponent(location.hash.replace(/^#\/?/, "")) || "models";
  generation += 1;
  notify("");
  for (const [pattern, page, names] of ROUTES) {
    const match = path.match(pattern);
    if (!match) continue;
    const params = Object.fromEntries(names.map((n, i) => [n, match[i + 1]]));
    current = page(view, params, { notify });
    for (const a of document.querySelectorAll("nav a")) {
      a.classList.toggle("here", path.startsWith(a.dataset.nav) ||
        (a.dataset.nav === "channels" && path.startsWith("rollouts")));
    }
    refresh(generation);
    return;
  }
  current = null;
  replace(view);
  notify(`no page at #/${path}`, true);
}

function showToken() {
  const secret = token.get();
  document.getElementById("token-state").textContent =
    secret ? `token ${secret.slice(0, 10)}…` : "no token";
  document.getElementById("token-forget").hidden = !secret;
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("token-input");
  const value = input.value.trim();
  input.value = "";
  if (value) token.set(value);
  showToken();
  refresh(generation);
});
document.getElementById("token-forget").addEventListener("click", () => {
  token.clear();
  showToken();
  refresh(generation);
});

window.addEventListener("hashchange", route);
setInterval(() => refresh(generation), REFRESH_MS);
showToken();
route();
