"""The JSON endpoints of the dashboard (the HTTP contract in docs/dashboard.md): the runs table, a
run, its metrics (downsampled on the server) and their export, events, workers, checkpoints and
logs. Each handler is a plain function: Starlette runs it in a thread, so reading a file never
holds up a live stream.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from typing import Any, Callable, Dict, List

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sgd import runs
from sgd_dashboard.app import Dashboard, Json, error
from sgd_dashboard.columns import FOREGROUND, RunColumns
from sgd_dashboard.detail import run_detail, sampled_metric_names, workers
from sgd_dashboard.files import OutsideRoot
from sgd_dashboard.index import first_result
from sgd_dashboard.rounds import sample_lines
from sgd_dashboard.series import BadQuery, Query, parse_query, series_of, unknown_names

#: Lines sampled across a large run's results for a first chart, while its columns are read.
SAMPLED_LINES = 1000


def metric_data(dashboard: Dashboard, rid: str, query: Query) -> Dict[str, Any]:
    """The body of ``/api/runs/<id>/metrics`` (also what the export writes).

    ``complete`` says whether every round is in it: a run whose results are still being read
    (a large one, the first time) answers from lines sampled across the file, ``downsampled``.
    ``offset`` is the byte of ``results.jsonl`` the data goes up to (where a stream takes over).

    :raises BadQuery: a metric asked for is not one of the run's.
    """
    entry = dashboard.run(rid)
    path = entry.path / runs.RESULTS_FILE
    run = dashboard.columns.get(rid, dashboard.root, path)
    complete = run.catch_up()
    if complete:
        missing = unknown_names(run, query.names)
        if missing:
            known = list(run.names)
            shown = ", ".join(repr(n) for n in known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
            raise BadQuery(f"no numeric metric {', '.join(repr(n) for n in missing)} in run {entry.name}; "
                           f"its metrics: {shown or 'none'}")
        rows, offset, columns = run.columns(_wanted(run, query))
        series, total, cut = series_of(run, query, columns, rows)
        return {"x_axis": query.x_axis, "series": series, "total_points": total, "downsampled": cut,
                "complete": True, "offset": offset, "bad_lines": run.bad_lines}
    lines, offset = sample_lines(str(path), SAMPLED_LINES)
    if query.ranks == [0]:  # decode rank 0's dict only
        sample = RunColumns(dashboard.root, path)
        for raw in lines:
            first = first_result(raw)
            sample.add_round(None if first is None else [first])
    else:
        sample = RunColumns.of_lines(dashboard.root, lines)
    series, total, cut = series_of(sample, query)
    return {"x_axis": query.x_axis, "series": series, "total_points": max(total, entry.iterations),
            "downsampled": True, "complete": False, "offset": offset, "bad_lines": sample.bad_lines,
            "read_fraction": round(run.offset / max(offset, 1), 3)}


def _wanted(run: RunColumns, query: Query) -> List[Any]:
    from sgd_dashboard.series import X_AXES

    ranks = list(range(max(run.ranks, 1))) if query.ranks is None else query.ranks
    return [(n, r) for n in query.names for r in ranks] + [(X_AXES[query.x_axis], r) for r in ranks]


def _first(handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """``handler``, answered before any background read of a run's columns goes on."""
    @functools.wraps(handler)
    def wrapped(request: Request) -> Response:
        with FOREGROUND:
            return handler(request)
    return wrapped


def routes(dashboard: Dashboard) -> List[Route]:
    """The routes of the JSON endpoints."""

    @_first
    def list_runs(request: Request) -> Response:
        """GET /api/runs: the runs table."""
        p = request.query_params
        try:
            rows = dashboard.index.listing(q=p.get("q", ""), sort=p.get("sort") or "-started",
                                           status=p.get("status", ""))
        except ValueError as exc:
            return error(400, str(exc))
        return Json({"root": str(dashboard.root.path), "runs": rows})

    @_first
    def get_run(request: Request) -> Response:
        """GET /api/runs/<id>: one run's settings, status, error and metric names."""
        entry = dashboard.run(request.path_params["rid"])
        state = dashboard.state(entry)
        state.events.update()
        run = dashboard.columns.get(entry.id, dashboard.root, entry.path / runs.RESULTS_FILE)
        names = list(run.names) if run.catch_up() else sampled_metric_names(dashboard.root, entry)
        return Json(run_detail(dashboard.root, entry, state.events, names, dashboard.allow_stacks))

    @_first
    def get_metrics(request: Request) -> Response:
        """GET /api/runs/<id>/metrics: chart series, downsampled."""
        try:
            query = parse_query(request.query_params)
            return Json(metric_data(dashboard, request.path_params["rid"], query))
        except BadQuery as exc:
            return error(400, str(exc))

    def get_export(request: Request) -> Response:
        """GET /api/runs/<id>/export: the series at full resolution, as CSV or JSON."""
        fmt = request.query_params.get("format") or "csv"
        if fmt not in ("csv", "json"):
            return error(400, f"format={fmt!r}: use format=csv or format=json")
        try:
            query = parse_query(request.query_params, default_points=0, allow_all_points=True)
            entry = dashboard.run(request.path_params["rid"])
            data = metric_data(dashboard, entry.id, query)
        except BadQuery as exc:
            return error(400, str(exc))
        if not data["complete"]:
            return error(409, f"the results of {entry.name} are still being read ({data['read_fraction']:.0%} so "
                              "far): export again in a moment for every round", **{"Retry-After": "5"})
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", entry.name).strip("_") or "run"
        disposition = {"Content-Disposition": f'attachment; filename="{stem}-metrics.{fmt}"'}
        if fmt == "json":
            return Json(data, headers=disposition)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["metric", "rank", data["x_axis"], "value"])
        for s in data["series"]:
            name = "'" + s["name"] if s["name"][:1] in ("=", "+", "-", "@", "\t", "\r") else s["name"]
            for x, y in zip(s["x"], s["y"]):
                writer.writerow([name, s["rank"], x, "" if y is None else repr(y)])
        return Response(out.getvalue(), media_type="text/csv; charset=utf-8", headers=disposition)

    def get_events(request: Request) -> Response:
        """GET /api/runs/<id>/events: the run's events."""
        entry = dashboard.run(request.path_params["rid"])
        events = dashboard.state(entry).events.update()
        return Json({"events": events.events, "bad_lines": events.bad_lines, "offset": events.offset,
                     "dropped": events.dropped, "has_events": (entry.path / runs.EVENTS_FILE).is_file()})

    def get_workers(request: Request) -> Response:
        """GET /api/runs/<id>/workers: the workers table."""
        entry = dashboard.run(request.path_params["rid"])
        events = dashboard.state(entry).events.update()
        return Json({"workers": workers(dashboard.root, entry, events.events)})

    def get_checkpoints(request: Request) -> Response:
        """GET /api/runs/<id>/checkpoints: the checkpoint table."""
        entry = dashboard.run(request.path_params["rid"])
        return Json({"checkpoints": dashboard.state(entry).checkpoints.rows(entry.iterations)})

    def get_logs(request: Request) -> Response:
        """GET /api/runs/<id>/logs: the per-rank logs, one part per attempt."""
        entry = dashboard.run(request.path_params["rid"])
        state = dashboard.state(entry)
        with state.lock:
            return Json({"logs": state.logs.listing()})

    def get_log(request: Request) -> Response:
        """GET /api/runs/<id>/logs/<log_id>: a chunk of one log part, or its lines holding ``q``."""
        entry = dashboard.run(request.path_params["rid"])
        p = request.query_params
        try:
            offset = int(p.get("offset") or 0)
        except ValueError:
            return error(400, f"offset={p.get('offset')!r} is not a whole number of bytes")
        if offset < 0:
            return error(400, f"offset={offset}: an offset is 0 or more (tail=1 reads the end)")
        state = dashboard.state(entry)
        log_id = request.path_params["log_id"]
        try:
            with state.lock:
                part = state.logs.read(log_id, offset=offset, q=p.get("q", ""), tail=p.get("tail") in ("1", "true"))
        except OutsideRoot:
            part = None
        if part is None:
            return error(404, f"no log {log_id!r} in run {entry.name}: the ids come from /api/runs/{entry.id}/logs")
        return Json(part)

    rid = "/api/runs/{rid}"
    return [
        Route("/api/runs", list_runs),
        Route(rid, get_run),
        Route(rid + "/metrics", get_metrics),
        Route(rid + "/export", get_export),
        Route(rid + "/events", get_events),
        Route(rid + "/workers", get_workers),
        Route(rid + "/checkpoints", get_checkpoints),
        Route(rid + "/logs", get_logs),
        Route(rid + "/logs/{log_id}", get_log),
    ]
