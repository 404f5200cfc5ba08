"""``CSVLoggerCallback``: one CSV row per report round."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from sgd import TrainingCallback
from sgd_loggers._util import check_workers, clean, resolve_dir, select, to_jsonable

#: Column added in front when more than one worker is logged.
RANK_COLUMN = "_world_rank"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return str(value)  # floats as repr: 0.1, nan, inf, -inf
    converted = to_jsonable(value)
    if isinstance(converted, (list, dict)):
        return json.dumps(converted, allow_nan=False)
    return _cell(converted)


class CSVLoggerCallback(TrainingCallback):
    """Logs one row per report round to ``<logdir>/<filename>``.

    The header is the union of the keys seen so far (nested dicts flattened with ``/``), in
    the order they first appeared; a row leaves out a key as an empty cell. When a later
    round brings a new key the file is rewritten once with the wider header (atomically:
    a temporary file renamed over the old one); otherwise a round is one appended line.
    Floats are written as Python spells them (``0.1``, ``nan``, ``inf``), lists and empty
    dicts as JSON, ``None`` as an empty cell; lines end with ``\\n``. Keys that look like
    secrets are left out. When the file already exists in the run directory (a run resumed
    with ``Trainer.restore``), its rows are kept and the new ones appended.

    :param logdir: where the file goes; ``None`` means the run directory, a relative
        path is taken relative to the run directory.
    :param filename: the file's name.
    :param worker_to_log: the rank whose results are logged. As an addition to the
        contract, a list of ranks or ``None`` (all) is accepted too: then each round gives
        one row per logged worker and a first column ``_world_rank`` says whose it is.
    """

    def __init__(
        self,
        logdir: Optional[Union[str, os.PathLike]] = None,
        filename: str = "results.csv",
        worker_to_log: Optional[Union[int, List[int]]] = 0,
    ):
        self._logdir = logdir
        self._filename = filename
        self._ranks = check_workers(worker_to_log, "worker_to_log")
        self._with_rank = not (isinstance(worker_to_log, int) and not isinstance(worker_to_log, bool))
        self._columns: List[str] = []
        self._file: Any = None
        self.path: Optional[Path] = None

    @property
    def log_path(self) -> Optional[Path]:
        """Ray Train 1.x's name for :attr:`path`: the CSV file of the latest run."""
        return self.path

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        self.finish_training()
        directory = resolve_dir(self._logdir, logdir)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / self._filename
        self._columns = [RANK_COLUMN] if self._with_rank else []
        if self._logdir is None and self.path.exists():
            with open(self.path, newline="", encoding="utf-8") as f:
                header = next(csv.reader(f), [])
            self._columns.extend(c for c in header if c not in self._columns)
            self._file = open(self.path, "a", newline="", encoding="utf-8")
        else:
            self._file = open(self.path, "w", newline="", encoding="utf-8")

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        if self._file is None:
            raise RuntimeError("CSVLoggerCallback.handle_result called before start_training")
        ranks = self._ranks if self._ranks is not None else list(range(len(results)))
        rows = []
        for rank, result in zip(ranks, select(results, self._ranks, "worker_to_log")):
            row = clean(result)
            if self._with_rank:
                row = {RANK_COLUMN: rank, **row}
            rows.append(row)
        new = [k for row in rows for k in row if k not in self._columns]
        if new or self._file.tell() == 0:
            self._columns.extend(dict.fromkeys(new))
            self._rewrite()
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in self._columns])
        self._file.write(buf.getvalue())
        self._file.flush()

    def _rewrite(self) -> None:
        """Write the file again with the current header (the old rows keep their cells)."""
        assert self.path is not None
        self._file.close()
        with open(self.path, newline="", encoding="utf-8") as old:
            old_rows = list(csv.DictReader(old))
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(self._columns)
            for row in old_rows:
                writer.writerow([row.get(c) or "" for c in self._columns])
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", newline="", encoding="utf-8")

    def finish_training(self, error: bool = False, **info: Any) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_file"] = None
        return state
