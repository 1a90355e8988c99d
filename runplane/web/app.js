// The dashboard's entry: sign-in by token, the top bar, and routing between pages by the hash.
import { api, get, token } from "./api.js";
import { h, keepFocus, message, replace } from "./dom.js";
import { poolsPage } from "./pools.js";
import { runPage } from "./run.js";
import { runsPage } from "./runs.js";
import { secretsPage } from "./secrets.js";
import { sweepPage, sweepsPage } from "./sweeps.js";
import { usagePage } from "./usage.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
const session = { me: null, admin: false };
let leave = null; // what the page on screen stops (timers) when another is shown
let entry = 0; // each sign-in and each start counts; a start overtaken by a newer one draws nothing

// A link that signs in carries the token in its fragment (#token=...), which no server sees; it is
// taken out of the address bar at once. It signs in only once the tab's user agrees, on a page
// that shows whom the token acts for: a link someone else sent would otherwise sign this tab in
// as them, and what the user then submits or uploads would be theirs (login CSRF). Answers the
// link's token, waiting for that answer; a reason the token form is needed; or nothing.
function takeTokenFromFragment() {
  if (!location.hash.startsWith("#token=")) return {};
  const raw = location.hash.slice("#token=".length);
  history.replaceState(null, "", `${location.pathname}${location.search}#/runs`);
  let value;
  try {
    value = decodeURIComponent(raw).trim();
  } catch (error) {
    if (!(error instanceof URIError)) throw error;
    return { problem: "The link's token is not valid (it was cut or mangled); paste the token instead." };
  }
  if (!value || value === token.get()) return {};
  return { offered: value };
}

// Takes a sign-in link's token once its user agrees; asks for one when the link's was unusable.
function enter() {
  const { problem, offered } = takeTokenFromFragment();
  if (problem) {
    session.me = null;
    return signIn(problem);
  }
  if (offered) return offerLink(offered);
  return start();
}

// Shows whom a link's token acts for, and signs in with it only on a click.
async function offerLink(offered) {
  const mine = ++entry;
  const held = token.get();
  stopPage();
  nav.hidden = true;
  replace(who);
  replace(main, h("p", {}, "Loading…"));
  const current = held ? api("GET", "/v1/me", { bearer: held }).then((me) => me.user, () => null) : null;
  let them;
  try {
    them = await api("GET", "/v1/me", { bearer: offered });
  } catch (error) {
    if (mine !== entry) return;
    if (error.status !== 401) {
      replace(main, message("error", `The API cannot be reached: ${error.message}`));
      return;
    }
    if (token.get()) return start();
    session.me = null;
    return signIn(`The link's token was refused: ${error.message}`);
  }
  const now = await current;
  if (mine !== entry) return;
  const accept = h("button", { type: "submit" }, `Sign in as ${them.user}`);
  const refuse = h("button", { type: "button" }, held ? `Stay signed in${now ? ` as ${now}` : ""}` : "Cancel");
  const form = h(
    "form",
    { class: "signin", "aria-labelledby": "link-title" },
    h("h1", { id: "link-title" }, "Sign in with this link?"),
    h(
      "p",
      {},
      "The link signs in as ",
      h("strong", { id: "link-user" }, them.user),
      them.scopes.includes("admin") ? " (an admin)" : "",
      ".",
    ),
    now ? h("p", {}, "This tab is signed in as ", h("strong", {}, now), ".") : null,
    h("p", {}, "Use only a link you asked for: a link from someone else signs you in as them, and what you submit is theirs."),
    h("div", { class: "actions" }, accept, refuse),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    accept.blur(); // the pages start as on a fresh load, not from a button they do not have
    token.set(offered);
    start();
  });
  refuse.addEventListener("click", () => (token.get() ? start() : signIn()));
  replace(main, form);
  accept.focus();
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
    h("p", {}, "Paste an API token (", h("code", {}, "runplane dev"), " prints a link that signs in with one click)."),
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
  [/^\/secrets$/, () => secretsPage(main, session)],
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
