// Sweeps: the list, and one sweep's progress, failures by reason, members by state, retry and kill.
import { get, post } from "./api.js";
import { badge, h, keepFocus, message, refresher, replace, say, STATES, svg, table, when } from "./dom.js";

const REFRESH_MS = 3000;
const MEMBER_PAGES = 20; // at most 20 pages of 500 members drawn

function progressBar(sweep) {
  const width = 600;
  let x = 0;
  const parts = [];
  for (const state of STATES) {
    const n = sweep.counts[state] || 0;
    if (!n) continue;
    const w = (n / Math.max(1, sweep.size)) * width;
    parts.push(svg("rect", { x, y: 0, width: w, height: 18, class: `fill state-${state}` }, svg("title", {}, `${state}: ${n}`)));
    x += w;
  }
  return svg("svg", { viewBox: `0 0 ${width} 18`, class: "progress", role: "img", "aria-label": "Members by state" }, parts);
}

function countsText(sweep) {
  return STATES.filter((s) => sweep.counts[s]).map((s) => `${s} ${sweep.counts[s]}`).join(" · ");
}

export function sweepsPage(main, session) {
  const cursors = [null]; // the cursor of each page seen, for going back
  const owner = h("input", {
    id: "s-owner",
    type: "search",
    onchange: () => {
      cursors.splice(1);
      loop.now();
    },
  });
  const body = h("div", {}, "Loading…");
  const notice = h("div", { class: "notice" });
  const pager = h("div", { class: "pager" });
  replace(
    main,
    h("h1", {}, "Sweeps"),
    session.admin ? h("form", { class: "filters", onsubmit: (e) => e.preventDefault() }, h("label", { for: "s-owner" }, "Owner"), owner) : null,
    notice,
    body,
    pager,
  );
  function go(next) {
    if (next) cursors.push(next);
    else cursors.pop();
    loop.now();
  }
  // one loop; a reply overtaken by a newer read (paging, the owner changed) is dropped
  const loop = refresher(async (current) => {
    const answer = await get("/v1/sweeps", { owner: owner.value.trim(), limit: 50, cursor: cursors[cursors.length - 1] });
    const sweeps = answer.sweeps;
    if (!current()) return;
    replace(notice);
    keepFocus(pager, () =>
      replace(
        pager,
        h("button", { type: "button", disabled: cursors.length < 2, onclick: () => go(null) }, "‹ Newer"),
        h("span", {}, `page ${cursors.length}`),
        h("button", { type: "button", disabled: !answer.next_cursor, onclick: () => go(answer.next_cursor) }, "Older ›"),
      ),
    );
    keepFocus(body, () => replace(
      body,
      sweeps.length
        ? table(
            ["Name", "Id", "Queue", "Size", "Progress", "Failures", "Created"],
            sweeps.map((s) =>
              h(
                "tr",
                {},
                h("td", {}, h("a", { href: `#/sweeps/${encodeURIComponent(s.id)}` }, s.name || "(no name)")),
                h("td", { class: "id" }, h("code", {}, s.id)),
                h("td", {}, s.queue),
                h("td", { class: "num" }, s.size),
                h("td", {}, progressBar(s), h("div", { class: "hint" }, countsText(s))),
                h("td", {}, Object.entries(s.failures).map(([r, n]) => `${r} ${n}`).join(", ") || "–"),
                h("td", {}, when(s.created_at)),
              ),
            ),
            { "aria-label": "Sweeps" },
          )
        : h("p", {}, "No sweeps."),
    ));
  }, { every: REFRESH_MS, onError: (error) => say(notice, "error", error.message) });
  loop.now();
  return () => loop.stop();
}

async function members(id) {
  const out = [];
  let cursor = null;
  for (let i = 0; i < MEMBER_PAGES; i += 1) {
    const page = await get("/v1/runs", { sweep: id, limit: 500, cursor });
    out.push(...page.runs);
    cursor = page.next_cursor;
    if (!cursor) break;
  }
  return out;
}

export function sweepPage(main, id, session) {
  const head = h("div", {});
  const notice = h("div", { class: "notice", "aria-live": "polite" });
  const body = h("div", {});
  const retryButton = h("button", { type: "button", onclick: retry }, "Retry failed members");
  const killButton = h("button", { type: "button", class: "danger", onclick: kill }, "Kill sweep");
  replace(main, h("p", {}, "Loading…"));
  let drawn = false;
  let seen = null; // what the members were last read for
  let runs = [];

  async function retry() {
    try {
      const answer = await post(`/v1/sweeps/${encodeURIComponent(id)}/retry`);
      replace(notice, message("ok", `${answer.retried} member(s) run again.`));
      loop.now();
    } catch (error) {
      replace(notice, message("error", error.message));
    }
  }

  async function kill() {
    if (!confirm(`Kill sweep ${id}?`)) return;
    try {
      await post(`/v1/sweeps/${encodeURIComponent(id)}/kill`);
      replace(notice, message("ok", "Kill asked for."));
      loop.now();
    } catch (error) {
      replace(notice, message("error", error.message));
    }
  }

  function draw(sweep, runs) {
    const failed = (sweep.counts.failed || 0) + (sweep.counts.timed_out || 0) + (sweep.counts.killed || 0);
    retryButton.disabled = failed === 0 || sweep.killed;
    killButton.disabled = sweep.killed || !!sweep.finished_at;
    replace(
      head,
      h("h1", {}, sweep.name || "(no name)", sweep.killed ? " " : null, sweep.killed ? badge("killed") : null),
      h("p", { class: "id" }, h("code", {}, sweep.id), ` · queue ${sweep.queue} · ${sweep.size} members`, sweep.max_parallel ? ` · at most ${sweep.max_parallel} at once` : ""),
      sweep.waiting_for ? h("p", { class: "reason" }, `waiting for ${sweep.waiting_for}`) : null,
      h("div", { class: "actions" }, retryButton, killButton),
    );
    const released = new Map(runs.map((r) => [r.sweep_index, r]));
    const cells = [];
    for (let i = 0; i < sweep.size; i += 1) {
      const run = released.get(i);
      cells.push(
        run
          ? h("a", { class: `cell state-${run.state}`, href: `#/runs/${encodeURIComponent(run.id)}`, title: `#${i} ${run.name || ""} ${run.state}`, "aria-label": `member ${i}: ${run.state}` })
          : h("span", { class: "cell waiting", title: `#${i} not released yet` }),
      );
    }
    replace(
      body,
      h("section", { "aria-labelledby": "h-prog" }, h("h2", { id: "h-prog" }, "Progress"), progressBar(sweep), h("p", {}, countsText(sweep), sweep.waiting ? ` (${sweep.waiting} not released yet)` : "")),
      h(
        "section",
        { "aria-labelledby": "h-fail" },
        h("h2", { id: "h-fail" }, "Failures by reason"),
        Object.keys(sweep.failures).length
          ? table(["Reason", "Members"], Object.entries(sweep.failures).map(([r, n]) => h("tr", {}, h("td", {}, r), h("td", { class: "num" }, n))))
          : h("p", {}, "None."),
      ),
      h("section", { "aria-labelledby": "h-grid" }, h("h2", { id: "h-grid" }, "Members"), h("div", { class: "grid", role: "list", "aria-label": "Members by state" }, cells.map((c) => h("span", { role: "listitem" }, c))), legend()),
      h("section", { "aria-labelledby": "h-ev" }, h("h2", { id: "h-ev" }, "Timeline"), h("ul", {}, sweep.events.map((e) => h("li", {}, when(e.at), " ", e.message)))),
    );
  }

  // one loop; a reply overtaken by a newer read (after retry or kill) is dropped
  const loop = refresher(
    async (current) => {
      let sweep;
      try {
        sweep = await get(`/v1/sweeps/${encodeURIComponent(id)}`);
      } catch (error) {
        if (error.status !== 404) throw error;
        if (current()) replace(main, h("h1", {}, "Sweep not found"), message("error", error.message), h("a", { href: "#/sweeps" }, "Back to sweeps"));
        return false;
      }
      // the members are read again only when the sweep's counts say something moved
      const signature = JSON.stringify([sweep.counts, sweep.waiting, sweep.events.length]);
      let found = runs;
      if (signature !== seen) found = await members(id);
      if (!current()) return undefined;
      runs = found;
      seen = signature;
      if (!drawn) replace(main, head, notice, body);
      drawn = true;
      keepFocus(main, () => draw(sweep, runs));
      return sweep.finished_at && !sweep.waiting ? false : undefined;
    },
    {
      every: REFRESH_MS,
      onError: (error) => {
        if (!drawn) replace(main, notice);
        say(notice, "error", error.message);
      },
    },
  );
  loop.now();
  return () => loop.stop();
}

function legend() {
  return h("p", { class: "legend" }, STATES.map((s) => h("span", {}, h("span", { class: `cell state-${s}` }), s)), h("span", {}, h("span", { class: "cell waiting" }), "not released"));
}
