// A run's events (events.jsonl, format 1): one sentence per event, the timeline strip and the
// events table. Fields may be missing (older writers) and kinds unknown to this page are shown
// generically: nothing here may throw on an event's shape.
import { clear, fmtClock, fmtTime, h } from "./dom.js";

/** Which lane of the timeline a kind goes in, and its colour class. */
const KINDS = {
  run_started: ["run", "info"], run_finished: ["run", "ok"], run_failed: ["run", "bad"],
  run_stopped: ["run", "warn"], run_interrupted: ["run", "warn"], driver_died: ["run", "bad"],
  attempt_started: ["workers", "info"], worker_failed: ["workers", "bad"], restart: ["workers", "warn"],
  reformed: ["workers", "warn"], resize: ["workers", "warn"], hang: ["workers", "bad"],
  host_lost: ["hosts", "bad"], drain_notice: ["hosts", "warn"],
  checkpoint_persisted: ["checkpoints", "ok"], checkpoint_deleted: ["checkpoints", "muted"],
  checkpoint_rejected: ["checkpoints", "bad"],
};
const LANES = ["run", "workers", "hosts", "checkpoints", "other"];

/** Kinds drawn as a vertical line across the metric charts too. */
export const CHART_KINDS = new Set(["attempt_started", "worker_failed", "restart", "reformed", "resize",
  "host_lost", "hang", "run_failed", "driver_died"]);

export function kindOf(ev) {
  return typeof ev.event === "string" ? ev.event : "unknown";
}

export function laneOf(kind) {
  return (KINDS[kind] || ["other", "muted"])[0];
}

export function toneOf(kind) {
  return (KINDS[kind] || ["other", "muted"])[1];
}

const str = (v) => (v === undefined || v === null ? "?" : String(v));
const pids = (list) => (Array.isArray(list) ? list : []).map((w) => `rank ${str(w && w.rank)}: pid ${str(w && w.pid)}${w && w.host ? " on " + w.host : ""}`).join(", ");

/** One sentence saying what the event is (plain text). */
export function describe(ev) {
  const k = kindOf(ev);
  switch (k) {
    case "run_started":
      return `driver pid ${str(ev.pid)} on ${str(ev.host)} started the run with ${str(ev.num_workers)} workers` +
        (ev.resumed_iteration ? `, resumed at iteration ${ev.resumed_iteration}` : "") +
        (ev.driver_attempt > 1 ? ` (driver attempt ${ev.driver_attempt})` : "");
    case "attempt_started":
      return `attempt ${str(ev.attempt)}: ${str(ev.num_workers)} workers from iteration ${str(ev.iteration)}` +
        (ev.checkpoint ? ` (${ev.checkpoint})` : "") + (Array.isArray(ev.workers) && ev.workers.length ? ` — ${pids(ev.workers)}` : "");
    case "worker_failed":
      return `rank ${str(ev.rank)} (pid ${str(ev.pid)} on ${str(ev.host)}) ${ev.died ? "died" : "failed"}` +
        (ev.phase ? ` in ${ev.phase}` : "") + (ev.error_type || ev.message ? `: ${ev.error_type || ""}${ev.message ? ": " + ev.message : ""}` : "");
    case "host_lost":
      return `host ${str(ev.node_ip)} lost` + (Array.isArray(ev.ranks) ? ` (ranks ${ev.ranks.join(", ")})` : "");
    case "drain_notice":
      return `drain notice for ${(Array.isArray(ev.hosts) ? ev.hosts : []).map((x) => str(x && x.node_ip)).join(", ") || "?"}`;
    case "resize":
      return `resize ${str(ev.from)} → ${str(ev.to)} workers` + (ev.reason ? ` (${ev.reason})` : "");
    case "reformed":
      return `re-formed in place ${str(ev.from)} → ${str(ev.to)} workers, attempt ${str(ev.attempt)}` +
        (Array.isArray(ev.survivors) && ev.survivors.length ? ` — survivors ${pids(ev.survivors)}` : "");
    case "restart":
      return `restart: attempt ${str(ev.attempt)}` + (ev.max_failures !== undefined ? ` (max_failures ${ev.max_failures})` : "") +
        ` from ${ev.checkpoint ? ev.checkpoint : "the start"}, iteration ${str(ev.iteration)}, ${str(ev.num_workers)} workers`;
    case "checkpoint_persisted":
      return `${str(ev.checkpoint)} persisted at iteration ${str(ev.iteration)}`;
    case "checkpoint_deleted":
      return `${str(ev.checkpoint)} deleted (iteration ${str(ev.iteration)})`;
    case "checkpoint_rejected":
      return `${str(ev.checkpoint)} rejected: ${str(ev.reason)}`;
    case "hang":
      return `hang: no report for ${str(ev.timeout_s)} s` + (Array.isArray(ev.stragglers) ? `, stragglers ${ev.stragglers.join(", ")}` : "");
    case "run_finished": return "the run finished";
    case "run_failed": return `the run failed: ${ev.error_type || "error"}${ev.message ? ": " + ev.message : ""}`;
    case "run_stopped": return "the run was stopped";
    case "run_interrupted": return "the run was interrupted";
    case "driver_died":
      return `the driver (pid ${str(ev.pid)} on ${str(ev.host)}, attempt ${str(ev.driver_attempt)}) died without closing the run`;
    default: {
      const rest = Object.fromEntries(Object.entries(ev).filter(([key]) => !["v", "time", "event"].includes(key)));
      return `${k} ${JSON.stringify(rest)}`;
    }
  }
}

/**
 * The timeline: one lane per kind of thing (run, workers, hosts, checkpoints, other), each event a
 * marker at its time; attempts drawn as spans. `range` is [t0, t1] in unix seconds.
 */
export class Timeline {
  constructor(parent, onPick) {
    this.onPick = onPick;
    this.events = [];
    this.range = null;
    this.el = h("div", { class: "timeline", id: "timeline", "aria-label": "Timeline of the run's events" });
    parent.append(this.el);
  }

  set(events, range) {
    this.events = events;
    this.range = range;
    this.render();
  }

  render() {
    clear(this.el);
    const evs = this.events.filter((e) => typeof e.time === "number" && isFinite(e.time));
    if (!evs.length) {
      this.el.append(h("div", { class: "muted timeline-empty" }, "No events recorded for this run (events.jsonl is written by sgd ≥ 0.1 controllers)."));
      return;
    }
    let [t0, t1] = this.range || [evs[0].time, evs[evs.length - 1].time];
    t0 = Math.min(t0, evs[0].time);
    t1 = Math.max(t1, evs[evs.length - 1].time);
    const span = t1 - t0 || 1;
    const pct = (t) => `${(((t - t0) / span) * 100).toFixed(3)}%`;
    const used = new Set(evs.map((e) => laneOf(kindOf(e))));
    for (const lane of LANES.filter((l) => used.has(l) || l === "run" || l === "workers")) {
      const track = h("div", { class: "tl-track" });
      if (lane === "workers") {
        const starts = evs.filter((e) => kindOf(e) === "attempt_started");
        starts.forEach((e, i) => {
          const end = i + 1 < starts.length ? starts[i + 1].time : t1;
          const bar = h("div", { class: "tl-span", title: `attempt ${str(e.attempt)}` }, `attempt ${str(e.attempt)}`);
          bar.style.left = pct(e.time);
          bar.style.width = `${Math.max(0.5, ((end - e.time) / span) * 100).toFixed(3)}%`;
          track.append(bar);
        });
      }
      evs.forEach((e, i) => {
        if (laneOf(kindOf(e)) !== lane) return;
        const k = kindOf(e);
        const marker = h("button", { class: `tl-marker tone-${toneOf(k)}`, dataset: { kind: k, index: i },
          title: `${fmtTime(e.time)} — ${k}: ${describe(e)}`, "aria-label": `${k} at ${fmtClock(e.time)}`,
          onclick: () => this.onPick && this.onPick(e) });
        marker.style.left = pct(e.time);
        track.append(marker);
      });
      this.el.append(h("div", { class: "tl-lane", dataset: { lane } }, h("div", { class: "tl-label" }, lane), track));
    }
    const axis = h("div", { class: "tl-track tl-axis" });
    for (let i = 0; i <= 4; i++) {
      const tick = h("span", { class: "tl-tick" }, fmtClock(t0 + (span * i) / 4));
      tick.style.left = `${i * 25}%`;
      axis.append(tick);
    }
    this.el.append(h("div", { class: "tl-lane" }, h("div", { class: "tl-label" }), axis));
  }
}

/** The events as table rows (newest last), the row of `picked` highlighted. */
export function eventsTable(tbody, events, picked) {
  clear(tbody);
  const shown = events.slice(-1000);
  for (const e of shown) {
    const k = kindOf(e);
    const tr = h("tr", { class: e === picked ? "picked" : "", dataset: { kind: k } },
      h("td", { class: "nowrap" }, fmtTime(e.time)),
      h("td", null, h("span", { class: `kind tone-${toneOf(k)}` }, k)),
      h("td", { class: "event-text" }, describe(e)));
    if ((k === "worker_failed" || k === "run_failed") && e.traceback) {
      tr.lastChild.append(h("details", { class: "tb" }, h("summary", null, "traceback"), h("pre", null, String(e.traceback))));
    }
    tbody.append(tr);
    if (e === picked) tr.scrollIntoView({ block: "nearest" });
  }
}
