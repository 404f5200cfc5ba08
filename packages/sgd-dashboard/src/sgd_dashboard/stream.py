"""The live parts: ``GET /api/runs/<id>/stream`` (server-sent events) and the opt-in
``POST /api/runs/<id>/stacks``.

A stream follows the run's ``results.jsonl`` and ``events.jsonl`` from byte offsets (each poll
reads only what was appended, a complete line at a time) and sends:

- ``rounds``: ``{"offset", "rows", "series": [{"name", "rank", "x", "y"}]}``, the new report rows
  shaped like ``/metrics`` series (for the ``names``/``x``/``ranks`` the stream was opened with);
- ``events``: ``{"events": [...], "bad_lines": n}``, the new events;
- ``status``: ``{"status", "ended"}`` when the run's status changes (and once at the start);
- ``reset``: ``{"offset"}`` when the client is too far behind to catch up by rows (it should
  fetch ``/metrics`` again).

Every message has an ``id:`` (``r<results offset>.e<events offset>``): a browser that reconnects
sends it back as ``Last-Event-ID`` and the stream resumes there, losing nothing. Without one, it
starts at ``offset=``/``events_offset=`` (what ``/metrics`` and ``/events`` answered), else at the
files' ends. A comment every 15 s keeps proxies from closing an idle stream. Per client the server
keeps two offsets and the status: following a run for an hour does not grow its memory.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import time
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sgd import runs
from sgd_dashboard.app import Dashboard, Json, clean, error
from sgd_dashboard.columns import RunColumns
from sgd_dashboard.files import OutsideRoot, read_bytes, read_json, stat_key
from sgd_dashboard.index import RunEntry, status_of
from sgd_dashboard.rounds import complete_lines
from sgd_dashboard.series import BadQuery, Query, parse_query, series_of

#: Bytes of new results one message carries at most (a client further behind catches up over several).
STEP_BYTES = 1 << 20
#: A client further behind than this gets a ``reset`` (fetch ``/metrics`` again) instead of rows.
RESET_BYTES = 32 << 20
_LAST_ID = re.compile(r"^r(\d{1,15})\.e(\d{1,15})$")


def _offsets(request: Request, entry: RunEntry) -> Tuple[int, int]:
    """Where the stream starts: ``Last-Event-ID``, else the ``offset``/``events_offset`` parameters,
    else the files' ends (complete lines).

    :raises BadQuery: one of them is malformed.
    """
    last = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
    if last:
        m = _LAST_ID.match(last.strip())
        if not m:
            raise BadQuery(f"Last-Event-ID {last!r} is not one this server sent (r<bytes>.e<bytes>): reconnect "
                           "without it")
        return int(m.group(1)), int(m.group(2))
    out = []
    for name, fname in (("offset", runs.RESULTS_FILE), ("events_offset", runs.EVENTS_FILE)):
        text = request.query_params.get(name)
        if text:
            try:
                value = int(text)
            except ValueError:
                raise BadQuery(f"{name}={text!r} is not a whole number of bytes") from None
            if value < 0:
                raise BadQuery(f"{name}={value}: an offset is 0 or more")
            out.append(value)
        else:
            out.append(_end_of_lines(entry, fname))
    return out[0], out[1]


def _end_of_lines(entry: RunEntry, fname: str) -> int:
    key = stat_key(entry.path / fname)
    if key is None:
        return 0
    size = key[0]
    back = min(size, 1 << 20)
    try:
        with open(entry.path / fname, "rb") as f:
            f.seek(size - back)
            tail = f.read(back)
    except OSError:
        return 0
    return size - back + tail.rfind(b"\n") + 1


def _sse(kind: str, data: Any, ident: str) -> str:
    body = json.dumps(clean(data), ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str)
    return f"id: {ident}\nevent: {kind}\ndata: {body}\n\n"


class Follower:
    """One client's position in a run (two byte offsets and the status it was last sent)."""

    def __init__(self, dashboard: Dashboard, entry: RunEntry, query: Optional[Query], offsets: Tuple[int, int]):
        self.dashboard = dashboard
        self.root = dashboard.root
        self.entry = entry
        self.query = query
        self.results, self.events = offsets
        self.status: Optional[str] = None

    @property
    def ident(self) -> str:
        """The id of the next message: where this client is in both files."""
        return f"r{self.results}.e{self.events}"

    def poll(self) -> List[str]:
        """The messages for what changed since the last poll (run in a thread: it reads files)."""
        out: List[str] = []
        results = self.entry.path / runs.RESULTS_FILE
        try:
            self.root.check(results)
            size = (stat_key(results) or (0, 0))[0]
        except OutsideRoot:
            size = 0
        if size < self.results:  # replaced by a shorter file
            self.results = 0
        if size - self.results > RESET_BYTES:
            self.results = _end_of_lines(self.entry, runs.RESULTS_FILE)
            out.append(_sse("reset", {"offset": self.results}, self.ident))
        elif size > self.results:
            data = read_bytes(self.root, results, self.results, STEP_BYTES)
            lines, used = complete_lines(data)
            if used:
                self.results += used
                message: Dict[str, Any] = {"offset": self.results, "rows": len(lines), "series": []}
                if self.query is not None:
                    cols = RunColumns.of_lines(self.root, lines)
                    message["series"] = series_of(cols, self.query)[0]
                    message["rows"] = cols.rows
                out.append(_sse("rounds", message, self.ident))
        try:
            self.root.check(self.entry.path / runs.EVENTS_FILE)
            got = runs.read_events(self.entry.path, offset=self.events, max_bytes=STEP_BYTES)
        except OutsideRoot:
            got = None
        if got is not None and got.offset > self.events:
            self.events = got.offset
            out.append(_sse("events", {"events": got.events, "bad_lines": len(got.bad_lines)}, self.ident))
        path = self.entry.path
        status, ended = status_of(self.root, path, read_json(self.root, path / runs.STATUS_FILE)[0])
        if status != self.status:
            self.status = status
            out.append(_sse("status", {"status": status, "ended": ended}, self.ident))
        return out


async def _follow(follower: Follower, poll_s: float, heartbeat_s: float) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    last_sent = time.monotonic()
    while True:
        messages = await run_in_threadpool(follower.poll)
        for message in messages:
            yield message
        now = time.monotonic()
        if messages:
            last_sent = now
        elif now - last_sent >= heartbeat_s:
            yield ": heartbeat\n\n"
            last_sent = now
        await asyncio.sleep(poll_s)


def routes(dashboard: Dashboard) -> List[Route]:
    """The routes of the stream and the stacks request."""

    def open_stream(request: Request) -> Response:
        """GET /api/runs/<id>/stream: server-sent events of what the run appends."""
        entry = dashboard.run(request.path_params["rid"])
        try:
            query = parse_query(request.query_params) if request.query_params.get("names") else None
            offsets = _offsets(request, entry)
        except BadQuery as exc:
            return error(400, str(exc))
        follower = Follower(dashboard, entry, query, offsets)
        return StreamingResponse(_follow(follower, dashboard.poll_s, dashboard.heartbeat_s),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def request_stacks(request: Request) -> Response:
        """POST /api/runs/<id>/stacks: the workers' stacks of a running job (``--allow-stacks``)."""
        if not dashboard.allow_stacks:
            return error(403, "stacks are off: start the dashboard with --allow-stacks to let the page ask a "
                              "running job for its workers' Python stacks")
        entry = dashboard.run(request.path_params["rid"])
        status, _ = status_of(dashboard.root, entry.path, read_json(dashboard.root, entry.path / runs.STATUS_FILE)[0])
        if status != "RUNNING":
            return error(409, f"run {entry.name} is not running (its status is {status}); stacks come from the "
                              "workers of a running job")
        try:
            ask = dashboard.root.child(entry.path, runs.STACKS_REQUEST)
            answer = dashboard.root.child(entry.path, runs.STACKS_FILE)
        except OutsideRoot as exc:
            return error(403, str(exc))
        # The protocol of `sgd stacks` (sgd.cli.cmd_stacks): a token in the request file, the
        # driver's answer in the stacks file, beginning with that token.
        token = f"sgd dashboard {secrets.token_hex(8)}"
        try:
            fd = os.open(ask, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(token)
        except OSError as exc:
            return error(403, f"cannot write {runs.STACKS_REQUEST} in the run folder ({exc.strerror})")
        deadline = time.monotonic() + dashboard.stacks_timeout_s
        while time.monotonic() < deadline:
            text = read_bytes(dashboard.root, answer, 0, 8 << 20).decode("utf-8", "replace")
            if text.startswith(token + "\n"):
                return Json({"text": text[len(token) + 1:]})
            await asyncio.sleep(0.1)
        try:
            os.unlink(ask)
        except OSError:
            pass
        return error(504, f"the driver of {entry.name} did not answer within {dashboard.stacks_timeout_s:g} s (it "
                          "reads requests between rounds, about once a second): is its process alive?")

    rid = "/api/runs/{rid}"
    return [
        Route(rid + "/stream", open_stream),
        Route(rid + "/stacks", request_stacks, methods=["POST"]),
    ]
