"""The server's index of the runs below its folder: each run found by :func:`sgd.runs.find_runs`
(Tune trials included), given an id of the server's own (a hash of its path relative to the
folder: stable across restarts, and never a path the browser could alter), and summed up for the
runs table. A run's summary is kept until one of its files changes size or mtime, so listing a
thousand runs again costs a walk of the folder and a ``stat`` per file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from sgd import runs
from sgd_dashboard.files import OutsideRoot, Root, read_json, stat_key, tail_lines
from sgd_dashboard.rounds import NAN, OWN_FIELDS, WHOLE_FILE, flat, is_numeric, number, parse_round, sample_lines

#: Points of a run's sparkline.
SPARK_POINTS = 64
#: Metrics preferred as a run's headline, in order; else its first numeric metric.
HEADLINE = ("loss", "train_loss", "val_loss", "eval_loss", "accuracy", "acc")
SORTS = {"started", "name", "status", "duration", "iterations"}
_DECODER = json.JSONDecoder()
INF = float("inf")
#: The files whose size and mtime say whether a run's summary is still good.
_WATCHED = (runs.SETTINGS_FILE, runs.STATUS_FILE, runs.RESULTS_FILE)


@dataclass
class RunEntry:
    """What the runs table shows of one run (and where it is, which never leaves the server)."""

    id: str
    path: Path
    name: str
    status: str = "UNKNOWN"
    started: Optional[float] = None
    ended: Optional[float] = None
    num_workers: Optional[int] = None
    iterations: int = 0
    metric: Optional[Dict[str, Any]] = None
    trial: bool = False
    problems: List[str] = field(default_factory=list)
    signature: Tuple[Any, ...] = ()

    def row(self, now: float) -> Dict[str, Any]:
        """The JSON row of ``/api/runs``."""
        end = self.ended if self.ended is not None else now
        duration = None if self.started is None else max(0.0, end - self.started)
        return {"id": self.id, "name": self.name, "status": self.status, "started": self.started,
                "ended": self.ended, "duration_s": duration, "num_workers": self.num_workers,
                "iterations": self.iterations, "metric": self.metric, "trial": self.trial}


def run_id(relative: str) -> str:
    """The id of the run at ``relative`` (its path below the served folder)."""
    return hashlib.sha256(relative.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def _signature(path: Path) -> Tuple[Any, ...]:
    folder = str(path)
    out: List[Optional[Tuple[int, int]]] = []
    for name in _WATCHED:
        try:
            st = os.stat(os.path.join(folder, name))
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def headline_metric(result: Dict[str, Any]) -> Optional[str]:
    """The metric a run is summed up by: the first of :data:`HEADLINE` it reports, else its first
    numeric metric (``None``: it reports none)."""
    numeric = [k for k, v in flat(result) if k not in OWN_FIELDS and is_numeric(v)]
    for name in HEADLINE:
        if name in numeric:
            return name
    return numeric[0] if numeric else None


def workers_of(settings: Any, last: Optional[List[Dict[str, Any]]]) -> Optional[int]:
    """The number of workers: as many as reported the last round, else the setting (its maximum
    for an elastic ``(min, max)``)."""
    if last:
        return len(last)
    value = settings.get("num_workers") if isinstance(settings, dict) else None
    if isinstance(value, list) and value and isinstance(value[-1], int):
        return value[-1]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def summarize(root: Root, path: Path, entry_id: str, name: str) -> RunEntry:
    """A run's row, read from its files (``trainer.json``, ``status.json``, the ends of ``results.jsonl``);
    ``path`` is a run folder already found inside the root."""
    entry = RunEntry(id=entry_id, path=path, name=name, signature=_signature(path))
    settings, problem = _member_json(root, path, runs.SETTINGS_FILE)
    if problem:
        entry.problems.append(problem)
    status, problem = _member_json(root, path, runs.STATUS_FILE)
    if problem:
        entry.problems.append(problem)
    entry.status, entry.ended = status_of(root, path, status)
    for fname in (runs.SETTINGS_FILE, runs.STATUS_FILE):
        key = stat_key(path / fname)
        if key is not None:
            entry.started = key[1] / 1e9
            break
    entry.trial = isinstance(settings, dict) and settings.get("trial_id") is not None
    results = path / runs.RESULTS_FILE
    try:
        root.member(path, runs.RESULTS_FILE)
        sampled = sample_lines(str(results), SPARK_POINTS)[0]
        # A small file is read whole by the sampling, which keeps its last line; a large one's end is read.
        small = (stat_key(results) or (0, 0))[0] <= WHOLE_FILE
        last_lines = sampled[-1:] if small else tail_lines(root, results, 1)
    except OutsideRoot as exc:
        entry.problems.append(str(exc))
        sampled, last_lines = [], []
    last = parse_round(last_lines[-1]) if last_lines else None
    entry.num_workers = workers_of(settings, last)
    if last:
        iteration = number(last[0].get("_training_iteration"))
        entry.iterations = int(iteration) if iteration == iteration else 0
        metric = headline_metric(last[0])
        if metric is not None:
            pattern = _number_of(metric)
            spark = [_spark_value(raw, metric, pattern) for raw in sampled]
            entry.metric = {"name": metric, "last": _value(last[0], metric), "spark": spark or None}
    return entry


def _member_json(root: Root, run: Path, name: str) -> Tuple[Optional[Any], Optional[str]]:
    try:
        return read_json(root, root.member(run, name), checked=True)
    except OutsideRoot as exc:
        return None, str(exc)


def first_result(raw: bytes) -> Optional[Dict[str, Any]]:
    """Rank 0's dict of a line, decoding only that dict (a sparkline needs no other rank's)."""
    text = raw.decode("utf-8", "replace")
    start = text.find("{")
    if start < 0:
        return None
    try:
        value, _ = _DECODER.raw_decode(text, start)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _number_of(metric: str) -> re.Pattern[bytes]:
    key = json.dumps(metric, ensure_ascii=False)[1:-1].encode("utf-8")
    return re.compile(rb'[{,]\s*"' + re.escape(key) + rb'"\s*:\s*(-?[0-9][0-9.eE+-]*)\s*[,}]')


def _spark_value(raw: bytes, metric: str, pattern: re.Pattern[bytes]) -> Optional[float]:
    """Rank 0's ``metric`` in a line: found by a regular expression in rank 0's dict when that dict
    holds no nested one (most do not; far cheaper than decoding it), else decoded."""
    end = raw.find(b"}")
    head = raw[:end + 1]
    if end > 0 and head.count(b"{") == 1:
        m = pattern.search(head)
        if m is not None:
            try:
                v = float(m.group(1))
            except ValueError:
                v = NAN
            return v if -INF < v < INF else None
    return _value(first_result(raw), metric)


def _value(result: Optional[Dict[str, Any]], metric: str) -> Optional[float]:
    if result is None:
        return None
    v = number(result.get(metric) if metric in result else dict(flat(result)).get(metric))
    return None if v != v else v


def status_of(root: Root, path: Path, status: Any) -> Tuple[str, Optional[float]]:
    """``(status, ended)`` from ``status.json``'s content; a ``RUNNING`` run whose driver on this host
    is gone is ``DRIVER_DIED`` (:func:`sgd.runs.run_status`)."""
    if not isinstance(status, dict):
        return "UNKNOWN", None
    text = str(status.get("status", "UNKNOWN"))
    ended = status.get("time") if isinstance(status.get("time"), (int, float)) else None
    if text == "RUNNING":
        text = runs.run_status(path) if root.inside(path / runs.STATUS_FILE) else text
        if text == "RUNNING":
            ended = None
    return text, ended


class RunIndex:
    """Every run below ``root``, by id, summaries cached by their files' size and mtime.

    :param root: the served folder.
    """

    def __init__(self, root: Root):
        self.root = root
        self._entries: Dict[str, RunEntry] = {}
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()  # one walk at a time: a second one finds the first's work
        self.refreshed = 0.0

    def refresh(self) -> List[RunEntry]:
        """Walk the folder again; re-read the runs whose files changed (and the live ones' status)."""
        with self._refreshing:
            return self._refresh()

    def _refresh(self) -> List[RunEntry]:
        try:
            found = runs.find_runs(self.root.path)
        except FileNotFoundError:
            found = []
        fresh: Dict[str, RunEntry] = {}
        known = {e.path: e for e in self._entries.values()}
        for path in found:
            old = known.get(path)
            if old is not None:  # checked when found (and every file read is checked again: files.Root)
                fresh[old.id] = self._current(old)
                continue
            if not self.root.inside(path):
                continue  # a symlink to a folder elsewhere
            name = self.root.relative(path)
            if name == ".":
                name = self.root.path.name
            rid = run_id(self.root.relative(path))
            old = self._entries.get(rid)
            fresh[rid] = summarize(self.root, path, rid, name) if old is None else self._current(old)
        with self._lock:
            self._entries = fresh
            self.refreshed = time.monotonic()
        return list(fresh.values())

    def get(self, rid: str) -> Optional[RunEntry]:
        """The run with id ``rid``, up to date (the folder walked again once if it is not known yet)."""
        entry = self._entries.get(rid)
        if entry is None and len(rid) == 12 and all(c in "0123456789abcdef" for c in rid):
            self.refresh()
            entry = self._entries.get(rid)
        if entry is None:
            return None
        return self._current(entry)

    def _current(self, old: RunEntry) -> RunEntry:
        """``old``, or its new summary if one of its files changed (a live run's status re-read)."""
        path = old.path
        if old.signature != _signature(path):
            entry = summarize(self.root, path, old.id, old.name)
            with self._lock:
                if old.id in self._entries:
                    self._entries[old.id] = entry
            return entry
        if old.status == "RUNNING":
            old.status, old.ended = status_of(self.root, path, read_json(self.root, path / runs.STATUS_FILE)[0])
        return old

    def listing(self, q: str = "", sort: str = "-started", status: str = "") -> List[Dict[str, Any]]:
        """The rows of ``/api/runs``: filtered by ``q`` (in the name, any case) and ``status``
        (comma-separated), sorted by ``sort`` (one of :data:`SORTS`, ``-`` first for descending).

        :raises ValueError: ``sort`` is not one of them.
        """
        key = sort.lstrip("-") or "started"
        if key not in SORTS:
            raise ValueError(f"sort={sort!r}: sort by one of {', '.join(sorted(SORTS))} (a leading '-' for descending)")
        entries = self.refresh()
        now = time.time()
        rows = [e.row(now) for e in entries]
        if q:
            rows = [r for r in rows if q.lower() in r["name"].lower()]
        if status:
            wanted = {s.strip().upper() for s in status.split(",") if s.strip()}
            rows = [r for r in rows if r["status"] in wanted]
        field_of = {"started": "started", "name": "name", "status": "status", "duration": "duration_s",
                    "iterations": "iterations"}[key]
        rows.sort(key=lambda r: (r[field_of] is None, r[field_of] if r[field_of] is not None else 0),
                  reverse=sort.startswith("-"))
        if sort.startswith("-"):  # missing values last either way
            rows.sort(key=lambda r: r[field_of] is None)
        return rows
