"""Console output: ``PrintCallback`` (every round as JSON) and ``ProgressCallback`` (one live line)."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import time
import weakref
from collections import deque
from typing import IO, Any, Deque, Dict, List, Optional, Sequence

from sgd import TrainingCallback
from sgd_loggers._util import check_worker, clean, scalar, select, step_of, to_jsonable

# Console callbacks in a running training run, so that the automatic progress line keeps
# quiet when something else already writes to the console.
_active: weakref.WeakSet[TrainingCallback] = weakref.WeakSet()


class PrintCallback(TrainingCallback):
    """Prints each report round (all workers) as indented JSON, as Ray Train's ``PrintCallback``.

    Keys that look like secrets are left out; NaN/infinities print as ``"NaN"``/``"Infinity"``.

    :param stream: where to print (``None``: ``sys.stdout`` at the time of printing).
    """

    def __init__(self, stream: Optional[IO[str]] = None):
        self._stream = stream

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        _active.add(self)

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        stream = self._stream or sys.stdout
        print(json.dumps(to_jsonable(results), indent=4, allow_nan=False), file=stream, flush=True)

    def finish_training(self, error: bool = False, **info: Any) -> None:
        _active.discard(self)


#: Rounds over which :class:`ProgressCallback` compares the ranks' times.
SLOW_WINDOW = 20


def _format_number(value: float) -> str:
    return f"{value:.4g}"


class ProgressCallback(TrainingCallback):
    """One live console line per run, redrawn every round: iteration, elapsed time, metrics.

    ``sgd run_001 | iter 12 | 0:01:23 | loss=0.1234 acc=0.98 | slowest rank 3: 0.52 s/iter (median 0.40)``

    The last part names the rank whose reports took longest over the last
    :data:`SLOW_WINDOW` rounds (``_time_this_iter_s``), when it is at least 10% slower than
    the median rank: a straggler shows up while the run goes on, not only once it hangs.

    The line is drawn with a carriage return and cut to the terminal's width; at the end
    of the run it is left on screen with ``done`` or ``failed``. It is off when the stream
    is not a terminal (a file, a pipe, a notebook), unless ``enabled=True``.

    sgd-loggers adds one to every ``Trainer.run`` automatically (through the
    ``sgd_default_callbacks`` hook); that one stays quiet when the user passed their own
    ``ProgressCallback`` or a ``PrintCallback``, and ``SGD_PROGRESS=0`` turns it off.

    :param stream: where to draw (``None``: ``sys.stdout`` at the start of the run).
    :param enabled: ``None`` (draw only on a terminal), ``True`` or ``False``.
    :param metrics: the keys to show (flattened with ``/``); ``None``: every number whose
        key does not start with ``_``.
    :param worker_to_log: the rank whose metrics are shown.
    :param refresh_s: the shortest time between two redraws (the last round is always drawn).
    """

    def __init__(
        self,
        stream: Optional[IO[str]] = None,
        enabled: Optional[bool] = None,
        metrics: Optional[Sequence[str]] = None,
        worker_to_log: int = 0,
        refresh_s: float = 0.1,
    ):
        self._stream = stream
        self._enabled = enabled
        self._metrics = list(metrics) if metrics is not None else None
        self._worker = check_worker(worker_to_log)
        self._refresh_s = refresh_s
        self._automatic = False
        self._out: Optional[IO[str]] = None
        self._start = 0.0
        self._last_draw = float("-inf")
        self._pending: Optional[str] = None
        self._run_name = ""
        self._window: Deque[List[float]] = deque()
        self._sums: List[float] = []

    @classmethod
    def automatic(cls) -> ProgressCallback:
        """The instance the plugin adds to every run: quiet if another console callback runs."""
        cb = cls()
        cb._automatic = True
        return cb

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        stream = self._stream or sys.stdout
        enabled = self._enabled
        if enabled is None:
            enabled = _is_terminal(stream)
        if enabled and self._automatic and any(cb is not self for cb in _active):
            enabled = False
        self._out = stream if enabled else None
        self._start = time.monotonic()
        self._last_draw = float("-inf")
        self._pending = None
        self._window.clear()
        self._sums = []
        self._run_name = os.path.basename(os.path.normpath(str(logdir)))
        if self._out is not None:
            _active.add(self)

    def line(self, result: Dict[str, Any], iteration: int, elapsed_s: float) -> str:
        """The text of the line for one worker's result."""
        flat = clean(result)
        keys = self._metrics if self._metrics is not None else [k for k in flat if not k.startswith("_")]
        shown = []
        for key in keys:
            number = scalar(flat.get(key))
            if number is not None:
                shown.append(f"{key}={_format_number(number)}")
        elapsed = str(datetime.timedelta(seconds=int(elapsed_s)))
        return " | ".join(p for p in (f"sgd {self._run_name}", f"iter {iteration}", elapsed, " ".join(shown)) if p)

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        if self._out is None:
            return
        (result,) = select(results, [self._worker], "worker_to_log")
        self._pending = self.line(result, step_of(result, 0), time.monotonic() - self._start) + self._slowest(results)
        if time.monotonic() - self._last_draw >= self._refresh_s:
            self._draw()

    def _slowest(self, results: List[Dict[str, Any]]) -> str:
        """`` | slowest rank R: ...`` over the last rounds, or ``""`` when no rank stands out."""
        times = [r.get("_time_this_iter_s") for r in results]
        if len(times) < 2 or not all(isinstance(t, (int, float)) for t in times):
            return ""
        if len(self._sums) != len(times):  # the group was resized: start over
            self._window.clear()
            self._sums = [0.0] * len(times)
        self._window.append(times)  # type: ignore[arg-type]
        for i, t in enumerate(times):
            self._sums[i] += t  # type: ignore[operator]
        if len(self._window) > SLOW_WINDOW:
            for i, t in enumerate(self._window.popleft()):
                self._sums[i] -= t
        n = len(self._window)
        rank = max(range(len(self._sums)), key=self._sums.__getitem__)
        # The lower middle of an even count: with 2 ranks, the faster one (the upper middle was the
        # slowest itself, so a pair never showed a straggler).
        median = sorted(self._sums)[(len(self._sums) - 1) // 2]
        if self._sums[rank] < 1.1 * median or self._sums[rank] <= 0:
            return ""
        return f" | slowest rank {rank}: {self._sums[rank] / n:.2f} s/iter (median {median / n:.2f})"

    def _draw(self, suffix: str = "", end: str = "") -> None:
        assert self._out is not None
        text = (self._pending or "") + suffix
        width = _width(self._out)
        if len(text) > width - 1:
            text = text[: max(width - 2, 0)] + "…"
        # \r back to the start, \x1b[K clears what a longer previous line left.
        self._out.write("\r" + text + "\x1b[K" + end)
        self._out.flush()
        self._last_draw = time.monotonic()

    def finish_training(self, error: bool = False, **info: Any) -> None:
        if self._out is not None and self._pending is not None:
            self._draw(" | failed" if error else " | done", end="\n")
        _active.discard(self)
        self._out = None


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def _width(stream: IO[str]) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return shutil.get_terminal_size().columns or 80
