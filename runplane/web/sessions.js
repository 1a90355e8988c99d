// A running run's sessions: the commands that open a shell in it, run a command in it or forward a
// port to it (docs/sessions.md), shown to whoever may open one, ready to copy.
import { get } from "./api.js";
import { h, replace } from "./dom.js";

// What a pool allows when the server does not tell (one before 0.3): its defaults.
const DEFAULTS = { allow_exec: true, allow_admin_exec: false };

// The [what, command] pairs `me` may use on `run`, whose pool is `pool` (a pool view; null: the
// pool is not listed): none unless the run is running and its pool allows sessions (and at least
// one at a time), and then only for its owner, or an admin where the pool lets admins in (the API
// answers 404 to anyone else). An interactive run's own command is joined with attach. The exec
// shown needs nothing but a shell and ls: what the run wrote to its outputs so far.
export function sessionCommands(run, me, pool) {
  if (!run || run.state !== "running" || !me || !pool) return [];
  const rules = pool.sessions || DEFAULTS;
  const admin = (me.scopes || []).includes("admin");
  if (!rules.allow_exec || rules.max_sessions_per_run === 0) return [];
  if (!(run.owner === me.user || (admin && rules.allow_admin_exec))) return [];
  const attach = run.spec && run.spec.interactive ? [["Attach", `runplane attach ${run.id}`]] : [];
  return attach.concat([
    ["Open a shell", `runplane shell ${run.id}`],
    ["Exec", `runplane exec ${run.id} -- sh -c 'ls -la "$RUNPLANE_OUTPUT"'`],
    ["Port-forward", `runplane port-forward ${run.id} 8000`],
  ]);
}

// The pools, read once per page (null until read, or when they could not be).
export function poolReader(onRead) {
  let pools = null;
  let asked = false;
  return (name) => {
    if (!asked) {
      asked = true;
      get("/v1/pools")
        .then((page) => {
          pools = page.pools;
          onRead();
        })
        .catch(() => {}); // no commands shown: nothing else on the page depends on them
    }
    return pools && (pools.find((p) => p.name === name) || null);
  };
}

async function copy(text, said) {
  try {
    await navigator.clipboard.writeText(text);
    replace(said, "Copied.");
  } catch {
    replace(said, "Select the command and copy it.");
  }
}

// The section, or null when there is nothing `me` may open.
export function sessionsBox(run, me, pool) {
  const commands = sessionCommands(run, me, pool);
  if (!commands.length) return null;
  const said = h("span", { class: "hint", "aria-live": "polite" });
  return h(
    "section",
    { class: "sessions", "aria-labelledby": "h-sessions" },
    h("h2", { id: "h-sessions" }, "Open a shell"),
    h("p", { class: "hint" }, "Into the running run's container, from a terminal with the runplane CLI signed in as you:"),
    h(
      "dl",
      { class: "facts" },
      commands.map(([what, command]) => [
        h("dt", {}, what),
        h("dd", {}, h("code", { "data-command": what }, command), " ", h("button", { type: "button", class: "copy", "aria-label": `Copy: ${command}`, onclick: () => copy(command, said) }, "Copy")),
      ]),
    ),
    said,
  );
}
