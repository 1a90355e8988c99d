// The dashboard's entry: sign-in by token, the top bar, and routing between pages by the hash.
import { api, get, token } from "./api.js";
import { h, keepFocus, message, replace } from "./dom.js";
import { poolsPage } from "./pools.js";
import { runPage } from "./run.js";
import { runsPage } from "./runs.js";
import { sweepPage, sweepsPage } from "./sweeps.js";
import { usagePage } from "./usage.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
const session = { me: null, admin: false };
let leave = null; // what the page on screen stops (timers) when another is shown
let entry = 0; // each sign-in and each start counts; a start overtaken by a newer one draws nothing

// A link that logs in carries the token in its fragment (#token=...), which no server sees; it is
// kept for this tab only and taken out of the address bar at once. A link never swaps the token
// this tab already signed in with unless its user says so. Answers why the token form is needed,
// or null.
function takeTokenFromFragment() {
  if (!location.hash.startsWith("#token=")) return null;
  const raw = location.hash.slice("#token=".length);
  history.replaceState(null, "", `${location.pathname}${location.search}#/runs`);
  let value;
  try {
    value = decodeURIComponent(raw).trim();
  } catch (error) {
    if (!(error instanceof URIError)) throw error;
    return "The link's token is not valid (it was cut or mangled); paste the token instead.";
  }
  const held = token.get();
  if (!value || value === held) return null;
  if (held && !confirm("This link signs in with another token, maybe as another user. Sign in with it instead of the one this tab uses?")) return null;
  token.set(value);
  return null;
}

// Takes a sign-in link's token; asks for one when the link's was unusable.
function enter() {
  const problem = takeTokenFromFragment();
  if (problem) {
    session.me = null;
    return signIn(problem);
  }
  return start();
}

function signIn(reason) {
  entry += 1;
  stopPage();
  nav.hidden = true;
  replace(who);
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true, spellcheck: "false" });
  const form = h(
    "form",
    { class: "signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    reason ? message("error", reason) : null,
    h("p", {}, "Paste an API token (", h("code", {}, "runplane dev"), " prints a link that signs in directly)."),
    h("label", { for: "token" }, "Token"),
    input,
    h("button", { type: "submit" }, "Sign in"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    token.set(input.value.trim());
    start();
  });
  replace(main, form);
  input.focus();
}

function stopPage() {
  if (leave) leave();
  leave = null;
}

const routes = [
  [/^\/runs\/([^/?]+)$/, (m) => runPage(main, decodeURIComponent(m[1]), session)],
  [/^\/runs$/, () => runsPage(main, session)],
  [/^\/sweeps\/([^/?]+)$/, (m) => sweepPage(main, decodeURIComponent(m[1]), session)],
  [/^\/sweeps$/, () => sweepsPage(main, session)],
  [/^\/pools$/, () => poolsPage(main, session)],
  [/^\/usage$/, () => usagePage(main, session)],
];

function show() {
  if (!token.get()) return signIn();
  const path = (location.hash.slice(1) || "/runs").split("?")[0];
  stopPage();
  const page = path.split("/")[1] || "runs";
  for (const link of nav.querySelectorAll("a")) {
    if (link.dataset.page === page) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  for (const [pattern, render] of routes) {
    const match = pattern.exec(path);
    if (match) {
      document.title = `${nav.querySelector(`[data-page="${page}"]`)?.textContent || "runplane"} · runplane`;
      keepFocus(main, () => {
        leave = render(match) || null;
      });
      return;
    }
  }
  replace(main, h("h1", {}, "Not found"), message("error", `There is no page ${path}.`), h("a", { href: "#/runs" }, "Runs"));
}

async function topBar() {
  replace(who, h("span", {}, session.me.user), session.admin ? h("span", { class: "tag" }, "admin") : null);
  try {
    const { quotas } = await get("/v1/quotas");
    const mine = quotas.find((q) => q.kind === "user" && q.name === session.me.user);
    if (!mine) return;
    const parts = [];
    if (mine.max_running !== null) parts.push(`running ${mine.usage.running}/${mine.max_running}`);
    if (mine.max_gpus !== null) parts.push(`GPUs ${mine.usage.gpus}/${mine.max_gpus}`);
    if (mine.gpu_hours !== null) parts.push(`GPU-h ${mine.usage.gpu_hours.toFixed(1)}/${mine.gpu_hours}`);
    if (mine.cpu_hours !== null) parts.push(`CPU-h ${mine.usage.cpu_hours.toFixed(1)}/${mine.cpu_hours}`);
    if (parts.length) who.append(h("a", { class: "quota", href: "#/usage", title: "your quota" }, parts.join(" · ")));
  } catch {
    // the quota is a courtesy on the top bar; the usage page says why it is missing
  }
}

async function start() {
  if (!token.get()) return signIn();
  const mine = ++entry;
  let me;
  try {
    me = await api("GET", "/v1/me");
  } catch (error) {
    if (error.status === 401 || mine !== entry) return; // the unauthorized listener asks again
    replace(main, message("error", `The API cannot be reached: ${error.message}`));
    return;
  }
  if (mine !== entry) return;
  session.me = me;
  session.admin = session.me.scopes.includes("admin");
  nav.hidden = false;
  topBar();
  show();
}

window.addEventListener("runplane:unauthorized", (event) => {
  token.clear();
  signIn(`The token was refused: ${event.detail.message}`);
});
window.addEventListener("hashchange", () => {
  if (location.hash.startsWith("#token=")) {
    enter();
    return;
  }
  if (session.me) show();
});

enter();
