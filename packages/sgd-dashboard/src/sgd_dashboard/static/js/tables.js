// The run's worker, checkpoint and settings tables.
import { clear, fmtBytes, fmtDuration, fmtNumber, h, pill } from "./dom.js";

const STATE_TONE = { running: "ok", finished: "muted", failed: "bad", gone: "warn" };

/** Fill the workers table body. */
export function workersRows(tbody, workers) {
  clear(tbody);
  if (!workers.length) {
    tbody.append(h("tr", null, h("td", { colspan: 7, class: "muted" }, "No worker has reported yet.")));
    return;
  }
  for (const w of workers) {
    const state = String(w.state || "?");
    tbody.append(h("tr", { dataset: { rank: w.rank, pid: w.pid, state } },
      h("td", { class: "num" }, w.rank ?? "–"),
      h("td", null, w.host ?? "–"),
      h("td", { class: "num mono" }, w.pid ?? "–"),
      h("td", null, pill(state, STATE_TONE[state])),
      h("td", { class: "num" }, w.since_last_report_s === null || w.since_last_report_s === undefined ? "–" : fmtDuration(w.since_last_report_s)),
      h("td", { class: "num" }, w.s_per_iter === null || w.s_per_iter === undefined ? "–" : `${fmtNumber(w.s_per_iter)} s`),
      h("td", null, w.straggler ? pill("straggler", "bad") : "")));
  }
}

/** Fill the checkpoints table body. */
export function checkpointRows(tbody, checkpoints) {
  clear(tbody);
  if (!checkpoints.length) {
    tbody.append(h("tr", null, h("td", { colspan: 6, class: "muted" }, "No checkpoint kept.")));
    return;
  }
  for (const c of checkpoints) {
    const metrics = c.metrics && typeof c.metrics === "object"
      ? Object.entries(c.metrics).filter(([k]) => !k.startsWith("_")).slice(0, 6).map(([k, v]) => `${k}=${fmtNumber(v)}`).join("  ")
      : "";
    tbody.append(h("tr", { dataset: { name: c.name } },
      h("td", { class: "mono" }, c.name ?? "–"),
      h("td", { class: "num" }, c.iteration ?? "–"),
      h("td", { class: "num" }, fmtNumber(c.score)),
      h("td", { class: "metrics-text", title: metrics }, metrics),
      h("td", { class: "num" }, fmtBytes(c.bytes)),
      h("td", null, h("div", { class: "flags" },
        c.verified ? pill("verified", "ok") : pill("not verified", "warn"),
        c.best ? pill("best", "info") : null, c.latest ? pill("latest") : null,
        c.resume ? pill("resume", "info") : null))));
  }
}

function flatten(obj, prefix, out) {
  for (const [k, v] of Object.entries(obj)) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) flatten(v, key, out);
    else out.push([key, v]);
  }
  return out;
}

/** The run's settings as a two-column table (nested keys dotted). */
export function settingsTable(settings) {
  const rows = flatten(settings || {}, "", []);
  if (!rows.length) return h("p", { class: "muted" }, "No settings recorded (trainer.json missing).");
  return h("table", { class: "table settings-table" }, h("tbody", null, rows.map(([k, v]) =>
    h("tr", null, h("th", { class: "mono" }, k), h("td", { class: "mono" }, typeof v === "string" ? v : JSON.stringify(v))))));
}
