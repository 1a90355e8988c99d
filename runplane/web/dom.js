// Building the page: every text from the API goes in as a text node, never as markup.

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else if (key === "checked" || key === "value" || key === "disabled") node[key] = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const SVG = "http://www.w3.org/2000/svg";

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) node.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function replace(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

export const TERMINAL = ["succeeded", "failed", "killed", "timed_out"];
export const STATES = ["queued", "preparing", "running", "uploading", ...TERMINAL];

export function badge(state) {
  return h("span", { class: `state state-${state}` }, state.replace("_", " "));
}

export function seconds(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 60) return `${value.toFixed(1)} s`;
  if (value < 3600) return `${Math.floor(value / 60)} m ${Math.round(value % 60)} s`;
  return `${Math.floor(value / 3600)} h ${Math.round((value % 3600) / 60)} m`;
}

export function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let n = value;
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return h("time", { datetime: iso, title: iso }, d.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" }));
}

export function ago(iso) {
  if (!iso) return "–";
  const s = (Date.now() - new Date(iso).getTime()) / 1000;
  return h("time", { datetime: iso, title: iso }, `${seconds(Math.max(0, s))} ago`);
}

export function duration(run) {
  if (!run.started_at) return null;
  const end = run.finished_at ? new Date(run.finished_at) : new Date();
  return (end - new Date(run.started_at)) / 1000;
}

export function hours(secs) {
  if (secs === null || secs === undefined) return "–";
  return secs > 0 && secs < 36 ? "< 0.01" : (secs / 3600).toFixed(2);
}

export function runLink(id, text) {
  return h("a", { href: `#/runs/${encodeURIComponent(id)}` }, text ?? id);
}

export function message(kind, text) {
  return h("p", { class: `msg msg-${kind}`, role: kind === "error" ? "alert" : "status" }, text);
}

export function table(headers, rows, attrs = {}) {
  return h(
    "div",
    { class: "table-wrap" },
    h("table", attrs, h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))), h("tbody", {}, rows)),
  );
}

// A query string of the page's own hash (#/runs?state=failed) as a URLSearchParams, and back.
export function hashQuery() {
  const at = location.hash.indexOf("?");
  return new URLSearchParams(at < 0 ? "" : location.hash.slice(at + 1));
}

export function setHashQuery(path, params) {
  const clean = new URLSearchParams();
  for (const [k, v] of params) if (v) clean.set(k, v);
  const text = clean.toString();
  const hash = `#${path}${text ? `?${text}` : ""}`;
  if (location.hash !== hash) location.hash = hash;
}

// What identifies a control across a redraw that builds it anew: its kind, target, name and text.
function focusKey(el) {
  return [el.tagName, el.getAttribute("href"), el.getAttribute("aria-label"), el.id, el.textContent].join("|");
}

// Redraws inside `root` with `draw()`; a control that had the focus and was drawn anew gets it
// back, so live refreshes never take the keyboard's place away.
export function keepFocus(root, draw) {
  const active = document.activeElement;
  const key = active && active !== document.body && root.contains(active) ? focusKey(active) : null;
  draw();
  if (!key || root.contains(active)) return;
  for (const el of root.querySelectorAll("a, button, input, select, textarea, pre[tabindex]")) {
    if (focusKey(el) === key) {
      el.focus({ preventScroll: true });
      return;
    }
  }
}

// Calls `fn` now, or once the tab is shown again: a hidden page asks the API for nothing.
export function whenShown(fn) {
  if (!document.hidden) return fn();
  document.addEventListener("visibilitychange", () => fn(), { once: true });
  return undefined;
}

// A URL from the API as a link target: only http(s) addresses and the page's own "#/" routes;
// anything else (javascript:, data:, a relative path) is null, and is shown as text.
export function safeHref(url) {
  if (typeof url !== "string") return null;
  if (url.startsWith("#/")) return url;
  try {
    const parsed = new URL(url);
    return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
  } catch {
    return null;
  }
}

// Puts a message in `node` unless the same one is already there, so a screen reader hears an
// error once when it appears or changes, not again on every refresh that meets it.
export function say(node, kind, text) {
  const shown = node.firstElementChild;
  if (shown && shown.dataset.kind === kind && shown.textContent === text) return;
  const note = message(kind, text);
  note.dataset.kind = kind;
  replace(node, note);
}

// How long a refresh loop waits after its `failures`-th error in a row: the server's Retry-After
// when it sent one, else doubling from `every` up to `cap`. Errors that waiting cannot mend (a
// refused filter, say) keep the ordinary pace.
export function backoff(error, every, failures, cap = 60_000) {
  const status = error && error.status;
  const transient = status === undefined || status === 0 || status === 429 || status >= 500;
  if (!transient) return every;
  const grown = Math.min(cap, every * 2 ** Math.min(failures, 16));
  return error.retryAfter ? Math.max(grown, Math.min(error.retryAfter, 10 * cap)) : grown;
}

// A page's refresh loop. `step(current)` reads and draws, and answers how long to wait before
// the next read (or false to stop); `current()` says whether its reply is still the one wanted.
// Calling `now()` starts a read at once: the reply of a read it overtakes is dropped, and only
// the latest read arms the timer, so a page never runs two loops. Errors go to `onError` and
// make the loop wait longer (see backoff).
export function refresher(step, { every, onError = () => {}, cap }) {
  let seq = 0;
  let timer = null;
  let stopped = false;
  let failures = 0;
  async function now() {
    clearTimeout(timer);
    timer = null;
    const mine = ++seq;
    const current = () => !stopped && mine === seq;
    let wait = every;
    try {
      const next = await step(current);
      if (!current()) return;
      failures = 0;
      if (next === false) return;
      if (typeof next === "number") wait = next;
    } catch (error) {
      if (!current()) return;
      failures += 1;
      onError(error);
      wait = backoff(error, every, failures, cap);
    }
    timer = setTimeout(() => whenShown(() => mine === seq && !stopped && now()), wait);
  }
  return {
    now,
    stop() {
      stopped = true;
      seq += 1;
      clearTimeout(timer);
    },
  };
}
