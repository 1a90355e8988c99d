// Runs: the caller's runs (an admin: any user's), filtered by what the URL holds, refreshed live.
import { get, post } from "./api.js";
import { badge, duration, h, hashQuery, keepFocus, message, refresher, replace, runLink, say, seconds, setHashQuery, STATES, TERMINAL, when } from "./dom.js";

const PAGE = 50;
const MAX_MATCHING = 5000;
const AT_ONCE = 8; // requests in flight at once for a bulk action
const REFRESH_MS = 2000;

function reasonOf(run) {
  if (run.failure) return `${run.failure.reason}: ${run.failure.message}`;
  if (run.state === "queued") return run.waiting_reason || (run.waiting_on.length ? `waiting on ${run.waiting_on.join(", ")}` : "");
  return "";
}

// The run's spec, submitted again as a new run by the one signed in (what "retry" means): the new
// run is not linked to the first and is no member of its sweep.
export function resubmit(run) {
  return post("/v1/runs", run.spec);
}

// Only a run that ended without succeeding (failed, killed, timed out) is tried again.
export const unsuccessful = (run) => TERMINAL.includes(run.state) && run.state !== "succeeded";
// A retry is a new run of the one who asks, charged to them and run with their groups: another
// user's run (an admin sees them all) is retried by its owner only, never made the admin's.
export const yours = (run, session) => run.owner === session.me.user;
export const retryable = (run, session) => unsuccessful(run) && yours(run, session);
export const RETRY_MEANS = "A retry submits the same spec again as a new run of yours: it is not linked to the original and is not a member of its sweep.";
export const OWNER_RETRIES = "Only its owner can retry another user's run: a retry would submit it again as a run of yours.";

// The filters in words, for a question that asks before acting on what they choose.
export function describeFilters(filters) {
  const parts = [];
  if (filters.state) parts.push(`state ${filters.state}`);
  if (filters.queue) parts.push(`queue ${filters.queue}`);
  if (filters.sweep) parts.push(`sweep ${filters.sweep}`);
  if (filters.owner) parts.push(`owner ${filters.owner}`);
  if (filters.name) parts.push(`name containing "${filters.name}"`);
  if (filters.failed) parts.push("failed only");
  return parts.length ? parts.join(", ") : "no filter";
}

export function runsPage(main, session) {
  const params = hashQuery();
  const filters = {
    state: params.get("state") || "",
    queue: params.get("queue") || "",
    sweep: params.get("sweep") || "",
    name: params.get("name") || "",
    failed: params.get("failed") === "1",
    owner: params.get("owner") || "",
  };
  // a sweep is read whole (its members share one owner and queue): the sweep wins and the others are let go,
  // in the URL too, so the page never shows a filter it does not apply
  let dropped = "";
  if (filters.sweep && (filters.owner || filters.queue)) {
    dropped = `The sweep filter cannot be combined with ${[filters.owner ? "owner" : "", filters.queue ? "queue" : ""].filter(Boolean).join(" or ")}; showing the whole sweep.`;
    filters.owner = "";
    filters.queue = "";
    const clean = new URLSearchParams(params);
    clean.delete("owner");
    clean.delete("queue");
    history.replaceState(null, "", `#/runs?${clean}`);
  }
  const cursors = [null]; // the cursor of each page seen, for going back
  let page = null;
  let nextCursor = null;
  const selected = new Map(); // id -> the run as it was shown when ticked

  const status = h("div", { class: "status-line" });
  const notice = h("div", { class: "notice", "aria-live": "polite" });
  const body = h("tbody", {}, h("tr", {}, h("td", { colspan: 10 }, "Loading…")));
  const pager = h("div", { class: "pager" });
  const killButton = h("button", { type: "button", disabled: true, onclick: () => bulkSelected("kill") }, "Kill selected");
  const retryButton = h("button", { type: "button", disabled: true, title: RETRY_MEANS, onclick: () => bulkSelected("retry") }, "Retry selected");
  const killAll = h("button", { type: "button", class: "danger", onclick: () => everyMatching("kill") }, "Kill all matching");
  // an admin's filter on another user's runs matches no run the admin may retry
  const theirs = Boolean(filters.owner) && filters.owner !== session.me.user;
  const retryAll = h("button", { type: "button", disabled: theirs, title: theirs ? OWNER_RETRIES : RETRY_MEANS, onclick: () => everyMatching("retry") }, "Retry all matching");
  const all = h("input", { type: "checkbox", "aria-label": "Select every run shown", disabled: true, onchange: () => selectAll(all.checked) });

  function update(key, value) {
    const next = new URLSearchParams();
    const chosen = { ...filters, [key]: value };
    if (chosen.sweep) Object.assign(chosen, { owner: "", queue: "" }); // the API takes a sweep alone
    for (const [k, v] of Object.entries(chosen)) {
      if (k === "failed") {
        if (v) next.set(k, "1");
      } else if (v) next.set(k, v);
    }
    setHashQuery("/runs", next);
  }

  const stateSelect = h(
    "select",
    { id: "f-state", onchange: () => update("state", stateSelect.value) },
    h("option", { value: "" }, "any"),
    STATES.map((s) => h("option", { value: s }, s)),
  );
  stateSelect.value = filters.state;
  const queueSelect = h("select", { id: "f-queue", disabled: !!filters.sweep, title: filters.sweep ? "not with a sweep" : null, onchange: () => update("queue", queueSelect.value) }, h("option", { value: "" }, "any"));
  if (filters.queue) queueSelect.append(h("option", { value: filters.queue }, filters.queue));
  queueSelect.value = filters.queue;
  get("/v1/pools")
    .then(({ pools }) => {
      for (const pool of pools) if (pool.name !== filters.queue) queueSelect.append(h("option", { value: pool.name }, pool.name));
    })
    .catch(() => {});
  const text = (id, key, label, list, disabled = false) => {
    const input = h("input", { id, type: "search", value: filters[key], list, disabled, title: disabled ? "not with a sweep" : null, onchange: () => update(key, input.value.trim()) });
    return [h("label", { for: id }, label), input];
  };
  // an admin picks the owner among the users that hold tokens
  const users = h("datalist", { id: "f-users" });
  if (session.admin) {
    get("/v1/tokens")
      .then(({ tokens }) => replace(users, [...new Set(tokens.map((t) => t.user))].sort().map((u) => h("option", { value: u }))))
      .catch(() => {});
  }
  const failed = h("input", { id: "f-failed", type: "checkbox", checked: filters.failed, onchange: () => update("failed", failed.checked) });

  const form = h(
    "form",
    { class: "filters", role: "search", onsubmit: (e) => e.preventDefault() },
    h("label", { for: "f-state" }, "State"),
    stateSelect,
    h("label", { for: "f-queue" }, "Queue"),
    queueSelect,
    text("f-sweep", "sweep", "Sweep"),
    text("f-name", "name", "Name"),
    session.admin ? [text("f-owner", "owner", "Owner", "f-users", !!filters.sweep), users] : null,
    h("span", { class: "check" }, failed, h("label", { for: "f-failed" }, "Failed only")),
  );

  // columns marked "wide" are left out on a narrow screen (the run's page has them all)
  const columns = [["", ""], ["Name", ""], ["Id", "wide"], ["State", ""], ["Queue", "wide"], session.admin ? ["Owner", "wide"] : null, ["Priority", "wide"], ["Created", "wide"], ["Duration", ""], ["Reason", ""]];
  const headers = columns.filter((x) => x !== null);
  const tableNode = h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "runs", "aria-label": "Runs" },
      h("thead", {}, h("tr", {}, headers.map(([t, cls], i) => h("th", { scope: "col", class: cls || null }, i === 0 ? all : t)))),
      body,
    ),
  );
  replace(
    main,
    h("h1", {}, "Runs"),
    form,
    h("div", { class: "actions" }, killButton, retryButton, killAll, retryAll),
    h("p", { class: "hint" }, RETRY_MEANS),
    notice,
    status,
    tableNode,
    pager,
  );

  // only the rows on screen: what the name and "failed only" filters hide is never chosen
  function selectAll(on) {
    selected.clear();
    if (on) for (const run of shown(page || [])) selected.set(run.id, run);
    render();
  }

  function shown(runs) {
    const name = filters.name.toLowerCase();
    return runs.filter((run) => (!filters.failed || run.failure) && (!name || (run.name || "").toLowerCase().includes(name)));
  }

  function row(run) {
    const box = h("input", {
      type: "checkbox",
      checked: selected.has(run.id),
      "aria-label": `Select ${run.name || run.id}`,
      onchange: () => {
        if (box.checked) selected.set(run.id, run);
        else selected.delete(run.id);
        buttons();
      },
    });
    const cells = [
      h("td", {}, box),
      h("td", { class: "name" }, runLink(run.id, run.name || "(no name)")),
      h("td", { class: "id wide" }, h("code", { title: run.id }, run.id.length > 16 ? `${run.id.slice(0, 14)}…` : run.id)),
      h("td", {}, badge(run.state)),
      h("td", { class: "wide" }, run.queue),
      session.admin ? h("td", { class: "wide" }, run.owner) : null,
      h("td", { class: "num wide" }, run.priority),
      h("td", { class: "when wide" }, when(run.created_at)),
      h("td", { class: "num" }, seconds(duration(run))),
      h("td", { class: "reason" }, reasonOf(run)),
    ];
    return h("tr", { "data-run": run.id, "data-state": run.state }, cells);
  }

  function buttons() {
    const runs = [...selected.values()];
    const live = runs.filter((r) => !TERMINAL.includes(r.state)).length;
    const again = runs.filter((r) => retryable(r, session)).length;
    killButton.disabled = live === 0;
    retryButton.disabled = again === 0;
    killButton.textContent = `Kill selected (${live})`;
    retryButton.textContent = `Retry selected (${again})`;
  }

  function render() {
    const runs = shown(page || []);
    // the selection follows the rows: a ticked run keeps its newest state, and one that left the
    // rows (it no longer matches) is no longer chosen
    const now = new Map(runs.map((run) => [run.id, run]));
    if (page !== null) for (const id of [...selected.keys()]) if (now.has(id)) selected.set(id, now.get(id)); else selected.delete(id);
    const empty = page === null ? "Loading…" : "No runs match.";
    keepFocus(body, () => replace(body, runs.length ? runs.map(row) : h("tr", {}, h("td", { colspan: headers.length }, empty))));
    all.checked = runs.length > 0 && runs.every((r) => selected.has(r.id));
    all.disabled = runs.length === 0; // nothing shown (or still loading): nothing to select
    buttons();
    keepFocus(pager, () =>
      replace(
        pager,
        h("button", { type: "button", disabled: cursors.length < 2, onclick: () => go(-1) }, "‹ Newer"),
        h("span", {}, `page ${cursors.length}`),
        h("button", { type: "button", disabled: !nextCursor, onclick: () => go(1) }, "Older ›"),
      ),
    );
  }

  function go(step) {
    if (step > 0) cursors.push(nextCursor);
    else cursors.pop();
    selected.clear(); // a selection is of the rows in sight; another page starts with none
    page = null; // drawn as "Loading…" until the page asked for arrives
    nextCursor = null; // known again with it
    render();
    loop.now();
  }

  // the API's own filters; name and "failed only" narrow what it sends (it has no such filter)
  function apiQuery(limit, cursor) {
    const query = { limit, cursor, state: filters.state };
    if (filters.sweep) query.sweep = filters.sweep;
    else Object.assign(query, { queue: filters.queue, owner: filters.owner });
    return query;
  }

  // one loop; the reply to a page left behind (paging on, a slow answer) is dropped
  const loop = refresher(
    async (current) => {
      const answer = await get("/v1/runs", apiQuery(PAGE, cursors[cursors.length - 1]));
      if (!current()) return;
      page = answer.runs;
      nextCursor = answer.next_cursor;
      replace(status, `Updated ${new Date().toLocaleTimeString()}`);
      render();
    },
    { every: REFRESH_MS, onError: (error) => say(status, "error", error.message) },
  );

  function bulkSelected(action) {
    const runs = [...selected.values()];
    const chosen = runs.filter(action === "kill" ? (r) => !TERMINAL.includes(r.state) : (r) => retryable(r, session));
    const skipped = runs.length - chosen.length;
    const why = action === "kill" ? "already ended" : "did not end without succeeding, or are other users' (only their owners retry them)";
    bulk(action, chosen, `selected on page ${cursors.length} (filters: ${describeFilters(filters)})${skipped ? `; ${skipped} other selected run(s) ${why} and are left alone` : ""}`);
  }

  // Every run the filters match, on every page, up to MAX_MATCHING runs read: kill takes those
  // that have not ended, retry those that ended without succeeding.
  async function everyMatching(action) {
    const found = [];
    let cursor = null;
    let read = 0;
    try {
      do {
        const answer = await get("/v1/runs", apiQuery(500, cursor));
        read += answer.runs.length;
        found.push(...shown(answer.runs));
        cursor = answer.next_cursor;
      } while (cursor && read < MAX_MATCHING);
    } catch (error) {
      replace(notice, message("error", error.message));
      return;
    }
    const capped = cursor ? ` Only the newest ${read} runs were read (at most ${MAX_MATCHING}); older ones are left alone.` : "";
    const chosen = found.filter(action === "kill" ? (run) => !TERMINAL.includes(run.state) : (run) => retryable(run, session));
    const others = action === "retry" ? found.filter((run) => unsuccessful(run) && !yours(run, session)).length : 0;
    const left = others ? ` ${others} matching run(s) of other users are left alone: ${OWNER_RETRIES}` : "";
    if (!chosen.length) {
      replace(notice, message("ok", (action === "kill" ? "No matching run is still going." : "No matching run of yours ended without succeeding.") + left + capped));
      return;
    }
    bulk(action, chosen, `${action === "kill" ? "that have not ended" : "of yours that ended without succeeding"} (filters: ${describeFilters(filters)}).${left}${capped}`, capped);
  }

  async function bulk(action, chosen, which, capped = "") {
    const verb = action === "kill" ? "Kill" : "Retry";
    const also = action === "retry" ? ` ${RETRY_MEANS}` : "";
    if (!chosen.length || !confirm(`${verb} ${chosen.length} run(s) ${which}${also}`)) return;
    const results = [];
    for (let i = 0; i < chosen.length; i += AT_ONCE) {
      replace(notice, `${verb}: ${i} of ${chosen.length}…`);
      const batch = chosen.slice(i, i + AT_ONCE);
      results.push(
        ...(await Promise.allSettled(batch.map((run) => (action === "kill" ? post(`/v1/runs/${encodeURIComponent(run.id)}/kill`) : resubmit(run))))),
      );
    }
    const failures = results.filter((r) => r.status === "rejected").map((r) => r.reason.message);
    selected.clear();
    replace(
      notice,
      message(failures.length ? "error" : "ok", `${verb}: ${results.length - failures.length} done${failures.length ? `, ${failures.length} refused: ${failures[0]}` : ""}.${capped}`),
    );
    render();
    loop.now();
  }

  if (dropped) replace(notice, message("error", dropped));
  loop.now();
  return () => loop.stop();
}
