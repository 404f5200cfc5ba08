// The sgd dashboard's page: a hash router over three views (runs, one run, compare). Each view's
// mount() returns a function that stops what it started (timers, event streams, charts).
import { clear, h } from "./js/dom.js";
import { mountRuns } from "./js/runs.js";
import { mountRun } from "./js/run.js";
import { mountCompare } from "./js/compare.js";

const app = document.getElementById("app");
let stop = null;

/** Show an error in the banner at the top of the page (text only). */
export function showBanner(message) {
  const banner = document.getElementById("banner");
  clear(banner);
  if (!message) { banner.hidden = true; return; }
  banner.append(h("span", null, message), h("button", { class: "link", onclick: () => showBanner(null) }, "dismiss"));
  banner.hidden = false;
}

function route() {
  if (stop) { try { stop(); } catch (e) { console.error(e); } stop = null; }
  showBanner(null);
  const hash = window.location.hash.replace(/^#\/?/, "");
  const [view, ...rest] = hash.split("/");
  const arg = decodeURIComponent(rest.join("/"));
  for (const [id, on] of [["nav-runs", view === "" || view === "runs" || view === "run"], ["nav-compare", view === "compare"]]) {
    document.getElementById(id).classList.toggle("active", on);
  }
  clear(app);
  const ctx = { banner: showBanner };
  if (view === "run" && arg) stop = mountRun(app, arg, ctx);
  else if (view === "compare") stop = mountCompare(app, arg ? arg.split(",").filter(Boolean) : [], ctx);
  else stop = mountRuns(app, ctx);
  window.scrollTo(0, 0);
}

window.addEventListener("hashchange", route);
route();
