"""``TBXLoggerCallback``: TensorBoard event files through tensorboardX."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Union

from sgd import TrainingCallback
from sgd_loggers._util import (
    check_worker,
    clean,
    histogram_values,
    require,
    resolve_dir,
    scalar,
    select,
    step_of,
    to_jsonable,
)

TAG_PREFIX = "sgd"


class TBXLoggerCallback(TrainingCallback):
    """Writes one worker's results as TensorBoard events (needs ``sgd-loggers[tensorboard]``).

    Every number becomes a scalar tagged ``sgd/<key>`` (nested keys joined with ``/``) at
    step ``_training_iteration``; NaN and infinities are logged as they are (TensorBoard
    shows them). A non-empty list, tuple or array of numbers becomes a histogram under the
    same kind of tag (its non-finite elements are dropped). Strings and other values are
    skipped. The run's ``config`` is written once as a text summary ``sgd/config`` (JSON).
    Keys that look like secrets are left out of both. Events are flushed after every round.

    :param logdir: where the event files go; ``None`` means the run directory, a relative
        path is taken relative to the run directory.
    :param worker_to_log: the rank whose results are logged.
    """

    def __init__(self, logdir: Optional[Union[str, os.PathLike]] = None, worker_to_log: int = 0):
        require("tensorboardX", type(self).__name__, "tensorboard")
        self._logdir = logdir
        self._worker = check_worker(worker_to_log)
        self._writer: Any = None
        self._rounds = 0

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        from tensorboardX import SummaryWriter

        self.finish_training()
        directory = resolve_dir(self._logdir, logdir)
        directory.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(logdir=str(directory))
        self._rounds = 0
        text = json.dumps(to_jsonable(config), indent=2, sort_keys=True, allow_nan=False)
        self._writer.add_text(f"{TAG_PREFIX}/config", f"```\n{text}\n```", global_step=0)
        self._writer.flush()

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        if self._writer is None:
            raise RuntimeError("TBXLoggerCallback.handle_result called before start_training")
        self._rounds += 1
        (result,) = select(results, [self._worker], "worker_to_log")
        step = step_of(result, self._rounds)
        walltime = scalar(result.get("_timestamp"))
        for key, value in clean(result).items():
            tag = f"{TAG_PREFIX}/{key}"
            number = scalar(value)
            if number is not None:
                self._writer.add_scalar(tag, number, global_step=step, walltime=walltime)
                continue
            values = histogram_values(value)
            if values is not None:
                self._writer.add_histogram(tag, values, global_step=step, walltime=walltime)
        self._writer.flush()

    def finish_training(self, error: bool = False, **info: Any) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_writer"] = None
        return state
