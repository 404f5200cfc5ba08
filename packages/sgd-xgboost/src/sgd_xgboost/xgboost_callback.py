"""``XGBoostReportCallback``: reports each boosting round's evaluation metrics to sgd and
checkpoints the model in XGBoost's own format (Ray Train's ``RayTrainReportCallback``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import xgboost
from xgboost.callback import TrainingCallback

import sgd
from sgd_xgboost import _metrics
from sgd_xgboost.checkpoints import XGBOOST_MODEL, load_xgboost_model, write_checkpoint

__all__ = ["XGBoostReportCallback"]


class XGBoostReportCallback(TrainingCallback):
    """Pass it to ``xgboost.train(callbacks=[...])`` inside a training function: every round
    calls :func:`sgd.report` on every worker with the round's evaluation results, keyed
    ``"<dataset>-<metric>"`` (``"train-logloss"``); rank 0 adds a checkpoint holding the model
    (``model.ubj``, UBJSON; ``filename="model.json"`` for JSON) every ``frequency`` rounds and
    after the last one.

    :param metrics: which results to report: ``None`` (all), a name, a list of names, or a dict
        from report key to result name.
    :param filename: the model's file name in the checkpoint.
    :param frequency: checkpoint every this many rounds (counted over the whole model, so a
        resumed model keeps the same rhythm); ``0``: only at the end.
    :param checkpoint_at_end: checkpoint after the last round (with one more report, unless
        the last round was checkpointed already).
    :param results_postprocessing_fn: ``fn(metrics) -> metrics`` applied before each report.
    :param num_boost_round: the model's number of rounds when training ends, if known (an sgd
        addition): the end checkpoint then goes with that round's report instead of one more
        report after it, so there is exactly one report per round.
    """

    CHECKPOINT_NAME = XGBOOST_MODEL

    def __init__(self, metrics: _metrics.Metrics = None, filename: str = XGBOOST_MODEL, frequency: int = 0,
                 checkpoint_at_end: bool = True,
                 results_postprocessing_fn: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
                 *, num_boost_round: Optional[int] = None):
        self._metrics = metrics
        self._final = num_boost_round
        self._filename = filename
        self._frequency = _metrics.check_frequency(frequency)
        self._checkpoint_at_end = checkpoint_at_end
        self._postprocess = results_postprocessing_fn
        self._last: Optional[Dict[str, Any]] = None
        self._checkpointed_rounds = -1

    @classmethod
    def get_model(cls, checkpoint: Any, filename: str = XGBOOST_MODEL) -> Any:
        """The ``xgboost.Booster`` in a checkpoint this callback wrote."""
        return load_xgboost_model(checkpoint, filename)

    def _flatten(self, evals_log: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
        flat = {}
        for data, results in evals_log.items():
            for metric, values in results.items():
                value = values[-1]
                flat[f"{data}-{metric}"] = value[0] if isinstance(value, tuple) else value
        return _metrics.finish(_metrics.select(flat, self._metrics), self._postprocess)

    def _report(self, model: Any, metrics: Dict[str, Any], checkpoint: bool) -> None:
        if checkpoint and sgd.world_rank() == 0:
            rounds = model.num_boosted_rounds()
            with write_checkpoint("xgboost", xgboost.__version__, self._filename, model.save_model, rounds) as ckpt:
                sgd.report(metrics, checkpoint=ckpt)
        else:
            sgd.report(metrics)
        if checkpoint:
            self._checkpointed_rounds = model.num_boosted_rounds()

    def after_iteration(self, model: Any, epoch: int, evals_log: Dict[str, Any]) -> bool:
        self._last = self._flatten(evals_log)
        rounds = model.num_boosted_rounds()
        periodic = self._frequency > 0 and rounds % self._frequency == 0
        self._report(model, self._last, periodic or (self._checkpoint_at_end and rounds == self._final))
        return False

    def after_training(self, model: Any) -> Any:
        if self._checkpoint_at_end and self._last is not None and \
                self._checkpointed_rounds != model.num_boosted_rounds():
            self._report(model, self._last, True)
        return model
