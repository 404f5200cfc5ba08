"""``sgd_xgboost.xgboost``: Ray Train 2.60's ``ray.train.xgboost`` under sgd.

Every name of that module's ``__all__`` is here with Ray's signature and meaning, so Ray code
moves over by renaming its import::

    from ray.train.xgboost import RayTrainReportCallback, XGBoostTrainer   # Ray Train 2.60
    from sgd_xgboost.xgboost import RayTrainReportCallback, XGBoostTrainer # sgd

One module per Ray module, as Ray has it: ``sgd_xgboost.lightgbm`` holds LightGBM's own
``RayTrainReportCallback``. Importing this module imports XGBoost (its callback subclasses
XGBoost's ``TrainingCallback``); ``import sgd_xgboost`` still imports neither framework.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

from sgd_xgboost.checkpoints import XGBOOST_MODEL, XGBoostCheckpoint
from sgd_xgboost.config import XGBoostConfig
from sgd_xgboost.trainer import XGBoostTrainer
from sgd_xgboost.xgboost_callback import XGBoostReportCallback

__all__ = ["RayTrainReportCallback", "XGBoostCheckpoint", "XGBoostConfig", "XGBoostTrainer"]


class RayTrainReportCallback(XGBoostReportCallback):
    """Ray Train's XGBoost report callback: pass it to ``xgboost.train(callbacks=[...])`` in a
    training function.

    Every boosting round, every worker calls :func:`sgd.report` with the round's evaluation
    results, keyed ``"<dataset>-<metric>"`` (``"train-logloss"``). Rank 0 attaches a checkpoint
    holding the model (``filename``, UBJSON by default) every ``frequency`` rounds, and, with
    ``checkpoint_at_end``, after the last round (one more report with the last round's metrics,
    unless that round was checkpointed already); the other ranks report the metrics only.
    Load the model with :meth:`get_model` (``RayTrainReportCallback.get_model(result.checkpoint)``).

    :param metrics: the results to report: ``None`` (all), a name, a list of names, or a dict
        ``{reported key: "<dataset>-<metric>"}`` to rename them. A name that XGBoost did not
        compute raises ``KeyError`` listing those it did.
    :param filename: the model's file name in the checkpoint (``"model.json"`` for JSON).
    :param frequency: checkpoint every this many rounds; ``0`` (the default): none during
        training. Counted over the whole model, so a model resumed with ``xgb_model=`` keeps
        its rhythm (Ray counts the rounds of this ``xgboost.train`` call).
    :param checkpoint_at_end: checkpoint after the last round.
    :param results_postprocessing_fn: ``fn(metrics) -> metrics`` applied before each report
        (for example to average the folds of ``xgboost.cv``).
    """

    CHECKPOINT_NAME = XGBOOST_MODEL

    def __init__(
        self,
        metrics: Optional[Union[str, List[str], Dict[str, str]]] = None,
        filename: str = CHECKPOINT_NAME,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
        *,
        num_boost_round: Optional[int] = None,
    ):
        super().__init__(metrics=metrics, filename=filename, frequency=frequency, checkpoint_at_end=checkpoint_at_end,
                         results_postprocessing_fn=results_postprocessing_fn, num_boost_round=num_boost_round)

    @classmethod
    def get_model(cls, checkpoint: Any, filename: str = CHECKPOINT_NAME) -> Any:
        """The ``xgboost.Booster`` saved in ``checkpoint`` by this callback (``filename`` as
        given to the callback).

        :raises ValueError: the checkpoint holds no XGBoost model under that name.
        """
        return super().get_model(checkpoint, filename)
