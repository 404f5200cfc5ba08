"""The callback interface the driver calls during ``Trainer.run``."""

from __future__ import annotations

from typing import Any, Dict, List


class TrainingCallback:
    """Base class for objects that observe a training run on the driver.

    Override any of the methods; the defaults do nothing. ``**info``
    carries extra keyword arguments that later versions may add, so accept it.
    """

    def start_training(self, logdir: str, config: Dict[str, Any], **info: Any) -> None:
        """Called once before the first result of a run.

        :param logdir: the run directory (``trainer.latest_run_dir``).
        :param config: the ``config`` passed to ``Trainer.run``.
        :param info: ``resumed`` (bool: the run continues a run directory, see
            ``Trainer.restore``) and ``start_iteration`` (the last iteration already delivered).
        """

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        """Called once per report round with one dict per worker (world-rank order)."""

    def finish_training(self, error: bool = False, **info: Any) -> None:
        """Called once when the run ends, ``error=True`` if it raised."""

    def handle_failure(self, error: BaseException, **info: Any) -> None:
        """Called each time the run fails (a worker raised or died, a hang, a lost host, a start
        that failed), before the failure is retried or ends the run; an exception raised here
        ends the run with it.

        :param error: the failure (a worker's exception has its own type, with an
            :class:`sgd.WorkerError` naming the rank as its ``__cause__``).
        :param info: ``phase`` (what the run was doing: ``"training"``, ``"starting the run"``,
            ``"restarting"``).
        """
