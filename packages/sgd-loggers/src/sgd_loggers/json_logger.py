"""``JsonLoggerCallback``: every report round appended to one JSON file that is always valid."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from sgd import TrainingCallback
from sgd_loggers._util import check_workers, resolve_dir, select, to_jsonable

logger = logging.getLogger("sgd.loggers")

_OPEN = b"["
_CLOSE = b"\n]\n"


class JsonLoggerCallback(TrainingCallback):
    """Logs each report round to ``<logdir>/<filename>`` as a JSON list, one entry per round.

    Each entry is the list of the logged workers' result dicts (rank order). The file is
    valid JSON after every round: a round is written in place of the closing bracket and
    the bracket after it, in one ``write`` call, so the cost of a round does not grow with
    the file and a run that crashes (or is killed) leaves a readable file. Each entry sits
    on its own line. NaN and infinities are written as the strings ``"NaN"``,
    ``"Infinity"`` and ``"-Infinity"``; keys that look like secrets are left out. When the
    file already exists in the run directory (a run resumed with ``Trainer.restore``), its
    rounds are kept and the new ones appended.

    :param logdir: where the file goes; ``None`` means the run directory, a relative
        path is taken relative to the run directory.
    :param filename: the file's name.
    :param workers_to_log: a rank, a list of ranks, or ``None`` for every worker.

    :ivar path: the file of the latest run (``None`` before the first run).
    """

    def __init__(
        self,
        logdir: Optional[Union[str, os.PathLike]] = None,
        filename: str = "results.json",
        workers_to_log: Optional[Union[int, List[int]]] = 0,
    ):
        self._logdir = logdir
        self._filename = filename
        self._workers = check_workers(workers_to_log)
        self._file: Any = None
        self._end = 0  # offset of the closing bracket
        self._rounds = 0
        self.path: Optional[Path] = None

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        self.finish_training()
        directory = resolve_dir(self._logdir, logdir)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / self._filename
        kept = self._previous_rounds() if self._logdir is None else []
        body = b",\n".join(json.dumps(e, allow_nan=False).encode() for e in kept)
        head = _OPEN + (b"\n" + body if kept else b"")
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_bytes(head + _CLOSE)
        os.replace(tmp, self.path)
        # Unbuffered: one round is one write() system call.
        self._file = open(self.path, "r+b", buffering=0)
        self._end = len(head)
        self._rounds = len(kept)

    def _previous_rounds(self) -> List[Any]:
        """The rounds of an existing file in the run directory (a resumed run), else []."""
        assert self.path is not None
        if not self.path.exists():
            return []
        try:
            rounds = json.loads(self.path.read_bytes())
            if isinstance(rounds, list):
                return rounds
        except ValueError:
            pass
        aside = self.path.with_name(f"{self.path.name}.unreadable-{int(time.time())}")
        os.replace(self.path, aside)
        logger.warning("%s was not a JSON list; moved it to %s and started a new file", self.path, aside)
        return []

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        if self._file is None:
            raise RuntimeError("JsonLoggerCallback.handle_result called before start_training")
        entry = to_jsonable(select(results, self._workers, "workers_to_log"))
        body = json.dumps(entry, allow_nan=False).encode()
        chunk = (b",\n" if self._rounds else b"\n") + body
        self._write_at(self._end, chunk + _CLOSE)
        self._end += len(chunk)
        self._rounds += 1

    @property
    def log_path(self) -> Optional[Path]:
        """Ray Train 1.x's name for :attr:`path`: the JSON file of the latest run."""
        return self.path

    def finish_training(self, error: bool = False, **info: Any) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write_at(self, offset: int, data: bytes) -> None:
        self._file.seek(offset)
        view = memoryview(data)
        while view:
            written = self._file.write(view)
            view = view[written:]

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_file"] = None  # an open file does not travel; a copy starts closed
        return state
