// Per-rank logs, one per (rank, attempt): read in capped chunks by offset, followed while the run
// goes (only what was appended is fetched), searched on the server.
import { getJSON, runPath } from "./api.js";
import { clear, fmtBytes, h, highlighted } from "./dom.js";

const FOLLOW_MS = 1000;
const MAX_CHARS = 2_000_000; // what the page keeps of one log; older text is dropped

/** Mount the logs panel into `card`; returns its stop function. */
export function mountLogs(card, runId, banner) {
  let logs = [], current = null, offset = 0, size = 0, timer = null, stopped = false, text = "", fromStart = false, generation = 0;
  const select = h("select", { id: "log-select", "aria-label": "log", onchange: () => open(select.value) });
  const search = h("input", { type: "search", id: "log-search", placeholder: "Search this log…", "aria-label": "Search the log",
    onchange: () => open(current), onsearch: () => open(current) });
  const follow = h("input", { type: "checkbox", id: "log-follow", onchange: () => schedule() });
  const more = h("button", { class: "btn", hidden: true, onclick: () => read(false) }, "Load more");
  const start = h("button", { class: "btn", hidden: true, id: "log-start", onclick: () => { fromStart = true; open(current); } }, "From the start");
  const info = h("span", { class: "muted" });
  const view = h("pre", { class: "log-view", id: "log-view", tabindex: "0" });
  card.append(h("div", { class: "card-head" }, h("h2", null, "Logs"), h("span", { class: "spacer" }), select, search,
    h("label", { class: "control" }, follow, " follow"), info), view, h("div", { class: "toolbar" }, start, more));

  async function list() {
    try {
      logs = (await getJSON(runPath(runId, "logs"))).logs || [];
    } catch (e) { banner(`Logs: ${e.message}`); return; }
    if (stopped) return;
    const keep = current;
    clear(select);
    for (const l of logs) select.append(h("option", { value: l.id }, `rank ${l.rank ?? "?"} · attempt ${l.attempt ?? "?"} · ${fmtBytes(l.bytes)}`));
    if (!logs.length) { clear(view).append("No per-rank logs in this run folder."); return; }
    // first the latest attempt of the lowest rank: what the run is doing now
    const first = logs.filter((l) => l.rank === logs[0].rank).pop();
    const pick = logs.find((l) => l.id === keep) ? keep : first.id;
    select.value = pick;
    if (pick !== current) open(pick);
  }

  function open(id) {
    generation += 1; // an answer still on its way for the log shown before is dropped
    current = id;
    offset = 0;
    text = "";
    clear(view);
    read(true);
  }

  async function read(first) {
    if (!current) return;
    const q = search.value.trim();
    const mine = generation;
    let got;
    try {
      // a log opens at its end (the last chunk), as `tail` does; a search goes from the start
      got = await getJSON(runPath(runId, "logs", current), { offset, q, tail: first && !q && !fromStart ? 1 : "" });
    } catch (e) { if (!stopped) banner(`Log: ${e.message}`); return; }
    if (stopped || mine !== generation) return;
    const chunk = String(got.text || "");
    if (first) start.hidden = !(typeof got.start === "number" && got.start > 0);
    fromStart = false;
    offset = typeof got.offset === "number" ? got.offset : offset + chunk.length;
    size = typeof got.size === "number" ? got.size : offset;
    if (chunk) {
      const atBottom = view.scrollTop + view.clientHeight >= view.scrollHeight - 8;
      text += chunk;
      if (text.length > MAX_CHARS) {
        text = text.slice(text.length - MAX_CHARS);
        clear(view).append(highlighted(text, q));
      } else {
        view.append(highlighted(chunk, q));
      }
      if (follow.checked && (atBottom || first)) view.scrollTop = view.scrollHeight;
    } else if (first) {
      view.append(h("span", { class: "muted" }, q ? `No line matches "${q}".` : "(empty)"));
    }
    more.hidden = offset >= size;
    info.textContent = q ? `searched ${fmtBytes(offset)} of ${fmtBytes(size)}` : fmtBytes(size);
    schedule();
  }

  function schedule() {
    clearTimeout(timer);
    if (!stopped && follow.checked) timer = setTimeout(() => read(false), FOLLOW_MS);
  }

  list();
  return { stop: () => { stopped = true; clearTimeout(timer); }, refresh: list };
}
