// Compare up to eight runs: one chart per chosen metric, one line per run (rank 0).
import { getJSON, runPath } from "./api.js";
import { ChartPanel, chartControls, defaultMetrics } from "./charts.js";
import { PALETTE, clear, fmtTime, h, statusBadge } from "./dom.js";
import { MAX_COMPARE } from "./runs.js";

/** Mount the compare view for the runs `ids`; returns its stop function. */
export function mountCompare(root, ids, ctx) {
  let stopped = false, runs = [], data = new Map();
  const panels = new Map();
  const st = { names: [], x: "iteration", ranks: "0", smoothing: 0, log: false };
  const legend = h("tbody");
  const controlsSlot = h("div", { class: "controls-slot" });
  const grid = h("div", { class: "chart-grid", id: "compare-charts" });
  root.append(h("div", { class: "page-head" }, h("div", null, h("div", { class: "crumbs" }, h("a", { href: "#/runs" }, "Runs"), " / "),
    h("h1", null, "Compare runs"))));
  if (!ids.length) {
    root.append(h("div", { class: "card empty" }, "Tick up to eight runs in the ", h("a", { href: "#/runs" }, "runs list"),
      ", then press Compare."));
    return () => {};
  }
  if (ids.length > MAX_COMPARE) {
    ctx.banner(`${ids.length} runs asked for; the first ${MAX_COMPARE} are compared.`);
    ids = ids.slice(0, MAX_COMPARE);
  }
  root.append(h("div", { class: "card" }, h("table", { class: "table", id: "compare-runs" },
    h("thead", null, h("tr", null, ["", "Status", "Run", "Started", "Iterations", ""].map((t) => h("th", null, t)))), legend)),
  h("div", { class: "card" }, h("div", { class: "toolbar" }, controlsSlot), grid));

  function renderLegend() {
    clear(legend);
    runs.forEach((r, i) => {
      const rest = ids.filter((x) => x !== r.id);
      legend.append(h("tr", { dataset: { runId: r.id } },
        h("td", null, h("span", { class: `swatch swatch-${i}` })),
        h("td", null, statusBadge(r.status)),
        h("td", { class: "name" }, h("a", { href: `#/run/${encodeURIComponent(r.id)}` }, r.name)),
        h("td", { class: "nowrap" }, fmtTime(r.started)),
        h("td", { class: "num" }, r.iterations ?? "–"),
        h("td", null, h("a", { class: "link", href: `#/compare/${rest.map(encodeURIComponent).join(",")}`, title: "Leave this run out" }, "remove"))));
    });
  }

  async function load() {
    data = new Map();
    await Promise.all(runs.map(async (r) => {
      const names = st.names.filter((n) => (r.metrics || []).includes(n));
      if (!names.length) return;
      try {
        const got = await getJSON(runPath(r.id, "metrics"), { names: names.slice(0, 64), x: st.x, ranks: "0", max_points: 2000 });
        data.set(r.id, got.series || []);
      } catch (e) { ctx.banner(`${r.name}: ${e.message}`); }
    }));
    if (!stopped) draw();
  }

  function draw() {
    for (const [name, p] of panels) if (!st.names.includes(name)) { p.destroy(); panels.delete(name); }
    for (const name of st.names) {
      if (!panels.has(name)) panels.set(name, new ChartPanel(grid, name));
      const panel = panels.get(name);
      grid.append(panel.el);
      const lines = [];
      runs.forEach((r, i) => {
        const s = (data.get(r.id) || []).find((x) => x.name === name && (x.rank ?? 0) === 0);
        if (s) lines.push({ label: r.name, color: PALETTE[i % PALETTE.length], x: s.x || [], y: s.y || [] });
      });
      panel.set(lines, { xAxis: st.x, log: st.log, smoothing: st.smoothing, syncKey: "compare" }, []);
    }
  }

  (async () => {
    const got = await Promise.allSettled(ids.map((id) => getJSON(runPath(id))));
    if (stopped) return;
    got.forEach((g, i) => { if (g.status === "rejected") ctx.banner(`Run ${ids[i]}: ${g.reason.message}`); });
    runs = got.filter((g) => g.status === "fulfilled").map((g) => g.value);
    renderLegend();
    const all = [...new Set(runs.flatMap((r) => r.metrics || []))];
    const common = all.filter((n) => runs.every((r) => (r.metrics || []).includes(n)));
    st.names = defaultMetrics(common.length ? common : all);
    controlsSlot.append(chartControls(st, all, (opts) => (opts && opts.redrawOnly ? draw() : load()), { ranks: false }));
    await load();
  })();

  return () => { stopped = true; for (const p of panels.values()) p.destroy(); };
}
