// One run: its state and why, where its time went, what it asked for and used, its inputs,
// outputs and logs (followed live, searchable), how long they are kept, and kill / retry / keep.
import { get, post } from "./api.js";
import { checkpointPanel } from "./checkpoint.js";
import { badge, bytes, duration, h, keepFocus, message, refresher, replace, runLink, safeHref, say, seconds, svg, TERMINAL, table, when } from "./dom.js";
import { OWNER_RETRIES, RETRY_MEANS, resubmit, retryable, unsuccessful } from "./runs.js";
import { runSecrets } from "./secrets.js";
import { poolReader, sessionsBox } from "./sessions.js";

const REFRESH_MS = 1500;
const WAIT_S = 20; // the longest the API holds a read of the run until it changes
const LOG_MS = 1000;
const LOG_IDLE_MS = 8000; // the longest wait between log reads that found nothing new
const MAX_LOG = 4 * 1024 * 1024; // characters kept per stream; older ones are dropped

// The phases of the run from its state changes: [name, start, end] in seconds since submit.
export function phases(run, now = Date.now()) {
  const t0 = new Date(run.created_at).getTime();
  const marks = run.events.filter((e) => e.state).map((e) => [e.state, new Date(e.at).getTime()]);
  const out = [];
  marks.forEach(([state, at], i) => {
    if (TERMINAL.includes(state)) return;
    const end = i + 1 < marks.length ? marks[i + 1][1] : run.finished_at ? new Date(run.finished_at).getTime() : now;
    out.push([state, (at - t0) / 1000, (Math.max(end, at) - t0) / 1000]);
  });
  return out;
}

function waterfall(run) {
  const rows = phases(run);
  let at = 0; // the worker's steps, one after another from submit
  const steps = Object.entries(run.usage.timings || {}).map(([name, secs]) => [name, at, (at += secs), "timing"]);
  const total = Math.max(0.001, at, ...rows.map((r) => r[2]));
  const width = 640;
  const left = 110;
  const rowH = 22;
  const lines = [...rows.map(([name, a, b]) => [name, a, b, "phase"]), ...steps];
  const height = lines.length * rowH + 24;
  const x = (s) => left + (s / total) * (width - left - 80);
  const drawing = svg(
    "svg",
    { viewBox: `0 0 ${width} ${height}`, class: "waterfall", role: "img", "aria-label": "Where the run's time went" },
    lines.map(([name, a, b, kind], i) => {
      const y = i * rowH + 4;
      return svg(
        "g",
        { class: `bar ${kind} state-${name}` },
        svg("text", { x: 4, y: y + 14, class: "label" }, kind === "timing" ? `· ${name}` : name),
        svg("rect", { x: x(a), y, width: Math.max(2, x(b) - x(a)), height: rowH - 6, rx: 3 }),
        svg("text", { x: x(b) + 6, y: y + 14, class: "value" }, seconds(b - a)),
      );
    }),
    svg("line", { x1: left, x2: left, y1: 0, y2: height - 20, class: "axis" }),
    svg("text", { x: left, y: height - 6, class: "value" }, "submitted"),
    svg("text", { x: width - 80, y: height - 6, class: "value" }, `+${seconds(total)}`),
  );
  return h(
    "section",
    { "aria-labelledby": "h-time" },
    h("h2", { id: "h-time" }, "Where the time went"),
    rows.length ? drawing : h("p", {}, "No state changes yet."),
    h("p", { class: "hint" }, "Bars are the run's states from its timeline; rows marked · are the worker's measured steps, laid end to end."),
  );
}

function resources(run) {
  const r = run.spec.resources || {};
  const u = run.usage;
  const ran = duration(run);
  const cpusUsed = u.cpu_seconds !== null && ran ? (u.cpu_seconds / ran).toFixed(2) : "–";
  const rows = [
    ["CPUs", r.cpus ?? "pool default", `${cpusUsed} on average (${seconds(u.cpu_seconds)} CPU time)`],
    ["GPUs", r.gpus ?? 0, u.gpu_seconds !== null ? `${seconds(u.gpu_seconds)} GPU time` : "–"],
    ["Memory", r.memory ? bytes(r.memory) : "pool default", `${bytes(u.memory_peak)} peak`],
    ["Disk", r.disk ? bytes(r.disk) : "pool default", bytes(u.disk)],
    ["Time", r.time ? seconds(r.time) : "pool default", seconds(ran)],
    ["Cost", "", u.cost === null ? "–" : u.cost.toFixed(4)],
  ];
  return h(
    "section",
    { "aria-labelledby": "h-res" },
    h("h2", { id: "h-res" }, "Resources: asked and used"),
    table(["", "Asked", "Used"], rows.map((cells) => h("tr", {}, h("th", { scope: "row" }, cells[0]), h("td", {}, cells[1]), h("td", {}, cells[2])))),
  );
}

// The pools a run may run on, in order (its queue, then its fallback), the one it is on now marked;
// it moves on, never back (docs/scheduling.md). A run without fallback: its pool's name.
export function poolChain(run) {
  const rest = run.spec.fallback || [];
  if (!rest.length) return run.queue;
  const chain = [run.spec.queue || run.queue, ...rest];
  const at = chain.indexOf(run.queue);
  const rules = [];
  if (run.spec.fallback_after) rules.push(`if not started within ${seconds(run.spec.fallback_after)}`);
  if (run.spec.fallback_after_preemptions) rules.push(`after ${run.spec.fallback_after_preemptions} preemption(s) there`);
  const last = at === chain.length - 1;
  const facts = [];
  if (!last && run.spec.fallback_after_preemptions && run.preemptions)
    facts.push(`preempted ${run.preemptions} of ${run.spec.fallback_after_preemptions} time(s) on ${run.queue}`);
  if (!last && run.state === "queued" && run.fallback_at) facts.push("next move at ", when(run.fallback_at));
  return h(
    "span",
    { class: "pools" },
    h(
      "ol",
      { class: "pool-chain", "aria-label": "Pools in order" },
      chain.map((name, i) =>
        h(
          "li",
          { class: i === at ? "now" : i < at ? "left" : "next", "aria-current": i === at ? "true" : null },
          name,
          i === at ? " (now)" : i < at ? " (left)" : "",
        ),
      ),
    ),
    rules.length && !last ? h("span", { class: "hint" }, `moves to the next pool ${rules.join(" or ")}`) : null,
    facts.length ? h("span", { class: "hint" }, "; ", ...facts) : null,
  );
}

// Its timeline, oldest first: state changes and what happened besides (a restore, a move to a pool).
function timeline(run) {
  return h(
    "section",
    { "aria-labelledby": "h-ev" },
    h("h2", { id: "h-ev" }, "Timeline"),
    h("ul", { class: "timeline" }, run.events.map((e) => h("li", {}, when(e.at), " ", e.state ? [badge(e.state), " "] : null, e.message))),
  );
}

// a run: input links to that run, an http(s) address to itself; anything else is only text
function sourceLink(source) {
  const m = /^run:([^/]+)(.*)$/.exec(source);
  if (m) return h("span", {}, runLink(m[1], `run:${m[1]}`), m[2]);
  const up = /^upload:([0-9a-f]{64})$/.exec(source);
  if (up) return h("span", { title: source }, "upload ", h("code", {}, `${up[1].slice(0, 12)}…`), ", read-only");
  const href = safeHref(source);
  return href ? h("a", { href, rel: "noreferrer" }, source) : h("code", {}, source);
}

// an output's download link, when its address is an http(s) one; else its path as text
function outputLink(file) {
  const href = safeHref(file.url);
  return href ? h("a", { href, download: file.path.split("/").pop(), rel: "noreferrer" }, file.path) : h("code", {}, file.path);
}

// what a run waits for: a run id, or sweep:<id>
function waitLink(id) {
  return id.startsWith("sweep:") ? h("a", { href: `#/sweeps/${encodeURIComponent(id.slice(6))}` }, id) : runLink(id);
}

function links(run) {
  const inputs = Object.entries(run.spec.inputs || {});
  const after = run.spec.after || [];
  return h(
    "section",
    { "aria-labelledby": "h-in" },
    h("h2", { id: "h-in" }, "Inputs and dependencies"),
    inputs.length
      ? h("ul", {}, inputs.map(([path, source]) => h("li", {}, h("code", {}, path), " ← ", sourceLink(source))))
      : h("p", {}, "No inputs."),
    after.length ? h("p", {}, "Starts after: ", after.map((id, i) => [i ? ", " : "", runLink(id)])) : null,
    run.spec.after_sweep ? h("p", {}, "Starts after sweep ", h("a", { href: `#/sweeps/${encodeURIComponent(run.spec.after_sweep)}` }, run.spec.after_sweep)) : null,
    run.waiting_on.length ? h("p", {}, "Still waiting on: ", run.waiting_on.map((id, i) => [i ? ", " : "", waitLink(id)])) : null,
  );
}

// A stream's log, read from `start()` on (not while the run waits in its queue); reads that find
// nothing new come further apart, up to LOG_IDLE_MS, and errors make them wait longer still.
function logView(runId, stream, attempt, gone) {
  let offset = 0;
  let text = "";
  let idle = 0; // reads in a row that found nothing new
  let started = false;
  const pre = h("pre", { class: "log", tabindex: "0", "aria-label": `${stream} of the run` });
  const search = h("input", { type: "search", id: `search-${stream}`, onchange: draw, oninput: draw });
  const follow = h("input", { type: "checkbox", id: `follow-${stream}`, checked: true });
  const state = h("span", { class: "hint" });

  function draw() {
    const needle = search.value.toLowerCase();
    if (!needle) pre.textContent = text;
    else {
      const lines = text.split("\n").filter((line) => line.toLowerCase().includes(needle));
      pre.textContent = lines.join("\n");
      state.textContent = `${lines.length} matching line(s)`;
    }
    if (follow.checked) pre.scrollTop = pre.scrollHeight;
  }

  const loop = refresher(
    async (current) => {
      const page = await get(`/v1/runs/${encodeURIComponent(runId)}/logs`, { stream, offset, attempt });
      if (!current()) return undefined;
      if (page.data) {
        text = (text + page.data).slice(-MAX_LOG);
        offset = page.next_offset;
        draw();
      }
      idle = page.data ? 0 : idle + 1;
      if (!search.value) state.textContent = page.complete ? (!text && gone()) || "complete" : "following…";
      return page.complete ? false : Math.min(LOG_IDLE_MS, LOG_MS * 2 ** Math.min(idle, 8));
    },
    { every: LOG_MS, onError: (error) => (state.textContent = error.message) },
  );
  state.textContent = "waiting for the run to start…";
  const node = h(
    "section",
    { class: "logbox", "aria-labelledby": `h-${stream}` },
    h("h3", { id: `h-${stream}` }, stream),
    h(
      "div",
      { class: "log-tools" },
      h("label", { for: `search-${stream}` }, "Search"),
      search,
      h("span", { class: "check" }, follow, h("label", { for: `follow-${stream}` }, "Follow")),
      state,
    ),
    pre,
  );
  return {
    node,
    start() {
      if (started) return;
      started = true;
      loop.now();
    },
    stop: () => loop.stop(),
  };
}

async function outputs(runId, box, attempt, gone) {
  try {
    const page = await get(`/v1/runs/${encodeURIComponent(runId)}/outputs`, { attempt });
    replace(
      box,
      page.files.length
        ? h("ul", { class: "outputs" }, page.files.map((f) => h("li", {}, outputLink(f), ` (${bytes(f.size)})`)))
        : h("p", {}, page.complete ? gone() || "No outputs." : "None yet."),
      page.next_cursor ? h("p", { class: "hint" }, "More files than shown; list them with the CLI.") : null,
    );
    return page.complete;
  } catch (error) {
    replace(box, message("error", error.message));
    return true;
  }
}

const KEEP_MEANS = "Keep its outputs, logs and record until you let it go: its pool's retention deletes none of them.";
const LET_GO_MEANS = "Let it go: its pool's retention deletes its outputs, logs and record when they are due.";

// A retention date as the CLI says it too: YYYY-MM-DD HH:MM UTC.
export function utc(iso) {
  return `${new Date(iso).toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

function day(iso) {
  return h("time", { datetime: iso, title: iso }, utc(iso));
}

const PARTS = ["outputs", "logs", "record"];
const until = (kept, what) => kept[`${what}_until`];

// "Outputs deleted by retention on DATE." (logs likewise) for a run whose retention deleted them; else null.
export function deletedByRetention(run, what) {
  const kept = run.retention;
  if (!kept || !kept.deleted.includes(what)) return null;
  const at = until(kept, what);
  return `${what[0].toUpperCase()}${what.slice(1)} deleted by retention${at ? ` on ${utc(at)}` : ""}.`;
}

// How long the run's outputs, logs and record are kept ("–": it has not ended and is not kept).
export function keptUntil(run) {
  const kept = run.retention;
  if (!kept) return "–";
  const gone = ["outputs", "logs"].filter((what) => kept.deleted.includes(what));
  if (kept.kept) return `kept, until you let it go${gone.length ? ` (${gone.join(" and ")} already deleted)` : ""}`;
  if (PARTS.every((what) => !kept.deleted.includes(what) && !until(kept, what))) return "kept for good";
  const parts = PARTS.map((what) => {
    const at = until(kept, what);
    if (kept.deleted.includes(what)) return at ? [`${what} deleted on `, day(at)] : `${what} deleted`;
    return at ? [`${what} until `, day(at)] : `${what} kept for good`;
  });
  return h("span", { class: "retention" }, parts.flatMap((part, i) => (i ? [" · ", part] : [part])));
}

// What letting a kept run go deletes, and when: each part left with its date ("now" once it has
// passed: at the sweep's next pass), for the confirm before it.
export function letGoMeans(run, now = Date.now()) {
  const kept = run.retention;
  const going = PARTS.filter((what) => !kept.deleted.includes(what) && until(kept, what));
  if (!going.length) return "Its pool's retention keeps it for good: nothing of it will be deleted.";
  const when = (what) => (new Date(until(kept, what)).getTime() <= now ? "now" : `on ${utc(until(kept, what))}`);
  return `Its pool's retention then deletes its ${going.map((what) => `${what} ${when(what)}`).join(", ")}.`;
}

export function runPage(main, runId, session) {
  let logs = null;
  let outputsDone = false;
  let outputsState = null; // the run's state when its outputs were last read
  const head = h("div", {});
  const details = h("div", {});
  const outputsBox = h("div", {}, "Loading…");
  const notice = h("div", { class: "notice", "aria-live": "polite" });
  const logsBox = h("div", { class: "logs" });
  const killButton = h("button", { type: "button", class: "danger", onclick: kill }, "Kill");
  const retryButton = h("button", { type: "button", title: RETRY_MEANS, onclick: retry }, "Retry");
  const keepButton = h("button", { type: "button", title: KEEP_MEANS, onclick: keep }, "Keep");
  const gone = (what) => () => current && deletedByRetention(current, what);
  let current = null;
  const poolOf = poolReader(() => current && keepFocus(main, draw)); // for its sessions' rules
  let logsAttempt = null; // the attempt the log views show (its number, even when "latest" was asked)
  const checkpoint = checkpointPanel(runId);
  const attemptSelect = h("select", { id: "attempt", onchange: () => showAttempt() }, h("option", { value: "" }, "latest"));

  // Logs and outputs of the attempt chosen; "latest" follows a run that is tried again.
  function showAttempt() {
    for (const l of logs || []) l.stop();
    const chosen = attemptSelect.value ? Number(attemptSelect.value) : undefined;
    logsAttempt = chosen ?? current.attempt;
    logs = [logView(runId, "stdout", chosen, gone("logs")), logView(runId, "stderr", chosen, gone("logs"))];
    replace(logsBox, logs.map((l) => l.node));
    startLogs();
    outputsDone = false;
    outputsState = current.state;
    replace(outputsBox, "Loading…");
    outputs(runId, outputsBox, chosen, gone("outputs")).then((done) => {
      outputsDone = done;
    });
  }

  // an attempt has logs once its run leaves the queue; an earlier attempt has them already
  function startLogs() {
    const chosen = attemptSelect.value ? Number(attemptSelect.value) : current.attempt;
    if (current.state !== "queued" || chosen < current.attempt) for (const l of logs) l.start();
  }

  function attemptOptions(run) {
    if (attemptSelect.options.length === run.attempt + 1) return;
    const value = attemptSelect.value;
    replace(attemptSelect, h("option", { value: "" }, "latest"), Array.from({ length: run.attempt }, (_, i) => h("option", { value: i + 1 }, `${i + 1}`)));
    attemptSelect.value = value;
  }

  replace(main, h("p", {}, "Loading…"));

  async function kill() {
    if (!confirm(`Kill run ${runId}?`)) return;
    try {
      current = await post(`/v1/runs/${encodeURIComponent(runId)}/kill`);
      replace(notice, message("ok", "Kill asked for."));
      keepFocus(main, draw);
    } catch (error) {
      replace(notice, message("error", error.message));
    }
  }

  async function keep() {
    const keeping = !current.retention?.kept;
    if (!keeping && !confirm(`Let run ${runId} go? ${letGoMeans(current)}`)) return;
    try {
      current = await post(`/v1/runs/${encodeURIComponent(runId)}/keep`, { keep: keeping });
      replace(notice, message("ok", keeping ? "Kept until you let it go." : "Let go: its pool's retention applies."));
      keepFocus(main, draw);
    } catch (error) {
      replace(notice, message("error", error.message));
    }
  }

  async function retry() {
    if (!confirm(`Retry run ${runId}? ${RETRY_MEANS}`)) return;
    try {
      const made = await resubmit(current);
      location.hash = `#/runs/${encodeURIComponent(made.id)}`;
    } catch (error) {
      replace(notice, message("error", error.message));
    }
  }

  function draw() {
    const run = current;
    const ended = TERMINAL.includes(run.state);
    killButton.disabled = ended || run.kill_requested;
    retryButton.disabled = !retryable(run, session);
    retryButton.title = unsuccessful(run) && !retryable(run, session) ? OWNER_RETRIES : RETRY_MEANS;
    replace(keepButton, run.retention?.kept ? "Let go" : "Keep");
    keepButton.title = run.retention?.kept ? LET_GO_MEANS : KEEP_MEANS;
    const reason = run.failure
      ? `${run.failure.reason}: ${run.failure.message}`
      : run.state === "queued"
        ? run.waiting_reason || (run.waiting_on.length ? `waiting on ${run.waiting_on.join(", ")}` : "")
        : "";
    replace(
      head,
      h("h1", {}, run.name || "(no name)", " ", badge(run.state)),
      h("p", { class: "id" }, h("code", {}, run.id)),
      reason ? h("p", { class: `reason ${run.failure ? "failed" : ""}` }, reason) : null,
      h("div", { class: "actions" }, killButton, retryButton, keepButton),
      retryable(run, session) ? h("p", { class: "hint" }, RETRY_MEANS) : unsuccessful(run) ? h("p", { class: "hint" }, OWNER_RETRIES) : null,
    );
    const facts = [
      ["Owner", run.owner],
      ["Queue", poolChain(run)],
      ["Group", run.group || "–"],
      ["Priority", run.priority],
      ["Attempt", `${run.attempt} of ${run.max_attempts}`],
      ["Worker", run.worker_id || "–"],
      ["Exit code", run.exit_code ?? "–"],
      ["Image", run.spec.image || "pool default"],
      ["Command", h("code", {}, run.spec.command)],
      ["Working directory", run.spec.workdir ? h("code", {}, run.spec.workdir) : "image default"],
      ["Created", when(run.created_at)],
      ["Started", when(run.started_at)],
      ["Finished", when(run.finished_at)],
      ["Retention", keptUntil(run)],
      ["Sweep", run.sweep_id ? h("a", { href: `#/sweeps/${encodeURIComponent(run.sweep_id)}` }, `${run.sweep_id} #${run.sweep_index}`) : "–"],
    ];
    checkpoint.update(run);
    replace(
      details,
      h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      run.state === "running" ? sessionsBox(run, session.me, poolOf(run.queue)) : null,
      checkpoint.node.hidden ? null : checkpoint.node,
      waterfall(run),
      resources(run),
      links(run),
      runSecrets(run.spec),
      timeline(run),
    );
  }

  // one loop; a reply overtaken by a newer read (after a kill) is dropped. While the run goes,
  // each read is answered as soon as it changes (wait, since); one that comes back unchanged at
  // once is from a stack that does not wait, read again after REFRESH_MS
  async function step(isCurrent) {
    let run;
    const since = current && !TERMINAL.includes(current.state) ? current.revision : "";
    const asked = Date.now();
    try {
      run = await get(`/v1/runs/${encodeURIComponent(runId)}`, since ? { wait: WAIT_S, since } : undefined);
    } catch (error) {
      if (error.status !== 404) throw error;
      if (isCurrent()) replace(main, h("h1", {}, "Run not found"), message("error", error.message), h("a", { href: "#/runs" }, "Back to runs"));
      return false;
    }
    if (!isCurrent()) return undefined;
    current = run;
    if (notice.firstElementChild?.dataset.kind === "error") replace(notice); // read again: the error is over
    if (!logs) {
      showAttempt();
      replace(
        main,
        head,
        notice,
        details,
        h("div", { class: "filters" }, h("label", { for: "attempt" }, "Attempt"), attemptSelect),
        h("section", { "aria-labelledby": "h-out" }, h("h2", { id: "h-out" }, "Outputs"), outputsBox),
        h("section", { "aria-labelledby": "h-logs" }, h("h2", { id: "h-logs" }, "Logs"), logsBox),
      );
    } else if (!attemptSelect.value && current.attempt !== logsAttempt) {
      showAttempt(); // tried again: the latest attempt's logs start from their beginning
    } else startLogs();
    attemptOptions(current);
    keepFocus(main, draw);
    // outputs appear as a run uploads: read again when its state moves, until it has ended
    if (!outputsDone && current.state !== outputsState) {
      outputsState = current.state;
      outputsDone = await outputs(runId, outputsBox, attemptSelect.value || undefined, gone("outputs"));
    }
    if (TERMINAL.includes(current.state) && outputsDone) return false;
    const waited = since && (current.revision !== since || Date.now() - asked >= REFRESH_MS);
    return waited && !TERMINAL.includes(current.state) ? 0 : undefined;
  }
  const loop = refresher(step, {
    every: REFRESH_MS,
    onError: (error) => {
      if (!logs) replace(main, notice);
      say(notice, "error", error.message);
    },
  });

  loop.now();
  return () => {
    loop.stop();
    checkpoint.stop();
    for (const l of logs || []) l.stop();
  };
}
