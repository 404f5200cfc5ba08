"""``LightGBMReportCallback``: reports each boosting round's evaluation metrics to sgd and
checkpoints the model as LightGBM's text model (Ray Train's ``RayTrainReportCallback``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import sgd
from sgd_xgboost import _metrics
from sgd_xgboost.checkpoints import LIGHTGBM_MODEL, load_lightgbm_model, write_checkpoint

__all__ = ["LightGBMReportCallback"]


class LightGBMReportCallback:
    """Pass it to ``lightgbm.train(callbacks=[...])`` inside a training function: every round
    calls :func:`sgd.report` on every worker with the round's evaluation results, keyed
    ``"<dataset>-<metric>"`` (``"valid-binary_logloss"``; ``lightgbm.cv``'s as
    ``"<dataset>-<metric>-mean"`` and ``"...-stdv"``); rank 0 adds a checkpoint holding the
    model (``model.txt``) every ``frequency`` rounds and with the last round's report.

    Arguments as :class:`sgd_xgboost.XGBoostReportCallback`.
    """

    CHECKPOINT_NAME = LIGHTGBM_MODEL
    #: LightGBM runs callbacks by ``order``: after its own evaluation recording (20) and
    #: before early stopping (30), so the round that stops early is still reported.
    order = 25
    before_iteration = False

    def __init__(self, metrics: _metrics.Metrics = None, filename: str = LIGHTGBM_MODEL, frequency: int = 0,
                 checkpoint_at_end: bool = True,
                 results_postprocessing_fn: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None):
        self._metrics = metrics
        self._filename = filename
        self._frequency = _metrics.check_frequency(frequency)
        self._checkpoint_at_end = checkpoint_at_end
        self._postprocess = results_postprocessing_fn

    @classmethod
    def get_model(cls, checkpoint: Any, filename: str = LIGHTGBM_MODEL) -> Any:
        """The ``lightgbm.Booster`` in a checkpoint this callback wrote."""
        return load_lightgbm_model(checkpoint, filename)

    def __call__(self, env: Any) -> None:
        flat: Dict[str, Any] = {}
        for item in env.evaluation_result_list or []:
            if len(item) > 4:  # lightgbm.cv: (data, metric, mean, higher_better, stdv)
                flat[f"{item[0]}-{item[1]}-mean"] = item[2]
                flat[f"{item[0]}-{item[1]}-stdv"] = item[4]
            else:
                flat[f"{item[0]}-{item[1]}"] = item[2]
        metrics = _metrics.finish(_metrics.select(flat, self._metrics), self._postprocess)
        rounds = env.iteration + 1
        checkpoint = (self._frequency > 0 and rounds % self._frequency == 0) or (
            self._checkpoint_at_end and rounds == env.end_iteration)
        if checkpoint and sgd.world_rank() == 0:
            import lightgbm

            with write_checkpoint("lightgbm", lightgbm.__version__, self._filename, env.model.save_model,
                                  rounds) as ckpt:
                sgd.report(metrics, checkpoint=ckpt)
        else:
            sgd.report(metrics)
