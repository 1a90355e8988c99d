// A run's checkpoint on its page: its newest checkpoint (number, files, size, last sync, the attempt
// that synced it, pieces), its rule, and its files a page at a time, each a download link.
import { get } from "./api.js";
import { bytes, h, message, replace, runLink, safeHref, seconds, when } from "./dom.js";

const PAGE = 100; // files read at a time

// What the run's checkpoint rule asks, in words ("every 10 m · on a stop: SIGUSR1, up to 60.0 s · ...").
export function ruleWords(rule) {
  if (!rule) return null;
  const grace = rule.grace ?? 30;
  const parts = [
    rule.interval
      ? `synced every ${seconds(rule.interval)} and whenever the command exits`
      : "synced whenever the command exits or is stopped",
    `on a stop: ${rule.signal || "SIGTERM"}, then up to ${seconds(grace)} to exit`,
  ];
  if (rule.exit_code) parts.push(`exit ${rule.exit_code} starts it again (at most ${rule.max_pieces ?? 100} pieces)`);
  return parts.join(" · ");
}

// a file's download link when its address is an http(s) one; its path is only ever text
function fileLink(file) {
  const href = safeHref(file.url);
  const name = file.path.split("/").pop();
  return href ? h("a", { href, download: name, rel: "noreferrer" }, file.path) : h("code", {}, file.path);
}

// The panel, made once per page: `node` is drawn into the page, `update(run)` on each read of the
// run (it reads the files again only when the newest checkpoint changes), `stop()` when leaving.
export function checkpointPanel(runId) {
  let shown = null; // "series/seq" of the checkpoint whose files are listed
  let cursor = null;
  let asked = 0; // the newest read's number: an older read's answer is dropped
  const facts = h("div", {});
  const list = h("ul", { class: "checkpoint-files", "aria-label": "Files of the checkpoint" });
  const more = h("button", { type: "button", onclick: () => page(false) }, "More files");
  const state = h("div", { "aria-live": "polite" });
  const node = h(
    "section",
    { class: "checkpoint", "aria-labelledby": "h-ckpt" },
    h("h2", { id: "h-ckpt" }, "Checkpoint"),
    facts,
    list,
    state,
    more,
  );
  more.hidden = true;

  async function page(first) {
    const mine = ++asked;
    const key = shown;
    try {
      const query = first ? { limit: PAGE } : { limit: PAGE, cursor };
      const answer = await get(`/v1/runs/${encodeURIComponent(runId)}/checkpoint`, query);
      if (mine !== asked || key !== shown) return;
      if (first) replace(list);
      list.append(...answer.files.map((f) => h("li", {}, fileLink(f), ` (${bytes(f.size)})`)));
      cursor = answer.next_cursor;
      more.hidden = !cursor;
      replace(state, !answer.files.length && first ? h("p", { class: "hint" }, "It holds no files.") : null);
    } catch (error) {
      if (mine !== asked || key !== shown) return;
      if (error.status === 409 && !first) return page(true); // a newer checkpoint replaced it: from the start
      more.hidden = true;
      if (error.status === 404) replace(state, h("p", { class: "hint" }, "No checkpoint to list yet."));
      else replace(state, message("error", error.message));
    }
  }

  function update(run) {
    const rule = run.spec.checkpoint;
    const from = run.spec.from_checkpoint;
    node.hidden = !(run.checkpoint || rule || from);
    if (node.hidden) return;
    const c = run.checkpoint;
    const rows = [];
    if (c) {
      rows.push(["Number", c.series ? [`${c.seq} of run `, runLink(c.series)] : `${c.seq}`]);
      rows.push(["Files", `${c.files} (${bytes(c.bytes)})`]);
      rows.push(["Last sync", when(c.synced_at)]);
      rows.push(["Synced by", `attempt ${c.attempt}`]);
    }
    // pieces: those ended with exit_code and started again; the one going (or last) is the next
    const piece = (run.pieces ?? 0) + 1;
    if (rule?.exit_code && !run.finished_at) rows.push(["Piece", `${piece} of at most ${rule.max_pieces ?? 100}`]);
    else if (rule?.exit_code && (run.started_at || run.pieces)) rows.push(["Pieces", `went in ${piece}`]);
    if (rule) rows.push(["Rule", ruleWords(rule)]);
    if (from) rows.push(["Started from", ["the checkpoint of run ", runLink(from)]]);
    replace(
      facts,
      c ? null : h("p", {}, "No checkpoint synced yet."),
      h("dl", { class: "facts" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    );
    // its own newest checkpoint; before it has one, the checkpoint it starts from (the API answers that)
    const key = c ? `${c.series || run.id}/${c.seq}` : from ? `from/${from}` : null;
    if (key === shown) return;
    shown = key;
    cursor = null;
    more.hidden = true;
    replace(list);
    replace(state);
    if (key) page(true);
  }

  return { node, update, stop: () => (asked += 1) };
}
