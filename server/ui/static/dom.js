// Building the page without HTML strings: every value from the API becomes a text node
// (textContent), so a model name or an audit reason can never turn into markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function applyProps(el, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.setAttribute("class", value);
    } else if (key === "href" && !String(value).startsWith("#") && !String(value).startsWith("/")) {
      throw new Error("links stay inside the dashboard");
    } else {
      el.setAttribute(key, String(value));
    }
  }
}

function appendAll(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** An HTML element: h("td", {class: "num"}, "text", otherNode). */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  applyProps(el, props);
  appendAll(el, children);
  return el;
}

/** An SVG element, same calling convention. */
export function s(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  applyProps(el, props);
  appendAll(el, children);
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  appendAll(el, children);
}

/** A table from rows of cells; `head` names the columns. */
export function table(head, rows, { empty = "nothing yet", cls = "" } = {}) {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h("table", { class: cls },
    h("thead", null, h("tr", null, head.map((c) => h("th", null, c)))),
    h("tbody", null, rows.map((r) => h("tr", null, r.map((c) => h("td", null, c))))));
}

export function seg(value) {
  return encodeURIComponent(String(value));
}

export function when(iso) {
  if (!iso) return "–";
  const d = typeof iso === "number" ? new Date(iso * 1000) : new Date(iso);
  return d.toISOString().replace("T", " ").slice(0, 19) + "Z";
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${i ? v.toFixed(1) : v} ${units[i]}`;
}

export function badge(state) {
  return h("span", { class: `badge b-${String(state).replace(/[^a-z_]/g, "")}` }, state);
}
