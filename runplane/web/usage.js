// Usage: GPU-hours, CPU-hours and cost by user, group or pool over a window, a chart of the last
// days, and quotas against their limits.
import { get } from "./api.js";
import { h, hashQuery, hours, message, replace, setHashQuery, svg, table } from "./dom.js";

const WINDOWS = { "1": "last day", "7": "last 7 days", "30": "last 30 days" };
const DAY = 86400 * 1000;

function barChart(rows, field, label) {
  const width = 640;
  const rowH = 22;
  const left = 160;
  const max = Math.max(1e-9, ...rows.map((r) => r[field]));
  return svg(
    "svg",
    { viewBox: `0 0 ${width} ${rows.length * rowH + 4}`, class: "chart", role: "img", "aria-label": label },
    rows.map((r, i) => {
      const w = (r[field] / max) * (width - left - 90);
      return svg(
        "g",
        { class: "bar" },
        svg("text", { x: 4, y: i * rowH + 15, class: "label" }, String(r.key ?? "(no group)").slice(0, 22)),
        svg("rect", { x: left, y: i * rowH + 3, width: Math.max(1, w), height: rowH - 6, rx: 2 }),
        svg("text", { x: left + w + 6, y: i * rowH + 15, class: "value" }, hours(r[field])),
      );
    }),
  );
}

function daysChart(days) {
  const width = 640;
  const height = 160;
  const max = Math.max(1e-9, ...days.flatMap((d) => [d.total.gpu_seconds, d.total.cpu_seconds]));
  const step = (width - 40) / days.length;
  const y = (v) => height - 24 - (v / max) * (height - 40);
  return svg(
    "svg",
    { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": "CPU- and GPU-hours per day" },
    days.map((d, i) => {
      const x = 30 + i * step;
      return svg(
        "g",
        {},
        svg("rect", { x, y: y(d.total.cpu_seconds), width: step / 2 - 2, height: height - 24 - y(d.total.cpu_seconds), class: "cpu" }, svg("title", {}, `${d.label}: ${hours(d.total.cpu_seconds)} CPU-h`)),
        svg("rect", { x: x + step / 2 - 2, y: y(d.total.gpu_seconds), width: step / 2 - 2, height: height - 24 - y(d.total.gpu_seconds), class: "gpu" }, svg("title", {}, `${d.label}: ${hours(d.total.gpu_seconds)} GPU-h`)),
        svg("text", { x, y: height - 8, class: "value" }, d.label),
      );
    }),
  );
}

function meter(used, limit) {
  if (limit === null || limit === undefined) return `${typeof used === "number" ? +used.toFixed(2) : used} (no limit)`;
  return h("span", { class: "meter-cell" }, h("meter", { min: 0, max: limit || 1, value: Math.min(used, limit || 1), high: (limit || 1) * 0.8 }), ` ${+used.toFixed(2)} / ${limit}`);
}

export function usagePage(main, session) {
  const params = hashQuery();
  const by = params.get("by") || "pool";
  const days = params.get("days") || "7";
  const bySelect = h("select", { id: "u-by", onchange: () => setHashQuery("/usage", [["by", bySelect.value], ["days", daysSelect.value]]) }, ["user", "group", "pool"].map((b) => h("option", { value: b }, b)));
  bySelect.value = by;
  const daysSelect = h("select", { id: "u-days", onchange: () => setHashQuery("/usage", [["by", bySelect.value], ["days", daysSelect.value]]) }, Object.entries(WINDOWS).map(([v, t]) => h("option", { value: v }, t)));
  daysSelect.value = WINDOWS[days] ? days : "7";
  const report = h("div", {}, "Loading…");
  const trend = h("div", {}, "Loading…");
  const quotas = h("div", {}, "Loading…");
  replace(
    main,
    h("h1", {}, "Usage"),
    h("p", {}, session.admin ? "Everyone's runs (you are an admin)." : "Your runs."),
    h("form", { class: "filters", onsubmit: (e) => e.preventDefault() }, h("label", { for: "u-by" }, "By"), bySelect, h("label", { for: "u-days" }, "Window"), daysSelect),
    h("section", { "aria-labelledby": "h-by" }, h("h2", { id: "h-by" }, `By ${by}`), report),
    h("section", { "aria-labelledby": "h-trend" }, h("h2", { id: "h-trend" }, "Last 7 days"), trend),
    h("section", { "aria-labelledby": "h-quota" }, h("h2", { id: "h-quota" }, "Quotas"), quotas),
  );
  const now = Date.now();
  get("/v1/usage", { by, since: new Date(now - Number(daysSelect.value) * DAY).toISOString() })
    .then((r) => {
      const rows = [...r.rows].sort((a, b) => b.gpu_seconds - a.gpu_seconds || b.cpu_seconds - a.cpu_seconds);
      const line = (row, head) =>
        h("tr", { class: head ? "total" : null }, h(head ? "th" : "td", head ? { scope: "row" } : {}, head ? "Total" : String(row.key ?? "(no group)")), h("td", { class: "num" }, row.runs), h("td", { class: "num" }, hours(row.cpu_seconds)), h("td", { class: "num" }, hours(row.gpu_seconds)), h("td", { class: "num" }, row.cost === null ? "–" : row.cost.toFixed(2)));
      replace(
        report,
        rows.length ? [h("h3", {}, "GPU-hours"), barChart(rows, "gpu_seconds", `GPU-hours by ${by}`), h("h3", {}, "CPU-hours"), barChart(rows, "cpu_seconds", `CPU-hours by ${by}`)] : h("p", {}, "No runs in this window."),
        table([by[0].toUpperCase() + by.slice(1), "Runs", "CPU-hours", "GPU-hours", "Cost"], [...rows.map((row) => line(row, false)), line(r.total, true)], { "aria-label": `Usage by ${by}` }),
      );
    })
    .catch((e) => replace(report, message("error", e.message)));
  const start = new Date(new Date(now).toISOString().slice(0, 10)).getTime() - 6 * DAY;
  Promise.all(
    Array.from({ length: 7 }, (_, i) => {
      const since = new Date(start + i * DAY);
      const until = new Date(start + (i + 1) * DAY);
      return get("/v1/usage", { by: "pool", since: since.toISOString(), until: until.toISOString() }).then((r) => ({ label: since.toISOString().slice(5, 10), total: r.total }));
    }),
  )
    .then((list) => replace(trend, list.some((d) => d.total.cpu_seconds || d.total.gpu_seconds) ? daysChart(list) : h("p", {}, "Nothing used in these days."), h("p", { class: "legend" }, h("span", { class: "swatch cpu" }), "CPU-hours ", h("span", { class: "swatch gpu" }), "GPU-hours")))
    .catch((e) => replace(trend, message("error", e.message)));
  get("/v1/quotas")
    .then(({ quotas: list }) =>
      replace(
        quotas,
        list.length
          ? table(
              ["Quota", "Period", "Running", "GPUs", "CPUs", "GPU-hours", "CPU-hours"],
              list.map((q) => h("tr", {}, h("th", { scope: "row" }, `${q.kind} ${q.name}`), h("td", {}, q.usage.period), h("td", {}, meter(q.usage.running, q.max_running)), h("td", {}, meter(q.usage.gpus, q.max_gpus)), h("td", {}, meter(q.usage.cpus, q.max_cpus)), h("td", {}, meter(q.usage.gpu_hours, q.gpu_hours)), h("td", {}, meter(q.usage.cpu_hours, q.cpu_hours)))),
              { "aria-label": "Quotas" },
            )
          : h("p", {}, "No quota applies to you."),
      ),
    )
    .catch((e) => replace(quotas, message("error", e.message)));
}
