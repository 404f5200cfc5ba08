"""The dashboard's Starlette application: :func:`create_app` puts the routes of
:mod:`sgd_dashboard.api` and :mod:`sgd_dashboard.stream` behind :class:`~sgd_dashboard.security.Guard`,
and the page's files (``sgd_dashboard/static/``) at ``/`` and ``/static/``.

Every answer an endpoint gives is JSON (an error too: ``{"error": "what is wrong and what to do"}``
with 400, 403, 404 or 409), never a traceback.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, List, Optional, Union

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from sgd_dashboard.artifacts import Checkpoints, RunLogs
from sgd_dashboard.cli import DEFAULT_PORT
from sgd_dashboard.columns import ColumnCache
from sgd_dashboard.detail import RunEvents
from sgd_dashboard.files import Root
from sgd_dashboard.index import RunEntry, RunIndex
from sgd_dashboard.security import Guard, allowed_hosts_for, check_bind

logger = logging.getLogger("sgd.dashboard")

__all__ = ["DEFAULT_PORT", "Dashboard", "create_app"]

STATIC = Path(__file__).parent / "static"
#: Runs whose events, checkpoints and logs are held (their metric columns: :class:`ColumnCache`).
MAX_RUN_STATES = 64


def clean(value: Any) -> Any:
    """``value`` with every NaN and infinity made ``None`` (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


class Json(JSONResponse):
    """JSON that never holds NaN (a browser's ``JSON.parse`` refuses it)."""

    def render(self, content: Any) -> bytes:
        import json

        try:  # most answers hold no NaN (their numbers were made finite where they were read)
            text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str)
        except ValueError:
            text = json.dumps(clean(content), ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=str)
        return text.encode("utf-8")


def error(status: int, message: str, **headers: str) -> Json:
    """An error answer: ``{"error": message}``."""
    return Json({"error": message}, status_code=status, headers=headers or None)


class RunState:
    """What the server holds of one run besides its columns: its events, checkpoints and logs."""

    def __init__(self, root: Root, entry: RunEntry):
        self.events = RunEvents(root, entry)
        self.checkpoints = Checkpoints(root, entry.path)
        self.logs = RunLogs(root, entry.path)
        self.lock = threading.Lock()


class Dashboard:
    """The server's state: the folder, its run index, the runs held.

    :param root: the results folder (or one run's folder).
    :param allow_stacks: whether ``POST /api/runs/<id>/stacks`` may ask a live run for its stacks.
    :param cache_bytes: the budget of the metric columns held (:class:`ColumnCache`).
    :param stacks_timeout_s: how long a stacks request waits for the driver's answer.
    :param poll_s: how often a live stream looks at the run's files.
    """

    def __init__(self, root: Root, allow_stacks: bool = False, cache_bytes: int = 512 << 20,
                 stacks_timeout_s: float = 30.0, poll_s: float = 0.25, heartbeat_s: float = 15.0):
        self.root = root
        self.index = RunIndex(root)
        self.columns = ColumnCache(cache_bytes)
        self.allow_stacks = allow_stacks
        self.stacks_timeout_s = stacks_timeout_s
        self.poll_s = poll_s
        self.heartbeat_s = heartbeat_s
        self._states: OrderedDict[str, RunState] = OrderedDict()
        self._lock = threading.Lock()

    def warm_up(self) -> threading.Thread:
        """Build the run index in a background thread (a server started from the command line
        does, so that the first page it serves finds every run already summed up)."""
        thread = threading.Thread(target=self.index.refresh, name="sgd-dashboard index", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Stop the background readers of run columns."""
        self.columns.close()

    def run(self, rid: str) -> RunEntry:
        """The run ``rid`` names.

        :raises HTTPException: 404, no such run in the index.
        """
        entry = self.index.get(rid)
        if entry is None:
            raise HTTPException(404, f"no run with id {rid!r} under {self.root.path}: the ids come from /api/runs "
                                     "(the run may have been moved or deleted)")
        return entry

    def state(self, entry: RunEntry) -> RunState:
        """The held state of a run, made on first use (the least recently used dropped beyond
        :data:`MAX_RUN_STATES`)."""
        with self._lock:
            state = self._states.get(entry.id)
            if state is None or state.events.path != entry.path:
                state = self._states[entry.id] = RunState(self.root, entry)
            self._states.move_to_end(entry.id)
            while len(self._states) > MAX_RUN_STATES:
                self._states.popitem(last=False)
            return state


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    detail = str(exc.detail)
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"nothing at {request.url.path}: the dashboard's page is at /, its API under /api/runs"
    elif exc.status_code == 405 and detail == "Method Not Allowed":
        detail = f"{request.method} is not allowed on {request.url.path}"
    return error(exc.status_code, detail)


async def _server_error(request: Request, exc: Exception) -> Response:
    logger.exception("sgd dashboard: %s %s failed", request.method, request.url.path)
    return error(500, f"the dashboard failed on this request ({type(exc).__name__}); its console has the details")


def _index_page(request: Request) -> Response:
    page = STATIC / "index.html"
    if not page.is_file():
        return error(404, f"the page is missing from the installed package ({page}): reinstall sgd-dashboard")
    return FileResponse(page, media_type="text/html; charset=utf-8")


def create_app(root: Union[str, os.PathLike], token: Optional[str] = None, allow_stacks: bool = False,
               host: str = "127.0.0.1", port: Optional[int] = None, allowed_hosts: Optional[Any] = None,
               cache_bytes: int = 512 << 20, stacks_timeout_s: float = 30.0, poll_s: float = 0.25,
               heartbeat_s: float = 15.0) -> Starlette:
    """The dashboard of the runs at or below ``root``, as an ASGI application.

    :param root: a results folder (``~/sgd_results``), an experiment's folder, or one run's folder.
    :param token: the token every request must bring (required when ``host`` is not loopback).
    :param allow_stacks: let the page ask a live run for its workers' stacks (``sgd stacks``).
    :param host: the address the server binds (what the ``Host`` header is checked against).
    :param port: the port it binds (names the token's cookie).
    :param allowed_hosts: the ``Host`` names to answer to instead of those ``host`` implies.
    :param cache_bytes: memory for the metric columns of the runs opened (least recently used dropped).
    :param stacks_timeout_s: how long a stacks request waits for the driver's answer.
    :param poll_s: how often a live stream looks at a run's files for what was appended.
    :param heartbeat_s: how often a live stream sends a comment when nothing happens.
    :raises ValueError: ``host`` is not loopback and there is no token, or the token is malformed.
    :raises FileNotFoundError: ``root`` is not a folder.
    """
    from sgd_dashboard import api, stream

    check_bind(host, token)
    dashboard = Dashboard(Root(root), allow_stacks=allow_stacks, cache_bytes=cache_bytes,
                          stacks_timeout_s=stacks_timeout_s, poll_s=poll_s, heartbeat_s=heartbeat_s)
    routes: List[BaseRoute] = [
        Route("/", _index_page, methods=["GET", "HEAD"]),
        *api.routes(dashboard),
        *stream.routes(dashboard),
    ]
    if STATIC.is_dir():
        routes.append(Mount("/static", app=StaticFiles(directory=STATIC, follow_symlink=False), name="static"))
    hosts = allowed_hosts_for(host) if allowed_hosts is None else set(allowed_hosts)
    cookie = f"sgd_dashboard_{port}" if port else "sgd_dashboard_token"
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, token=token, allowed_hosts=hosts, cookie=cookie)],
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
    )
    app.state.dashboard = dashboard
    return app
