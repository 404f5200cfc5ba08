"""Chart series cut from a run's columns, downsampled on the server: each of ``max_points // 2``
buckets keeps its minimum and its maximum (a spike survives however many points are dropped,
unlike every-Nth sampling), in the order they came. NaN, the infinities and strings are ``null``
in the JSON: a gap in the line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from sgd.errors import PicklableError
from sgd_dashboard.columns import RunColumns

X_AXES = {"iteration": "_training_iteration", "time": "_timestamp"}
DEFAULT_POINTS = 2000
MAX_POINTS = 100_000
#: The most metrics one request may ask for.
MAX_NAMES = 64


class BadQuery(PicklableError, ValueError):
    """A query parameter the endpoint cannot use (the message says which and what it takes)."""


@dataclass
class Query:
    """What a chart asks for: metric names, x axis, ranks (``None``: every rank), points per series."""

    names: List[str]
    x_axis: str = "iteration"
    ranks: Optional[List[int]] = None
    max_points: int = DEFAULT_POINTS


def parse_query(params: Any, default_points: int = DEFAULT_POINTS, allow_all_points: bool = False) -> Query:
    """A :class:`Query` from the request's query parameters (``names=a,b`` and/or repeated
    ``name=``, ``x=iteration|time``, ``ranks=0|all|0,2``, ``max_points=N``).

    :raises BadQuery: a parameter is malformed (the message says what it takes).
    """
    names = [n for n in (params.get("names") or "").split(",") if n]
    names += [n for n in params.getlist("name") if n]
    names = list(dict.fromkeys(names))
    if not names:
        raise BadQuery("no metric asked for: pass names=NAME[,NAME...] (the run's metrics are in /api/runs/<id>)")
    if len(names) > MAX_NAMES:
        raise BadQuery(f"{len(names)} metrics asked for; at most {MAX_NAMES} at a time")
    x_axis = params.get("x") or "iteration"
    if x_axis not in X_AXES:
        raise BadQuery(f"x={x_axis!r} is not an axis: use x=iteration or x=time")
    ranks_text = (params.get("ranks") or "0").strip()
    ranks: Optional[List[int]]
    if ranks_text == "all":
        ranks = None
    else:
        try:
            ranks = sorted({int(r) for r in ranks_text.split(",")})
        except ValueError:
            raise BadQuery(f"ranks={ranks_text!r}: use ranks=all, ranks=0 or ranks=0,2") from None
        if any(r < 0 or r > 100_000 for r in ranks):
            raise BadQuery(f"ranks={ranks_text!r}: a rank is a number from 0")
    text = params.get("max_points")
    if text is None or text == "":
        points = default_points
    else:
        try:
            points = int(text)
        except ValueError:
            raise BadQuery(f"max_points={text!r} is not a whole number") from None
        low = 0 if allow_all_points else 2
        if not low <= points <= MAX_POINTS:
            raise BadQuery(f"max_points={points}: take a number from {max(low, 2)} to {MAX_POINTS}"
                           + (" (0: every point)" if allow_all_points else ""))
    return Query(names=names, x_axis=x_axis, ranks=ranks, max_points=points)


def minmax_indices(y: np.ndarray, max_points: int) -> np.ndarray:
    """The indices of ``y`` a chart of at most ``max_points`` points keeps: each bucket's minimum and
    maximum in order (a bucket with no number keeps its first point: a gap)."""
    n = len(y)
    if max_points <= 0 or n <= max_points:
        return np.arange(n)
    buckets = max(1, max_points // 2)
    k = math.ceil(n / buckets)
    padded = np.full(buckets * k, np.nan)
    padded[:n] = y
    table = padded.reshape(buckets, k)
    valid = ~np.isnan(table)
    some = valid.any(axis=1)
    lo = np.where(valid, table, np.inf).argmin(axis=1)
    hi = np.where(valid, table, -np.inf).argmax(axis=1)
    first = np.minimum(lo, hi)
    second = np.maximum(lo, hi)
    first = np.where(some, first, 0)
    second = np.where(some, second, 0)
    base = np.arange(buckets) * k
    pairs = np.stack([base + first, base + second], axis=1).ravel()
    keep = np.ones(len(pairs), dtype=bool)
    keep[1::2] = pairs[1::2] != pairs[0::2]
    pairs = pairs[keep]
    return pairs[pairs < n]


def _jsonable(values: np.ndarray, whole: bool) -> List[Any]:
    if whole:
        return [None if v != v else int(v) for v in values.tolist()]
    return [None if (v != v or v in (math.inf, -math.inf)) else v for v in values.tolist()]


def series_of(run: RunColumns, query: Query, columns: Optional[Dict[Tuple[str, int], np.ndarray]] = None,
              rows: Optional[int] = None) -> Tuple[List[Dict[str, Any]], int, bool]:
    """``(series, total_points, downsampled)`` for ``query`` from ``run``'s columns: one series per
    (metric, rank) that has the metric. Rows where the rank has no x value are left out."""
    ranks = list(range(max(run.ranks, 1))) if query.ranks is None else query.ranks
    x_name = X_AXES[query.x_axis]
    wanted = [(name, r) for name in query.names for r in ranks] + [(x_name, r) for r in ranks]
    if columns is None or rows is None:
        rows, _, columns = run.columns(wanted)
    out: List[Dict[str, Any]] = []
    total = 0
    cut = False
    for name in query.names:
        for r in ranks:
            y = columns.get((name, r))
            if y is None:
                continue
            x = columns.get((x_name, r))
            if x is None:
                x = np.arange(1, len(y) + 1, dtype=np.float64) if query.x_axis == "iteration" else None
            if x is None:
                continue
            present = ~np.isnan(x)
            x, y = x[present], y[present]
            total = max(total, len(y))
            keep = minmax_indices(y, query.max_points)
            cut = cut or len(keep) < len(y)
            out.append({"name": name, "rank": r, "x": _jsonable(x[keep], query.x_axis == "iteration"),
                        "y": _jsonable(y[keep], False)})
    return out, total, cut


def unknown_names(run: RunColumns, names: List[str]) -> List[str]:
    """The names in ``names`` that are not among the run's numeric metrics (nor sgd's own columns)."""
    return [n for n in names if n not in run.names and not any((n, r) in run.cols for r in range(max(run.ranks, 1)))]
