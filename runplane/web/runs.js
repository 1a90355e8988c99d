// Runs: the caller's runs (an admin: any user's), filtered by what the URL holds, refreshed live.
import { get, post } from "./api.js";
import { badge, duration, h, hashQuery, keepFocus, message, replace, runLink, seconds, setHashQuery, STATES, TERMINAL, when, whenShown } from "./dom.js";

const PAGE = 50;
const MAX_MATCHING = 5000;
const AT_ONCE = 8; // requests in flight at once for a bulk action
const REFRESH_MS = 2000;

function reasonOf(run) {
  if (run.failure) return `${run.failure.reason}: ${run.failure.message}`;
  if (run.state === "queued") return run.waiting_reason || (run.waiting_on.length ? `waiting on ${run.waiting_on.join(", ")}` : "");
  return "";
}

// The run's spec, submitted again as a new run (what "retry" means for one run).
export function resubmit(run) {
  return post("/v1/runs", run.spec);
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
  const cursors = [null]; // the cursor of each page seen, for going back
  let page = [];
  let nextCursor = null;
  const selected = new Set();
  let timer = null;
  let stopped = false;

  const status = h("div", { class: "status-line" });
  const notice = h("div", { class: "notice", "aria-live": "polite" });
  const body = h("tbody", {}, h("tr", {}, h("td", { colspan: 10 }, "Loading…")));
  const pager = h("div", { class: "pager" });
  const killButton = h("button", { type: "button", disabled: true, onclick: () => bulk("kill", selectedRuns()) }, "Kill selected");
  const retryButton = h("button", { type: "button", disabled: true, onclick: () => bulk("retry", selectedRuns()) }, "Retry selected");
  const killAll = h("button", { type: "button", class: "danger", onclick: () => everyMatching("kill") }, "Kill all matching");
  const retryAll = h("button", { type: "button", onclick: () => everyMatching("retry") }, "Retry all matching");
  const all = h("input", { type: "checkbox", "aria-label": "Select every run on this page", onchange: () => selectAll(all.checked) });

  function update(key, value) {
    const next = new URLSearchParams();
    for (const [k, v] of Object.entries({ ...filters, [key]: value })) {
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
  const queueSelect = h("select", { id: "f-queue", onchange: () => update("queue", queueSelect.value) }, h("option", { value: "" }, "any"));
  if (filters.queue) queueSelect.append(h("option", { value: filters.queue }, filters.queue));
  queueSelect.value = filters.queue;
  get("/v1/pools")
    .then(({ pools }) => {
      for (const pool of pools) if (pool.name !== filters.queue) queueSelect.append(h("option", { value: pool.name }, pool.name));
    })
    .catch(() => {});
  const text = (id, key, label, list) => {
    const input = h("input", { id, type: "search", value: filters[key], list, onchange: () => update(key, input.value.trim()) });
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
    session.admin ? [text("f-owner", "owner", "Owner", "f-users"), users] : null,
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
    notice,
    status,
    tableNode,
    pager,
  );

  function selectAll(on) {
    for (const run of page) if (on) selected.add(run.id);
    if (!on) selected.clear();
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
        if (box.checked) selected.add(run.id);
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
    killButton.disabled = retryButton.disabled = selected.size === 0;
    killButton.textContent = `Kill selected (${selected.size})`;
    retryButton.textContent = `Retry selected (${selected.size})`;
  }

  function render() {
    const runs = shown(page);
    keepFocus(body, () => replace(body, runs.length ? runs.map(row) : h("tr", {}, h("td", { colspan: headers.length }, "No runs match."))));
    all.checked = runs.length > 0 && runs.every((r) => selected.has(r.id));
    buttons();
    replace(
      pager,
      h("button", { type: "button", disabled: cursors.length < 2, onclick: () => go(-1) }, "‹ Newer"),
      h("span", {}, `page ${cursors.length}`),
      h("button", { type: "button", disabled: !nextCursor, onclick: () => go(1) }, "Older ›"),
    );
  }

  function go(step) {
    if (step > 0) cursors.push(nextCursor);
    else cursors.pop();
    load();
  }

  // the API's own filters; name and "failed only" narrow what it sends (it has no such filter)
  function apiQuery(limit, cursor) {
    const query = { limit, cursor, state: filters.state };
    if (filters.sweep) query.sweep = filters.sweep;
    else Object.assign(query, { queue: filters.queue, owner: filters.owner });
    return query;
  }

  async function load() {
    clearTimeout(timer);
    try {
      const answer = await get("/v1/runs", apiQuery(PAGE, cursors[cursors.length - 1]));
      if (stopped) return;
      page = answer.runs;
      nextCursor = answer.next_cursor;
      replace(status, `Updated ${new Date().toLocaleTimeString()}`);
      render();
    } catch (error) {
      if (stopped) return;
      replace(status, message("error", error.message));
    }
    if (!stopped) timer = setTimeout(() => whenShown(load), REFRESH_MS);
  }

  function selectedRuns() {
    return page.filter((run) => selected.has(run.id));
  }

  // Every run the filters match, on every page (up to MAX_MATCHING): kill takes those that have
  // not ended, retry those that ended without succeeding.
  async function everyMatching(action) {
    const found = [];
    let cursor = null;
    try {
      do {
        const answer = await get("/v1/runs", apiQuery(500, cursor));
        found.push(...shown(answer.runs));
        cursor = answer.next_cursor;
      } while (cursor && found.length < MAX_MATCHING);
    } catch (error) {
      replace(notice, message("error", error.message));
      return;
    }
    const ended = (run) => TERMINAL.includes(run.state);
    const chosen = found.filter((run) => (action === "kill" ? !ended(run) : ended(run) && run.state !== "succeeded"));
    if (!chosen.length) {
      replace(notice, message("ok", action === "kill" ? "No matching run is still going." : "No matching run failed."));
      return;
    }
    bulk(action, chosen, action === "kill" ? "that have not ended" : "that did not succeed");
  }

  async function bulk(action, chosen, which = "") {
    const verb = action === "kill" ? "Kill" : "Retry";
    if (!chosen.length || !confirm(`${verb} ${chosen.length} run(s)${which ? ` ${which}` : ""}?`)) return;
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
      message(failures.length ? "error" : "ok", `${verb}: ${results.length - failures.length} done${failures.length ? `, ${failures.length} refused: ${failures[0]}` : ""}`),
    );
    load();
  }

  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
