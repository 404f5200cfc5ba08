// One run: header, error, live metric charts with the events timeline, workers, checkpoints,
// events, logs and settings. Live data comes over server-sent events (/stream): report rounds
// are appended to the charts, events to the timeline, without a reload.
import { apiUrl, getJSON, postJSON, runPath } from "./api.js";
import { ChartPanel, chartControls, defaultMetrics } from "./charts.js";
import { CHART_KINDS, Timeline, eventsTable, kindOf, toneOf } from "./events.js";
import { PALETTE, clear, fmtDuration, fmtTime, h, statusBadge } from "./dom.js";
import { mountLogs } from "./logs.js";
import { checkpointRows, settingsTable, workersRows } from "./tables.js";

const MAX_POINTS = 2000;
const REFRESH_MS = 2000;
const MARKER_COLOR = { bad: "#d64545", warn: "#e08a1e", info: "#3a78d8", ok: "#3b9b5a", muted: "#9aa3af" };

/** Mount the run view for run `id`; returns its stop function. */
export function mountRun(root, id, ctx) {
  const st = { names: [], x: "iteration", ranks: "0", smoothing: 0, log: false };
  let detail = null, events = [], picked = null, source = null, stopped = false, timer = null;
  let store = new Map(), pairs = null, loading = null, pending = [], drawQueued = false, reloadQueued = false;
  // where the stream takes over: the byte offsets /metrics and /events answered (then its message ids)
  let resultsOffset = null, eventsOffset = null, streamStatus = null;
  const seen = new Set();
  const panels = new Map();

  const head = h("div", { class: "page-head run-head" });
  const notes = h("div");
  const chartsHead = h("div", { class: "card-head" }, h("h2", null, "Metrics"));
  const live = h("span", { class: "live", id: "live", hidden: true }, "live");
  const exportCsv = h("a", { class: "btn", id: "export-csv", download: "" }, "CSV");
  const exportJson = h("a", { class: "btn", id: "export-json", download: "" }, "JSON");
  const controlsSlot = h("div", { class: "controls-slot" });
  const chartInfo = h("span", { class: "muted", id: "chart-info" });
  const grid = h("div", { class: "chart-grid", id: "charts" });
  const timelineCard = h("div", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Timeline"),
    h("span", { class: "muted" }, "events on the metrics' time axis; dashed lines on the charts")));
  const timeline = new Timeline(timelineCard, (e) => { picked = e; eventsTable(eventsBody, events, picked); });
  const workersBody = h("tbody");
  const ckptBody = h("tbody");
  const eventsBody = h("tbody");
  const logsCard = h("div", { class: "card", id: "logs" });
  const settingsCard = h("details", { class: "card settings", id: "settings" }, h("summary", null, h("h2", null, "Settings")));
  const stacksOut = h("pre", { class: "stacks-out", id: "stacks-out", hidden: true });
  root.append(head, notes,
    h("div", { class: "card", id: "metrics" }, chartsHead, h("div", { class: "toolbar" }, controlsSlot, h("span", { class: "spacer" }),
      chartInfo, live, h("span", { class: "muted" }, "Download"), exportCsv, exportJson), grid),
    timelineCard,
    h("div", { class: "two-col" },
      h("div", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Workers")), h("table", { class: "table", id: "workers-table" },
        h("thead", null, h("tr", null, ["Rank", "Host", "PID", "State", "Since report", "Per iteration", ""].map((t) => h("th", null, t)))), workersBody)),
      h("div", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Checkpoints")), h("table", { class: "table", id: "checkpoints-table" },
        h("thead", null, h("tr", null, ["Name", "Iteration", "Score", "Metrics", "Size", ""].map((t) => h("th", null, t)))), ckptBody))),
    h("div", { class: "card" }, h("div", { class: "card-head" }, h("h2", null, "Events")), h("div", { class: "scroll" },
      h("table", { class: "table", id: "events-table" }, h("thead", null, h("tr", null, h("th", null, "Time"), h("th", null, "Event"), h("th", null, "What happened"))), eventsBody))),
    logsCard, settingsCard, stacksOut);
  const logs = mountLogs(logsCard, id, ctx.banner);

  function renderHead() {
    clear(head);
    const d = detail;
    const ended = d.ended ?? (d.status === "RUNNING" ? Date.now() / 1000 : null);
    const actions = h("div", { class: "actions" }, h("a", { class: "btn", href: `#/compare/${encodeURIComponent(id)}` }, "Compare…"));
    if (d.stacks_allowed) actions.append(h("button", { class: "btn", id: "stacks", onclick: stacks }, "Stacks"));
    head.append(h("div", null, h("div", { class: "crumbs" }, h("a", { href: "#/runs" }, "Runs"), " / "),
      h("h1", { id: "run-name" }, d.name, " ", statusBadge(d.status))),
    h("dl", { class: "meta" },
      [["Started", fmtTime(d.started)], ["Duration", d.started ? fmtDuration((ended ?? d.started) - d.started) : "–"],
        ["Workers", d.num_workers ?? "–"], ["Iterations", d.iterations ?? "–"]].map(([k, v]) => h("div", null, h("dt", null, k), h("dd", null, v)))),
    actions);
  }

  function renderNotes() {
    clear(notes);
    for (const p of detail.problems || []) notes.append(h("div", { class: "note warn" }, String(p)));
    const e = detail.error;
    if (e) {
      notes.append(h("div", { class: "card error-card", id: "run-error" },
        h("h2", null, `${e.error_type || "Error"}`), h("p", { class: "error-message" }, e.message || ""),
        e.traceback ? h("pre", { class: "traceback" }, e.traceback) : null));
    }
  }

  async function loadDetail() {
    detail = await getJSON(runPath(id));
    if (stopped) return;
    // the stream reads status.json itself: newer than a detail answered from the server's index
    if (streamStatus) Object.assign(detail, streamStatus);
    renderHead();
    renderNotes();
    clear(settingsCard).append(h("summary", null, h("h2", null, "Settings")), settingsTable(detail.settings));
  }

  const refreshWorkers = () => getJSON(runPath(id, "workers")).then((d) => !stopped && workersRows(workersBody, d.workers || []))
    .catch((e) => ctx.banner(`Workers: ${e.message}`));
  const refreshCheckpoints = () => getJSON(runPath(id, "checkpoints")).then((d) => !stopped && checkpointRows(ckptBody, d.checkpoints || []))
    .catch((e) => ctx.banner(`Checkpoints: ${e.message}`));

  function addEvents(list) {
    let changed = false;
    for (const e of list) {
      if (!e || typeof e !== "object") continue;
      const key = JSON.stringify([e.time, e.event, e.rank, e.pid, e.attempt, e.checkpoint]);
      if (seen.has(key)) continue;
      seen.add(key);
      events.push(e);
      changed = true;
    }
    if (!changed) return;
    events.sort((a, b) => (a.time || 0) - (b.time || 0));
    eventsTable(eventsBody, events, picked);
    queueDraw();
  }

  // -- metric data: store[name] = Map(rank -> {x, y}) -------------------------------------------
  function addPoints(name, rank, xs, ys) {
    if (!st.names.includes(name)) return;
    if (!store.has(name)) store.set(name, new Map());
    const byRank = store.get(name);
    if (!byRank.has(rank)) byRank.set(rank, { x: [], y: [] });
    const s = byRank.get(rank);
    xs.forEach((x, i) => {
      if (typeof x !== "number") return;
      s.x.push(x);
      s.y.push(ys[i] ?? null);
    });
    if (s.x.length > 4 * MAX_POINTS && !reloadQueued) { reloadQueued = true; setTimeout(() => loadSeries().then(openStream), 0); }
  }

  function pick(d, name) {
    if (name in d) return d[name];
    return name.split("/").reduce((o, k) => (o && typeof o === "object" ? o[k] : undefined), d);
  }

  function addRounds(data) {
    if (loading) { pending.push(data); return; }
    const series = Array.isArray(data) ? (data.length && data[0] && "name" in data[0] ? data : null) : data && data.series;
    const rows = Array.isArray(data) && !series ? data : data && data.rows;
    if (Array.isArray(series)) for (const s of series) addPoints(s.name, s.rank ?? 0, s.x || [], s.y || []);
    else if (Array.isArray(rows)) {
      for (const round of rows) {
        (Array.isArray(round) ? round : [round]).forEach((d, rank) => {
          if (!d || (st.ranks === "0" && rank !== 0)) return;
          const x = st.x === "time" ? d._timestamp : d._training_iteration;
          for (const name of st.names) addPoints(name, rank, [x], [pick(d, name)]);
          if (rank === 0 && pairs && typeof d._timestamp === "number") { pairs[0].push(d._timestamp); pairs[1].push(d._training_iteration); }
        });
      }
    }
    queueDraw();
  }

  async function loadSeries() {
    reloadQueued = false;
    // the stream is opened again after the fetch, from the offset it answers: nothing twice
    if (source) { source.close(); source = null; }
    pending = [];
    const names = st.names.slice();
    const token = {};
    loading = token;
    const fresh = new Map();
    let total = 0, down = false;
    try {
      for (let i = 0; i < names.length; i += 64) {
        const got = await getJSON(runPath(id, "metrics"), { names: names.slice(i, i + 64), x: st.x, ranks: st.ranks, max_points: MAX_POINTS });
        if (i === 0 && typeof got.offset === "number") resultsOffset = got.offset;
        total += got.total_points || 0;
        down = down || !!got.downsampled;
        for (const s of got.series || []) {
          if (!fresh.has(s.name)) fresh.set(s.name, new Map());
          fresh.get(s.name).set(s.rank ?? 0, { x: (s.x || []).slice(), y: (s.y || []).slice() });
        }
      }
      pairs = null;
      if (st.x === "iteration" && names.length) {
        const got = await getJSON(runPath(id, "metrics"), { names: names[0], x: "time", ranks: "0", max_points: MAX_POINTS });
        const t = (got.series || [])[0], it = fresh.get(names[0]) && fresh.get(names[0]).get(0);
        if (t && it && t.x.length === it.x.length) pairs = [t.x.slice(), it.x.slice()];
      }
    } catch (e) {
      if (!stopped) ctx.banner(`Metrics: ${e.message}`);
    }
    if (loading !== token || stopped) return;
    store = fresh;
    loading = null;
    chartInfo.textContent = down ? `downsampled on the server from ${total.toLocaleString()} points` : "";
    for (const data of pending.splice(0)) addRounds(data);
    draw();
  }

  // -- drawing ------------------------------------------------------------------------------------
  function timeToX(t) {
    if (st.x === "time") return t;
    if (!pairs || !pairs[0].length) return null;
    const [ts, its] = pairs;
    let lo = 0, hi = ts.length - 1;
    if (t <= ts[0]) return its[0];
    // after the pairs fetched with the series: a live event, at the iteration the run is at now
    if (t > ts[hi]) return latestIteration() ?? its[hi];
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (ts[mid] <= t) lo = mid; else hi = mid - 1; }
    return its[lo];
  }

  function latestIteration() {
    let most = null;
    for (const byRank of store.values()) for (const s of byRank.values()) {
      const x = s.x[s.x.length - 1];
      if (typeof x === "number" && (most === null || x > most)) most = x;
    }
    return most;
  }

  function queueDraw() {
    if (drawQueued) return;
    drawQueued = true;
    requestAnimationFrame(() => { drawQueued = false; if (!stopped) draw(); });
  }

  function draw() {
    const markers = events.filter((e) => CHART_KINDS.has(kindOf(e)) && typeof e.time === "number")
      .map((e) => ({ x: timeToX(e.time), color: MARKER_COLOR[toneOf(kindOf(e))] }));
    for (const [name, panel] of panels) if (!st.names.includes(name)) { panel.destroy(); panels.delete(name); }
    if (!st.names.length) {
      clear(grid).append(h("p", { class: "muted empty" }, detail && detail.metrics.length ? "Choose metrics to chart." : "This run has reported no numeric metric yet."));
      panels.clear();
    } else {
      const hint = grid.querySelector(".empty");
      if (hint) hint.remove();
    }
    let t0 = Infinity, t1 = -Infinity;
    for (const name of st.names) {
      if (!panels.has(name)) panels.set(name, new ChartPanel(grid, name));
      const panel = panels.get(name);
      grid.append(panel.el);
      const byRank = store.get(name) || new Map();
      const lines = [...byRank.entries()].sort((a, b) => a[0] - b[0]).map(([rank, s], i) => ({
        label: `rank ${rank}`, color: PALETTE[i % PALETTE.length], x: s.x, y: s.y }));
      panel.set(lines, { xAxis: st.x, log: st.log, smoothing: st.smoothing, syncKey: `run-${id}` }, markers);
      if (st.x === "time") for (const l of lines) if (l.x.length) { t0 = Math.min(t0, l.x[0]); t1 = Math.max(t1, l.x[l.x.length - 1]); }
    }
    if (st.x !== "time" && pairs && pairs[0].length) { t0 = pairs[0][0]; t1 = pairs[0][pairs[0].length - 1]; }
    timeline.set(events, isFinite(t0) ? [t0, t1] : null);
    const q = { names: st.names, x: st.x, ranks: st.ranks };
    exportCsv.href = apiUrl(runPath(id, "export"), { ...q, format: "csv" });
    exportJson.href = apiUrl(runPath(id, "export"), { ...q, format: "json" });
  }

  // -- live ---------------------------------------------------------------------------------------
  function openStream() {
    if (source) source.close();
    source = null;
    live.hidden = true;
    if (!detail || detail.status !== "RUNNING") return;
    source = new EventSource(apiUrl(runPath(id, "stream"), { names: st.names.slice(0, 64), x: st.x, ranks: st.ranks,
      offset: resultsOffset, events_offset: eventsOffset }));
    const parse = (ev) => {
      const m = /^r(\d+)\.e(\d+)$/.exec(ev.lastEventId || "");
      if (m) { resultsOffset = Number(m[1]); eventsOffset = Number(m[2]); }
      try { return JSON.parse(ev.data); } catch (e) { return null; }
    };
    source.onopen = () => { live.hidden = false; live.classList.remove("stale"); };
    source.onerror = () => live.classList.add("stale");
    source.addEventListener("rounds", (ev) => addRounds(parse(ev)));
    // too far behind to catch up by rows: fetch the (downsampled) series again
    source.addEventListener("reset", (ev) => { parse(ev); loadSeries().then(openStream); });
    source.addEventListener("events", (ev) => {
      const d = parse(ev);
      const list = Array.isArray(d) ? d : (d && d.events) || [];
      addEvents(list);
      if (list.some((e) => /worker|attempt|restart|reform|resize|host/.test(kindOf(e)))) { refreshWorkers(); logs.refresh(); }
      if (list.some((e) => kindOf(e).startsWith("checkpoint"))) refreshCheckpoints();
    });
    source.addEventListener("status", (ev) => {
      const d = parse(ev);
      const status = typeof d === "string" ? d : d && d.status;
      if (status && detail && status !== detail.status) {
        streamStatus = { status, ended: (d && d.ended) ?? null };
        Object.assign(detail, streamStatus);
        renderHead();
        loadDetail().then(() => { refreshWorkers(); refreshCheckpoints(); if (status !== "RUNNING") openStream(); });
      }
    });
  }

  function onControls(opts) {
    if (opts && opts.redrawOnly) { draw(); return; }
    loadSeries().then(() => openStream());
  }

  async function stacks() {
    stacksOut.hidden = false;
    clear(stacksOut).append("Asking the workers for their stacks (up to 30 s)…");
    try {
      const got = await postJSON(runPath(id, "stacks"));
      clear(stacksOut).append(typeof got === "string" ? got : got.text || got.stacks || JSON.stringify(got, null, 2));
    } catch (e) {
      clear(stacksOut).append(`Stacks: ${e.message}`);
    }
  }

  function tick() {
    if (stopped) return;
    if (detail && detail.status === "RUNNING") { refreshWorkers(); renderHead(); }
    timer = setTimeout(tick, REFRESH_MS);
  }

  (async () => {
    try {
      await loadDetail();
    } catch (e) {
      clear(root).append(h("div", { class: "card error-card" }, h("h2", null, "Cannot show this run"), h("p", null, e.message),
        h("a", { href: "#/runs" }, "Back to the runs")));
      return;
    }
    st.names = defaultMetrics(detail.metrics || []);
    controlsSlot.append(chartControls(st, detail.metrics || [], onControls));
    refreshWorkers();
    refreshCheckpoints();
    try {
      const got = await getJSON(runPath(id, "events"));
      if (typeof got.offset === "number") eventsOffset = got.offset;
      addEvents(got.events || []);
    } catch (e) { ctx.banner(`Events: ${e.message}`); }
    await loadSeries();
    openStream();
    tick();
  })();

  return () => {
    stopped = true;
    clearTimeout(timer);
    if (source) source.close();
    logs.stop();
    for (const p of panels.values()) p.destroy();
  };
}
