// The runs view: every run under the served folder, filtered and sorted in the page, with a
// sparkline of its headline metric; up to eight ticked runs open in the compare view.
import { getJSON } from "./api.js";
import { fmtDuration, fmtNumber, fmtTime, h, clear, statusBadge, svg } from "./dom.js";

export const MAX_COMPARE = 8;
const REFRESH_MS = 5000;

// Kept while the page lives: coming back to the list keeps the filter, sort and ticks.
const state = { q: "", status: "", sort: "started", desc: true, selected: new Set() };

const COLUMNS = [
  { key: "select", label: "", sortable: false },
  { key: "status", label: "Status", value: (r) => r.status },
  { key: "name", label: "Name", value: (r) => r.name },
  { key: "started", label: "Started", value: (r) => r.started },
  { key: "duration", label: "Duration", value: (r) => r.duration_s, num: true },
  { key: "workers", label: "Workers", value: (r) => r.num_workers, num: true },
  { key: "iterations", label: "Iterations", value: (r) => r.iterations, num: true },
  { key: "metric", label: "Headline metric", value: (r) => (r.metric ? r.metric.last : null), num: true },
];

/** Mount the runs view into `root`; returns its stop function. */
export function mountRuns(root, ctx) {
  let runs = [];
  let timer = null;
  let stopped = false;
  const filter = h("input", { type: "search", class: "filter", placeholder: "Filter runs by name, status or metric…",
    value: state.q, "aria-label": "Filter runs", oninput: (e) => { state.q = e.target.value; render(); } });
  const statusSelect = h("select", { "aria-label": "Status", onchange: (e) => { state.status = e.target.value; render(); } },
    [["", "All statuses"], ["RUNNING", "Running"], ["FINISHED", "Finished"], ["ERRORED", "Failed"],
      ["DRIVER_DIED", "Driver died"], ["STOPPED", "Stopped"], ["INTERRUPTED", "Interrupted"]]
      .map(([v, t]) => h("option", { value: v }, t)));
  statusSelect.value = state.status;
  const compareBtn = h("button", { class: "primary", id: "compare-selected", onclick: () => {
    window.location.hash = "#/compare/" + [...state.selected].map(encodeURIComponent).join(",");
  } }, "Compare");
  const count = h("span", { class: "muted", id: "runs-count" });
  const thead = h("thead");
  const tbody = h("tbody");
  const table = h("table", { class: "table runs-table", id: "runs-table" }, thead, tbody);
  const empty = h("div", { class: "empty", hidden: true });
  root.append(
    h("div", { class: "page-head" }, h("h1", null, "Runs"), count),
    h("div", { class: "toolbar" }, filter, statusSelect, h("span", { class: "spacer" }), compareBtn),
    h("div", { class: "card table-card" }, table, empty),
  );

  function header() {
    clear(thead);
    const tr = h("tr");
    for (const col of COLUMNS) {
      if (col.sortable === false) { tr.append(h("th", { class: "col-select" })); continue; }
      const arrow = state.sort === col.key ? (state.desc ? " ▾" : " ▴") : "";
      tr.append(h("th", { class: `sortable${col.num ? " num" : ""}`, dataset: { sort: col.key }, onclick: () => {
        if (state.sort === col.key) state.desc = !state.desc; else { state.sort = col.key; state.desc = col.key !== "name"; }
        render();
      } }, col.label + arrow));
    }
    thead.append(tr);
  }

  function visible() {
    const q = state.q.trim().toLowerCase();
    let rows = runs.filter((r) => (!state.status || r.status === state.status) && (!q ||
      [r.name, r.status, r.metric && r.metric.name].some((t) => t && String(t).toLowerCase().includes(q))));
    const col = COLUMNS.find((c) => c.key === state.sort) || COLUMNS[3];
    const sign = state.desc ? -1 : 1;
    rows = rows.slice().sort((a, b) => {
      const x = col.value(a), y = col.value(b);
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (typeof x === "string" ? x.localeCompare(y) : x - y) * sign;
    });
    return rows;
  }

  function render() {
    header();
    clear(tbody);
    const rows = visible();
    for (const r of rows) tbody.append(row(r));
    count.textContent = rows.length === runs.length ? `${runs.length} runs` : `${rows.length} of ${runs.length} runs`;
    empty.hidden = rows.length > 0;
    clear(empty).append(runs.length ? "No run matches the filter." : "No runs yet under this folder.");
    updateCompare();
  }

  function updateCompare() {
    compareBtn.disabled = state.selected.size < 1;
    compareBtn.textContent = state.selected.size ? `Compare ${state.selected.size} selected` : "Compare";
    const full = state.selected.size >= MAX_COMPARE;
    for (const box of tbody.querySelectorAll("input.select-run")) box.disabled = full && !box.checked;
  }

  function row(r) {
    const box = h("input", { type: "checkbox", class: "select-run", checked: state.selected.has(r.id),
      "aria-label": `Select ${r.name} to compare`, onchange: (e) => {
        if (e.target.checked) state.selected.add(r.id); else state.selected.delete(r.id);
        updateCompare();
      } });
    const m = r.metric;
    return h("tr", { dataset: { runId: r.id } },
      h("td", { class: "col-select" }, box),
      h("td", null, statusBadge(r.status)),
      h("td", { class: "name" }, h("a", { href: `#/run/${encodeURIComponent(r.id)}` }, r.name),
        r.trial ? h("span", { class: "pill", title: "a Tune trial" }, "trial") : null),
      h("td", { class: "nowrap" }, fmtTime(r.started)),
      h("td", { class: "num" }, fmtDuration(r.duration_s)),
      h("td", { class: "num" }, r.num_workers ?? "–"),
      h("td", { class: "num" }, r.iterations ?? "–"),
      h("td", { class: "metric-cell" }, m ? [h("span", { class: "metric-name" }, m.name),
        h("span", { class: "metric-last" }, fmtNumber(m.last)), sparkline(m.spark)] : h("span", { class: "muted" }, "–")));
  }

  async function load() {
    try {
      const data = await getJSON("/api/runs");
      if (stopped) return;
      runs = data.runs || [];
      const known = new Set(runs.map((r) => r.id));
      for (const id of [...state.selected]) if (!known.has(id)) state.selected.delete(id);
      document.getElementById("root-path").textContent = data.root || "";
      render();
    } catch (e) {
      if (!stopped) ctx.banner(`Could not list the runs: ${e.message}`);
    }
    if (!stopped) timer = setTimeout(load, REFRESH_MS);
  }
  load();
  return () => { stopped = true; clearTimeout(timer); };
}

/** A small inline SVG line of up to 64 numbers (null: a gap). */
export function sparkline(values, width = 96, height = 22) {
  const el = svg("svg", { class: "spark", width, height, viewBox: `0 0 ${width} ${height}`, "aria-hidden": "true" });
  const ys = (values || []).map((v) => (typeof v === "number" && isFinite(v) ? v : null));
  const finite = ys.filter((v) => v !== null);
  if (finite.length < 2) return el;
  const lo = Math.min(...finite), hi = Math.max(...finite), span = hi - lo || 1;
  const step = width / Math.max(1, ys.length - 1);
  let d = "", pen = false;
  ys.forEach((v, i) => {
    if (v === null) { pen = false; return; }
    const x = (i * step).toFixed(1), y = (height - 2 - ((v - lo) / span) * (height - 4)).toFixed(1);
    d += `${pen ? "L" : "M"}${x} ${y} `;
    pen = true;
  });
  el.append(svg("path", { d: d.trim(), fill: "none", class: "spark-line" }));
  return el;
}
