"""One run read for its page: settings, status and error, its events (``events.jsonl``, followed by
offset), and the workers table.

A run written by an older sgd has no ``events.jsonl``: it is shown with what there is (an empty
timeline; the workers from its results). Damaged lines of any file are counted and passed over.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional

from sgd import runs
from sgd.redact import redact, redact_text
from sgd_dashboard.files import OutsideRoot, Root, read_json, tail_lines
from sgd_dashboard.index import RunEntry
from sgd_dashboard.rounds import OWN_FIELDS, flat, is_numeric, number, parse_round, sample_lines

#: Rounds over which the ranks' times are compared (sgd_loggers.console.SLOW_WINDOW).
SLOW_WINDOW = 20
#: A rank is a straggler when its time over the window is at least this many times the median rank's.
SLOW_FACTOR = 1.1
#: Events kept per run (the oldest dropped beyond: a run that hangs in a loop cannot fill memory).
MAX_EVENTS = 20_000
#: Lines sampled across ``results.jsonl`` to name a large run's metrics before its columns are read.
NAME_SAMPLES = 64


class RunEvents:
    """One run's ``events.jsonl``, read once and then only what was appended (by byte offset)."""

    def __init__(self, root: Root, entry: RunEntry):
        self.root = root
        self.path = entry.path
        self.offset = 0
        self.events: List[Dict[str, Any]] = []
        self.bad_lines = 0
        self.dropped = 0
        self.problem: Optional[str] = None
        self._lock = threading.Lock()

    def update(self) -> RunEvents:
        """Read what was appended since the last call (a line still being written is left)."""
        with self._lock:
            try:
                self.root.check(self.path / runs.EVENTS_FILE)
            except OutsideRoot as exc:
                self.problem = str(exc)
                return self
            while True:
                got = runs.read_events(self.path, offset=self.offset)
                if got.offset < self.offset:  # the file was replaced: start over
                    self.offset, self.events, self.bad_lines = 0, [], 0
                    continue
                self.events.extend(got.events)
                self.bad_lines += len(got.bad_lines)
                moved = got.offset != self.offset
                self.offset = got.offset
                if len(self.events) > MAX_EVENTS:
                    self.dropped += len(self.events) - MAX_EVENTS
                    del self.events[:len(self.events) - MAX_EVENTS]
                if not moved:
                    return self

    def since(self, offset: int) -> List[Dict[str, Any]]:
        """The events after byte ``offset`` (for a stream that resumes): read again from there."""
        got = runs.read_events(self.path, offset=offset)
        return got.events


def run_detail(root: Root, entry: RunEntry, events: RunEvents, metric_names: List[str],
               stacks_allowed: bool) -> Dict[str, Any]:
    """The JSON of ``/api/runs/<id>``."""
    settings, problem = read_json(root, entry.path / runs.SETTINGS_FILE)
    problems = list(entry.problems)
    if problem and problem not in problems:
        problems.append(problem)
    if events.problem:
        problems.append(events.problem)
    if events.bad_lines:
        problems.append(f"{runs.EVENTS_FILE} has {events.bad_lines} damaged line(s), passed over")
    return {
        "id": entry.id,
        "name": entry.name,
        "status": entry.status,
        "started": entry.started,
        "ended": entry.ended,
        "settings": redact(settings) if isinstance(settings, dict) else {},
        "error": error_of(entry.status, events.events),
        "num_workers": entry.num_workers,
        "iterations": entry.iterations,
        "metrics": metric_names,
        "stacks_allowed": stacks_allowed and entry.status == "RUNNING",
        "has_events": (entry.path / runs.EVENTS_FILE).is_file(),
        "problems": problems,
    }


def error_of(status: str, events: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The run's error: its last ``run_failed`` event; for a failed run without one, the last
    ``worker_failed``; else ``None``."""
    kinds = ("run_failed",) if status != "ERRORED" else ("run_failed", "worker_failed")
    for kind in kinds:
        for event in reversed(events):
            if event.get("event") == kind:
                return {key: redact_text(str(event.get(key) or "")) for key in ("error_type", "message", "traceback")}
    return None


def sampled_metric_names(root: Root, entry: RunEntry) -> List[str]:
    """The numeric metrics of a run whose columns are not read yet, from lines sampled across its
    results (a metric reported only between two samples is missed until the columns are read)."""
    path = entry.path / runs.RESULTS_FILE
    try:
        root.check(path)
    except OutsideRoot:
        return []
    names: Dict[str, None] = {}
    for raw in sample_lines(str(path), NAME_SAMPLES)[0]:
        for result in parse_round(raw) or []:
            for name, value in flat(result):
                if name not in OWN_FIELDS and name not in names and is_numeric(value):
                    names[name] = None
    return list(names)


def workers(root: Root, entry: RunEntry, events: List[Dict[str, Any]], now: Optional[float] = None
            ) -> List[Dict[str, Any]]:
    """The rows of ``/api/runs/<id>/workers``: every rank of the latest attempt (from its
    ``attempt_started`` event, else from the reports), with its state, the seconds since it last
    reported, its seconds per iteration over the last :data:`SLOW_WINDOW` rounds and whether it
    is a straggler (the rule of ``sgd_loggers.console.ProgressCallback``)."""
    now = time.time() if now is None else now
    try:
        lines = tail_lines(root, entry.path / runs.RESULTS_FILE, SLOW_WINDOW)
    except OutsideRoot:
        lines = []
    window = [r for r in (parse_round(raw) for raw in lines) if r]
    if window:  # the group may have been resized: compare only rounds of the last size
        size = len(window[-1])
        tail: List[List[Dict[str, Any]]] = []
        for round_ in reversed(window):
            if len(round_) != size:
                break
            tail.append(round_)
        window = tail[::-1]
    attempt_index = max((i for i, e in enumerate(events) if e.get("event") == "attempt_started"), default=-1)
    started = events[attempt_index] if attempt_index >= 0 else {}
    failed = {e.get("rank"): e for e in events[attempt_index + 1:] if e.get("event") == "worker_failed"}
    rows: Dict[int, Dict[str, Any]] = {}
    for w in started.get("workers") or []:
        if isinstance(w, dict) and isinstance(w.get("rank"), int):
            rows[w["rank"]] = {"rank": w["rank"], "host": w.get("host"), "pid": w.get("pid")}
    last = window[-1] if window else []
    for rank, result in enumerate(last):
        row = rows.setdefault(rank, {"rank": rank, "host": None, "pid": None})
        row["host"] = row["host"] or result.get("_hostname")
        row["pid"] = row["pid"] if row["pid"] is not None else result.get("_pid")
    sums = _window_sums(window)
    # The console line's median: the middle of the sorted sums, the lower one of an even count.
    median = sorted(sums)[(len(sums) - 1) // 2] if sums else 0.0
    for rank, row in rows.items():
        fail = failed.get(rank)
        if fail is not None and (fail.get("pid") in (None, row.get("pid"))):
            state = "failed"
        elif entry.status == "RUNNING":
            state = "running"
        elif entry.status == "FINISHED":
            state = "finished"
        else:
            state = "gone"
        stamp = number(last[rank].get("_timestamp")) if rank < len(last) else float("nan")
        row["state"] = state
        row["since_last_report_s"] = (max(0.0, now - stamp) if stamp == stamp and entry.status == "RUNNING"
                                      else None)
        per = sums[rank] / len(window) if rank < len(sums) and window else None
        row["s_per_iter"] = per
        row["straggler"] = bool(rank < len(sums) and len(sums) >= 2 and sums[rank] > 0
                                and sums[rank] >= SLOW_FACTOR * median)
    return [rows[r] for r in sorted(rows)]


def _window_sums(window: List[List[Dict[str, Any]]]) -> List[float]:
    """Each rank's summed ``_time_this_iter_s`` over the window (``[]`` if a time is not a number)."""
    if not window:
        return []
    sums = [0.0] * len(window[-1])
    for round_ in window:
        for i, result in enumerate(round_):
            t = number(result.get("_time_this_iter_s"))
            if t != t:
                return []
            sums[i] += t
    return sums
