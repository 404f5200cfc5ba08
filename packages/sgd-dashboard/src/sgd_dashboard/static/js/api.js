// The server's JSON API (the contract in the package's docs): one place that builds URLs,
// fetches and turns an error body {"error": "..."} into an Error with that message.

/** A URL on this server: path plus query parameters (empty ones left out). */
export function apiUrl(path, params) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, Array.isArray(v) ? v.join(",") : String(v));
  }
  return url.pathname + url.search;
}

/** The path of one run's endpoint: runPath(id, "metrics"). */
export function runPath(id, ...parts) {
  return ["/api/runs", encodeURIComponent(id), ...parts.map(encodeURIComponent)].join("/");
}

/** GET JSON; throws an Error whose message is the server's `error` text. */
export async function getJSON(path, params, init) {
  const resp = await fetch(apiUrl(path, params), { credentials: "same-origin", ...(init || {}) });
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (!resp.ok) {
    const message = body && typeof body.error === "string" ? body.error : `${resp.status} ${resp.statusText}`;
    const err = new Error(message);
    err.status = resp.status;
    throw err;
  }
  return body;
}

/** POST (same origin, cookie sent) and read the JSON answer. */
export function postJSON(path) {
  return getJSON(path, null, { method: "POST" });
}
