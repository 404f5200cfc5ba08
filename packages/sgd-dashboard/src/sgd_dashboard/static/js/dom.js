// DOM building: every piece of text goes in as a text node (never innerHTML), so a metric name,
// a log line or a traceback can never become markup.

/** An element: h("td", {class: "num", title: "..."}, "text", childNode, [more]). */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  append(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg"; // a namespace name, never fetched

/** An SVG element with attributes. */
export function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  append(el, children);
  return el;
}

function setProps(el, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "value" || key === "checked" || key === "disabled" || key === "hidden") el[key] = value;
    else if (key === "style") throw new Error("no inline styles (CSP): use a class");
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

/** Append children: strings and numbers as text nodes, arrays flattened, null skipped. */
export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Remove every child. */
export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

/** Text with every (case-insensitive) match of `query` wrapped in <mark>, as DOM nodes. */
export function highlighted(text, query) {
  const frag = document.createDocumentFragment();
  if (!query) { frag.append(document.createTextNode(text)); return frag; }
  const lower = text.toLowerCase(), q = query.toLowerCase();
  let at = 0;
  for (let i = lower.indexOf(q); i >= 0; i = lower.indexOf(q, at)) {
    frag.append(document.createTextNode(text.slice(at, i)), h("mark", null, text.slice(i, i + q.length)));
    at = i + q.length;
  }
  frag.append(document.createTextNode(text.slice(at)));
  return frag;
}

const pad = (n) => String(n).padStart(2, "0");

/** A unix time (s) as local "YYYY-MM-DD HH:MM:SS". */
export function fmtTime(t) {
  if (t === null || t === undefined || !isFinite(t)) return "–";
  const d = new Date(t * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** A unix time (s) as local "HH:MM:SS". */
export function fmtClock(t) {
  if (t === null || t === undefined || !isFinite(t)) return "–";
  const d = new Date(t * 1000);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** Seconds as "3h 02m", "4m 05s", "12.3s". */
export function fmtDuration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${pad(Math.floor(s % 60))}s`;
  const hrs = Math.floor(m / 60);
  if (hrs < 48) return `${hrs}h ${pad(m % 60)}m`;
  return `${Math.floor(hrs / 24)}d ${hrs % 24}h`;
}

/** A metric value, short: 4 significant digits, exponent for very small or large. */
export function fmtNumber(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (!isFinite(v)) return String(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e9) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
  return String(Number(v.toPrecision(4)));
}

/** Bytes as "1.2 MB". */
export function fmtBytes(n) {
  if (n === null || n === undefined || !isFinite(n)) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

const STATUS_CLASS = {
  RUNNING: "running", FINISHED: "finished", ERRORED: "failed", INTERRUPTED: "stopped",
  STOPPED: "stopped", DRIVER_DIED: "died",
};
const STATUS_TEXT = {
  RUNNING: "running", FINISHED: "finished", ERRORED: "failed", INTERRUPTED: "interrupted",
  STOPPED: "stopped", DRIVER_DIED: "driver died",
};

/** The status badge of a run. */
export function statusBadge(status) {
  const s = String(status || "UNKNOWN");
  return h("span", { class: `badge badge-${STATUS_CLASS[s] || "unknown"}`, title: s, dataset: { status: s } },
    STATUS_TEXT[s] || s.toLowerCase());
}

/** A small pill: h("span.pill") with a variant class. */
export function pill(text, variant) {
  return h("span", { class: `pill${variant ? " pill-" + variant : ""}` }, text);
}

/** Eight colours that stay apart on white (Tableau 10, first eight). */
export const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7"];
