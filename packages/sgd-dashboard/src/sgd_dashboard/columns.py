"""A run's metrics as columns: ``results.jsonl`` read once, by byte offset, into one compact float
array per (metric, rank), then only what was appended. Charts are cut from these
(:mod:`sgd_dashboard.series`); nothing re-reads the file whole.

Reading a million rounds of JSON takes a minute of CPU, so a large remainder is read by a
background thread (one per run, a chunk at a time) while the first answers come from lines
sampled across the file (:func:`sgd_dashboard.rounds.sample_lines`). The runs held are an LRU
bounded in bytes (:class:`ColumnCache`): the server's memory stays bounded however many runs are
opened, and following a live run adds only its new rounds.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from sgd_dashboard.files import Root, stat_key
from sgd_dashboard.rounds import NAN, OWN_FIELDS, complete_lines, flat, is_numeric, number, parse_round

#: Bytes of the file parsed per step (the lock is held for one step at a time).
CHUNK = 4 << 20
#: Bytes the background reader parses between two looks at whether a request is being answered.
BACKGROUND_CHUNK = 256 << 10
#: A remainder up to this many bytes is read in the request itself; a larger one in the background.
SYNC_BYTES = 4 << 20
#: sgd's own numeric fields kept as columns (x axes, the worker table); ``_pid`` is not a series.
KEPT_OWN = ("_training_iteration", "_timestamp", "_time_this_iter_s", "_time_total_s")


class _Foreground:
    """How many requests are being answered: the background readers wait while there are any
    (Python runs one thread at a time; a request should not share it with a million-line read)."""

    def __init__(self) -> None:
        self.busy = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.busy += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.busy -= 1


FOREGROUND = _Foreground()


class RunColumns:
    """The columns of one run's ``results.jsonl``.

    :ivar rows: report rounds read (complete, parsable lines).
    :ivar bad_lines: complete lines that were not a round (damaged).
    :ivar offset: the byte after the last line read.
    """

    def __init__(self, root: Root, path: Path):
        self.root = root
        self.path = path
        self.lock = threading.Lock()
        self.rows = 0
        self.bad_lines = 0
        self.offset = 0
        self.ranks = 0
        #: (name, rank) -> one float per round (NaN where the rank did not report it as a number).
        self.cols: Dict[Tuple[str, int], array] = {}
        #: user metric names in order of first appearance (sgd's own fields left out).
        self.names: Dict[str, None] = {}
        self._thread: Optional[threading.Thread] = None
        self.closed = False

    # --- reading -----------------------------------------------------------------------------

    @classmethod
    def of_lines(cls, root: Root, lines: List[bytes]) -> RunColumns:
        """Columns of some lines only (sampled ones, or those a live stream just read)."""
        run = cls(root, root.path)
        for raw in lines:
            if raw.strip():
                run._add(raw)
        return run

    def remaining(self) -> int:
        """Bytes of the file not read yet (a line still being written included); none for a
        file that leads out of the root (a symlink: it is not read)."""
        if not self.root.inside(self.path):
            return 0
        key = stat_key(self.path)
        if key is None:
            return 0
        return max(0, key[0] - self.offset)

    def read_some(self, max_bytes: int = CHUNK) -> int:
        """Read up to ``max_bytes`` more (whole lines); returns the bytes consumed."""
        if not self.root.inside(self.path):
            return 0
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(max_bytes)
        except OSError:
            return 0
        lines, used = complete_lines(data)
        if not lines and len(data) == max_bytes:  # one line longer than a chunk: take it whole
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.readline()
            except OSError:
                return 0
            lines, used = complete_lines(data)
        with self.lock:
            for raw in lines:
                if raw.strip():
                    self._add(raw)
            self.offset += used
        return used

    def _add(self, raw: bytes) -> None:
        self.add_round(parse_round(raw))

    def add_round(self, ranks: Optional[List[Dict[str, Any]]]) -> None:
        """Add one round (its per-rank dicts; ``None``: a damaged line, counted)."""
        if ranks is None:
            self.bad_lines += 1
            return
        row = self.rows
        cols = self.cols
        touched = 0
        for rank, result in enumerate(ranks):
            for name, value in flat(result):
                if name in OWN_FIELDS and name not in KEPT_OWN:
                    continue
                col = cols.get((name, rank))
                if col is None:
                    if not is_numeric(value):
                        continue  # not a number so far: no column until it is one
                    col = cols[(name, rank)] = array("d", [NAN]) * row
                    if name not in OWN_FIELDS:
                        self.names[name] = None
                elif len(col) > row:
                    continue  # the same name twice in one dict (flattening): keep the first
                col.append(number(value))
                touched += 1
        self.ranks = max(self.ranks, len(ranks))
        self.rows = row + 1
        if touched != len(cols):
            for col in cols.values():
                if len(col) <= row:
                    col.append(NAN)

    def catch_up(self, sync_bytes: Optional[int] = None) -> bool:
        """Read what was appended: in this call when it is at most ``sync_bytes`` (default
        :data:`SYNC_BYTES`), else in a background thread. Returns whether the columns now hold
        every complete line."""
        if self._thread is not None and self._thread.is_alive():
            return False
        left = self.remaining()
        if left > (SYNC_BYTES if sync_bytes is None else sync_bytes):
            self._thread = threading.Thread(target=self._read_all, name=f"sgd-dashboard read {self.path}", daemon=True)
            self._thread.start()
            return False
        while left > 0:
            used = self.read_some(max(CHUNK, left))
            if used == 0:
                break
            left -= used
        return True

    def _read_all(self) -> None:
        while not self.closed:
            while FOREGROUND.busy and not self.closed:  # requests first: the first chart of a big run
                time.sleep(0.005)
            if self.read_some(BACKGROUND_CHUNK) == 0:
                break

    @property
    def reading(self) -> bool:
        """Whether a background thread is reading the file."""
        return self._thread is not None and self._thread.is_alive()

    # --- what charts take --------------------------------------------------------------------

    def column(self, name: str, rank: int) -> Optional[np.ndarray]:
        """A copy of one column (``None``: the rank never reported ``name`` as a number)."""
        with self.lock:
            col = self.cols.get((name, rank))
            return None if col is None else np.array(col, dtype=np.float64)

    def columns(self, wanted: List[Tuple[str, int]]) -> Tuple[int, int, Dict[Tuple[str, int], np.ndarray]]:
        """``(rows, offset, {key: copy})`` of several columns, taken together (one consistent cut)."""
        with self.lock:
            got = {k: np.array(self.cols[k], dtype=np.float64) for k in wanted if k in self.cols}
            return self.rows, self.offset, got

    def nbytes(self) -> int:
        """Bytes the columns take."""
        return sum(col.itemsize * len(col) for col in self.cols.values())


class ColumnCache:
    """The runs whose columns are held, least recently used first; beyond ``max_bytes`` the
    oldest are dropped (the one in use is always kept).

    :param max_bytes: the budget of every run's columns together.
    """

    def __init__(self, max_bytes: int = 512 << 20):
        self.max_bytes = max_bytes
        self._runs: OrderedDict[str, RunColumns] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: str, root: Root, path: Path) -> RunColumns:
        """The columns of ``run_id`` (whose ``results.jsonl`` is ``path``), made on first use.
        A file that shrank (the run folder was replaced) starts over."""
        with self._lock:
            run = self._runs.get(run_id)
            key = stat_key(path)
            if run is not None and key is not None and key[0] < run.offset:
                run.closed = True
                run = None
            if run is None:
                run = self._runs[run_id] = RunColumns(root, path)
            self._runs.move_to_end(run_id)
            self._evict(keep=run_id)
            return run

    def _evict(self, keep: str) -> None:
        total = sum(r.nbytes() for r in self._runs.values())
        for run_id in list(self._runs):
            if total <= self.max_bytes:
                break
            if run_id == keep:
                continue
            run = self._runs.pop(run_id)
            run.closed = True
            total -= run.nbytes()

    def close(self) -> None:
        """Drop every run (their background readers stop after their current chunk)."""
        with self._lock:
            for run in self._runs.values():
                run.closed = True
            self._runs.clear()

    def held(self) -> List[str]:
        """The ids of the runs held, least recently used first."""
        with self._lock:
            return list(self._runs)
