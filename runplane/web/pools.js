// Pools and workers: backlog, workers by state, launches and their last error; each worker's
// slots, GPUs, runs and heartbeat, and the image a starting worker pulls.
import { get } from "./api.js";
import { ago, bytes, h, keepFocus, refresher, replace, runLink, say, table, when } from "./dom.js";

const REFRESH_MS = 5000;
const WORKER_PAGES = 10;

async function allWorkers() {
  const out = [];
  let cursor = null;
  for (let i = 0; i < WORKER_PAGES; i += 1) {
    const page = await get("/v1/workers", cursor ? { cursor } : {});
    out.push(...page.workers);
    cursor = page.next_cursor; // absent on a server that sends every worker at once
    if (!cursor) return { workers: out, more: false };
  }
  return { workers: out, more: true };
}

function poolRow(p) {
  const s = p.shape;
  const shape = `${s.cpus} CPU · ${s.gpus} GPU${s.gpu_type ? ` ${s.gpu_type}` : ""} · ${bytes(s.memory)} · ${s.slots} slot${s.slots === 1 ? "" : "s"}`;
  const w = p.workers;
  return h(
    "tr",
    { "data-pool": p.name, class: p.disabled ? "disabled" : null },
    h("th", { scope: "row" }, h("a", { href: `#/runs?queue=${encodeURIComponent(p.name)}` }, p.name), h("div", { class: "hint" }, p.backend)),
    h("td", { class: "shape" }, shape),
    h("td", { class: "num" }, p.backlog),
    h("td", { class: "num" }, `${w.starting} / ${w.idle} / ${w.busy} / ${w.draining}`, h("div", { class: "hint" }, `min ${p.min_workers}, max ${p.max_workers}`)),
    h("td", { class: "num" }, `${p.launches.launched}`, p.launches.failed ? h("span", { class: "bad" }, ` (${p.launches.failed} failed)`) : null, h("div", { class: "hint" }, p.launches.last_launch_at ? ["last ", ago(p.launches.last_launch_at)] : "never")),
    h("td", { class: "reason" }, p.last_error ? [p.last_error, h("div", { class: "hint" }, when(p.last_error_at))] : "–"),
    h("td", { class: "reason" }, p.disabled ? h("strong", {}, p.disabled) : "–"),
    h("td", { class: "reason" }, p.last_decision || "–", p.counted_at ? h("div", { class: "hint" }, "counted ", ago(p.counted_at)) : null),
  );
}

// The image a starting worker pulls before its first run, and how far: "pulling IMAGE (0.8 GiB of 1.8 GiB)".
function pulling(p) {
  return p.total > 0 ? `pulling ${p.image} (${bytes(Math.min(p.done, p.total))} of ${bytes(p.total)})` : `pulling ${p.image}`;
}

function workerRow(w) {
  const used = w.slots - w.free_slots;
  return h(
    "tr",
    { "data-worker": w.id },
    h("td", { class: "id" }, h("code", {}, w.id)),
    h("td", {}, w.pool),
    h("td", {}, h("span", { class: `wstate wstate-${w.status}` }, w.status), w.pulling ? h("div", { class: "hint" }, pulling(w.pulling)) : null),
    h("td", {}, w.host),
    h("td", { class: "num" }, `${used}/${w.slots}`),
    h("td", { class: "num" }, `${w.gpus - w.free_gpus}/${w.gpus}`, w.gpu_ids.length ? h("div", { class: "hint" }, w.gpu_ids.join(", ")) : null),
    h("td", {}, w.runs.length ? w.runs.map((id, i) => [i ? ", " : "", runLink(id)]) : "–"),
    h("td", { class: "num" }, w.runs_done),
    h("td", {}, ago(w.heartbeat_at)),
    h("td", {}, w.network_refused ? `no network: ${w.network_refused}` : w.tag || "–"),
  );
}

export function poolsPage(main) {
  const poolsBox = h("div", {}, "Loading…");
  const workersBox = h("div", {}, "Loading…");
  replace(
    main,
    h("h1", {}, "Pools and workers"),
    h("section", { "aria-labelledby": "h-pools" }, h("h2", { id: "h-pools" }, "Pools"), poolsBox),
    h("section", { "aria-labelledby": "h-workers" }, h("h2", { id: "h-workers" }, "Workers"), workersBox),
  );
  // one loop; each part draws its own error, and a failed read makes the loop wait longer
  const loop = refresher(
    async (current) => {
      const [pools, workers] = await Promise.allSettled([get("/v1/pools"), allWorkers()]);
      if (!current()) return;
      keepFocus(main, () => draw(pools, workers));
      const failed = [pools, workers].find((r) => r.status === "rejected");
      if (failed) throw failed.reason;
    },
    { every: REFRESH_MS },
  );
  function draw(pools, workers) {
    if (pools.status === "fulfilled") {
      replace(
        poolsBox,
        table(
          ["Pool", "Shape", "Backlog", "Workers (starting/idle/busy/draining)", "Launches", "Last launch error", "Disabled", "Last decision"],
          pools.value.pools.map(poolRow),
          { "aria-label": "Pools" },
        ),
      );
    } else say(poolsBox, "error", pools.reason.message);
    if (workers.status === "fulfilled") {
      const { workers: list, more } = workers.value;
      replace(
        workersBox,
        list.length
          ? table(["Worker", "Pool", "Status", "Host", "Slots used", "GPUs used", "Runs", "Done", "Heartbeat", "Notes"], list.map(workerRow), { "aria-label": "Workers" })
          : h("p", {}, "No workers."),
        more ? h("p", { class: "hint" }, `The first ${list.length} workers are shown.`) : null,
      );
    } else say(workersBox, "error", workers.reason.message);
  }
  loop.now();
  return () => loop.stop();
}
