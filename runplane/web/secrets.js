// Secrets: the names a run may use (yours and your groups'), who set each and when. No value is
// ever shown: no answer of the API holds one, so this page never has one to show.
import { get } from "./api.js";
import { bytes, h, message, replace, table, when } from "./dom.js";

// A secret's updated_at (Unix seconds) as the ISO text `when` shows.
function iso(epoch) {
  return typeof epoch === "number" ? new Date(epoch * 1000).toISOString() : null;
}

function row(s) {
  return h(
    "tr",
    { "data-ref": s.ref },
    h("th", { scope: "row" }, h("code", {}, s.ref)),
    h("td", {}, `${s.scope} ${s.owner}`),
    h("td", { class: "num" }, bytes(s.size)),
    h("td", {}, when(iso(s.updated_at))),
    h("td", {}, s.updated_by),
  );
}

export function secretsPage(main) {
  const box = h("div", {}, "Loading…");
  replace(
    main,
    h("h1", {}, "Secrets"),
    h(
      "p",
      {},
      "Secrets a run of yours may use: yours and your groups'. A run names one by its reference (",
      h("code", {}, "runplane run --secret WANDB_API_KEY=wandb"),
      "); its worker reads the value when the run starts. No page and no answer of the API ever shows a value.",
    ),
    box,
    h(
      "p",
      { class: "hint" },
      "Set one with ",
      h("code", {}, "runplane secret set NAME"),
      " (the value from stdin), remove one with ",
      h("code", {}, "runplane secret rm NAME"),
      "; an admin sets a group's with ",
      h("code", {}, "--group GROUP"),
      ".",
    ),
  );
  get("/v1/secrets")
    .then(({ secrets }) =>
      replace(
        box,
        secrets.length
          ? table(["Reference", "Scope", "Size", "Updated", "By"], secrets.map(row), { "aria-label": "Secrets" })
          : h("p", {}, "No secrets yet."),
      ),
    )
    .catch((error) => replace(box, message("error", error.message)));
}

// What a run names of secrets, for its page: each variable and the secret it holds, and the
// image's registry login; references only (a run holds no value).
export function runSecrets(spec) {
  const named = Object.entries(spec.secrets || {});
  if (!named.length && !spec.image_pull_secret) return null;
  return h(
    "section",
    { "aria-labelledby": "h-secrets" },
    h("h2", { id: "h-secrets" }, "Secrets"),
    named.length
      ? h("ul", { class: "secrets" }, named.map(([env, ref]) => h("li", {}, h("code", {}, env), " → ", h("code", {}, ref))))
      : null,
    spec.image_pull_secret ? h("p", {}, "Image pulled with the login in ", h("code", {}, spec.image_pull_secret)) : null,
    h("p", { class: "hint" }, "References only: the worker reads the values when an attempt starts, and the run's logs show them as ***."),
  );
}
