// Metric charts on uPlot (vendored, global `uPlot`): one panel per metric, one line per rank or
// per run. Lines are smoothed here (EMA, debiased as TensorBoard's) with the raw line kept faint;
// event markers are drawn across the plot by a small uPlot plugin.
import { h, fmtNumber } from "./dom.js";

/** Finite numbers stay, anything else (null, "nan", strings) becomes null: a gap. */
export function clean(ys, log) {
  return ys.map((v) => (typeof v === "number" && isFinite(v) && (!log || v > 0) ? v : null));
}

/** Exponential moving average with debiasing; nulls stay gaps and do not move the average. */
export function ema(ys, weight) {
  if (!(weight > 0)) return ys;
  let last = 0, n = 0;
  return ys.map((v) => {
    if (v === null) return null;
    last = last * weight + (1 - weight) * v;
    n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}

/**
 * x ascending. By iteration a later report of the same x (a restart goes back to its checkpoint)
 * replaces the earlier one; by time (whole seconds: several reports may share one) all are kept.
 */
export function ordered(xs, ys, dedupe) {
  let sorted = true;
  for (let i = 1; i < xs.length; i++) if (dedupe ? !(xs[i] > xs[i - 1]) : xs[i] < xs[i - 1]) { sorted = false; break; }
  if (sorted) return [xs, ys];
  if (!dedupe) {
    const idx = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b] || a - b);
    return [idx.map((i) => xs[i]), idx.map((i) => ys[i])];
  }
  const byX = new Map();
  xs.forEach((x, i) => { if (typeof x === "number" && isFinite(x)) byX.set(x, ys[i]); });
  const keys = [...byX.keys()].sort((a, b) => a - b);
  return [keys, keys.map((k) => byX.get(k))];
}

/** Align [x, y] tables on one x: a missing point is `undefined` (joined over), null stays a gap. */
export function join(tables) {
  if (tables.length === 1) return tables[0].slice();
  const all = new Set();
  for (const [xs] of tables) for (const x of xs) all.add(x);
  const x = [...all].sort((a, b) => a - b);
  const at = new Map(x.map((v, i) => [v, i]));
  const out = [x];
  for (const [xs, ...cols] of tables) {
    for (const ys of cols) {
      const col = new Array(x.length).fill(undefined);
      xs.forEach((v, i) => { col[at.get(v)] = ys[i]; });
      out.push(col);
    }
  }
  return out;
}

function markersPlugin(panel) {
  return {
    hooks: {
      draw: (u) => {
        const marks = panel.markers || [];
        if (!marks.length) return;
        const { ctx } = u;
        const { top, height } = u.bbox;
        ctx.save();
        ctx.lineWidth = Math.max(1, devicePixelRatio);
        ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
        for (const m of marks) {
          if (m.x === null || m.x === undefined || m.x < u.scales.x.min || m.x > u.scales.x.max) continue;
          const x = Math.round(u.valToPos(m.x, "x", true));
          ctx.strokeStyle = m.color;
          ctx.beginPath();
          ctx.moveTo(x, top);
          ctx.lineTo(x, top + height);
          ctx.stroke();
        }
        ctx.restore();
      },
    },
  };
}

/**
 * One chart panel. `lines` are {label, color, x, y}; options {xAxis, log, smoothing, syncKey}.
 * set() rebuilds the data; the uPlot is made again only when its shape changes.
 */
export class ChartPanel {
  constructor(parent, title, extra) {
    this.title = title;
    this.u = null;
    this.shape = "";
    this.markers = [];
    this.body = h("div", { class: "chart-body" });
    this.info = h("span", { class: "chart-info muted" });
    this.el = h("div", { class: "card chart-panel", dataset: { metric: title } },
      h("div", { class: "chart-head" }, h("span", { class: "chart-title", title }, title), this.info, extra || null),
      this.body);
    parent.append(this.el);
    this.resize = new ResizeObserver(() => this.fit());
    this.resize.observe(this.body);
  }

  fit() {
    if (this.u) {
      const width = Math.max(200, this.body.clientWidth);
      if (Math.abs(width - this.u.width) > 1) this.u.setSize({ width, height: this.u.height });
    }
  }

  /** Draw `lines` with `opts`; `markers` are {x, color} vertical lines. */
  set(lines, opts, markers) {
    this.markers = markers || [];
    const smoothing = opts.smoothing || 0;
    const tables = [], series = [{ label: opts.xAxis === "time" ? "time" : "iteration",
      value: opts.xAxis === "time" ? undefined : (u, v) => (v === null || v === undefined ? "–" : String(v)) }];
    let points = 0;
    for (const line of lines) {
      const [xs, ys] = ordered(line.x, clean(line.y, opts.log), opts.xAxis !== "time");
      points += xs.length;
      if (smoothing > 0) {
        tables.push([xs, ema(ys, smoothing), ys]);
        series.push({ label: line.label, stroke: line.color, width: 1.75, points: { show: false } },
          { label: `${line.label} (raw)`, stroke: line.color + "40", width: 1, points: { show: false }, raw: true });
      } else {
        tables.push([xs, ys]);
        series.push({ label: line.label, stroke: line.color, width: 1.5 });
      }
    }
    this.info.textContent = `${points.toLocaleString()} points`;
    const data = tables.length ? join(tables) : [[]];
    const shape = JSON.stringify([series.map((s) => s.label + s.stroke), opts.xAxis, !!opts.log]);
    if (this.u && shape === this.shape) {
      this.u.setData(data);
      return;
    }
    this.shape = shape;
    if (this.u) this.u.destroy();
    const axisStyle = { stroke: "#5b6474", grid: { stroke: "#edf0f4", width: 1 }, ticks: { stroke: "#dfe3e9", width: 1 },
      font: "11px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif" };
    this.u = new uPlot({
      width: Math.max(200, this.body.clientWidth || 480),
      height: 230,
      cursor: { sync: { key: opts.syncKey || "sgd" }, drag: { x: true, y: false } },
      scales: { x: { time: opts.xAxis === "time" }, y: opts.log ? { distr: 3 } : {} },
      axes: [axisStyle, { ...axisStyle, size: 64, values: (u, vals) => vals.map(fmtNumber) }],
      series,
      legend: { live: true },
      plugins: [markersPlugin(this)],
    }, data, this.body);
    this.u.root.querySelectorAll(".u-legend .u-series").forEach((row, i) => {
      if (series[i] && series[i].raw) row.classList.add("legend-raw");
    });
  }

  destroy() {
    this.resize.disconnect();
    if (this.u) this.u.destroy();
    this.u = null;
    this.el.remove();
  }
}

const HEADLINE = ["loss", "train_loss", "val_loss", "eval_loss", "accuracy", "acc"];

/** The first `n` metrics to show by default: the usual headline names first, then in order. */
export function defaultMetrics(names, n = 4) {
  const first = HEADLINE.filter((m) => names.includes(m));
  return [...new Set([...first, ...names])].slice(0, n);
}

/**
 * The chart controls: metric picker (filterable checkboxes), x axis, ranks (optional), smoothing,
 * log scale. `state` is changed in place and `onChange()` called after each change.
 */
export function chartControls(state, names, onChange, { ranks = true } = {}) {
  const summary = h("summary", { class: "btn" });
  const list = h("div", { class: "picker-list" });
  const filter = h("input", { type: "search", placeholder: "Filter metrics…", "aria-label": "Filter metrics",
    oninput: () => fill() });
  const picker = h("details", { class: "picker", id: "metric-picker" }, summary,
    h("div", { class: "picker-pop" }, filter, list));
  const SHOWN = 300;
  function label() { summary.textContent = `Metrics: ${state.names.length} of ${names.length} ▾`; }
  function fill() {
    while (list.firstChild) list.removeChild(list.firstChild);
    const q = filter.value.trim().toLowerCase();
    const match = names.filter((n) => !q || n.toLowerCase().includes(q));
    for (const name of match.slice(0, SHOWN)) {
      const box = h("input", { type: "checkbox", checked: state.names.includes(name), value: name, onchange: (e) => {
        state.names = e.target.checked ? [...state.names, name] : state.names.filter((n) => n !== name);
        label();
        onChange();
      } });
      list.append(h("label", { class: "picker-item", title: name }, box, h("span", null, name)));
    }
    if (match.length > SHOWN) list.append(h("div", { class: "muted" }, `${match.length - SHOWN} more: narrow the filter`));
    if (!match.length) list.append(h("div", { class: "muted" }, "No metric matches."));
  }
  label();
  fill();
  const xSel = h("select", { "aria-label": "x axis", id: "x-axis", onchange: (e) => { state.x = e.target.value; onChange(); } },
    h("option", { value: "iteration" }, "x: iteration"), h("option", { value: "time" }, "x: time"));
  xSel.value = state.x;
  const rankSel = ranks ? h("select", { "aria-label": "ranks", id: "ranks", onchange: (e) => { state.ranks = e.target.value; onChange(); } },
    h("option", { value: "0" }, "rank 0"), h("option", { value: "all" }, "all ranks")) : null;
  if (rankSel) rankSel.value = state.ranks;
  const smoothValue = h("span", { class: "smooth-value" }, state.smoothing.toFixed(2));
  let pending = null;
  const slider = h("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: String(state.smoothing),
    id: "smoothing", "aria-label": "smoothing", oninput: (e) => {
      state.smoothing = Number(e.target.value);
      smoothValue.textContent = state.smoothing.toFixed(2);
      cancelAnimationFrame(pending);
      pending = requestAnimationFrame(() => onChange({ redrawOnly: true }));
    } });
  const log = h("input", { type: "checkbox", id: "log-scale", checked: state.log, onchange: (e) => {
    state.log = e.target.checked; onChange({ redrawOnly: true });
  } });
  return h("div", { class: "chart-controls" }, picker, xSel, rankSel,
    h("label", { class: "control" }, "Smoothing ", slider, smoothValue),
    h("label", { class: "control" }, log, " log scale"));
}
