"""Ray Tune adaptation for sgd: ``Trainer.to_tune_trainable`` runs one worker group per trial.

sgd core reaches this package through the ``sgd_tune_trainable`` hook (entry point
``tune = "sgd_tune.plugin"``). The names below are re-exported lazily: loading sgd's plugins
imports ``sgd_tune`` but must not import Ray Tune.

``TuneReportCallback`` (from :mod:`sgd_tune.integration.ray_train`) is Ray Train 2.x's way of
tuning: a Tune trial calls a trainer's ``fit()``, and the callback reports each round to Tune.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sgd_tune.integration.ray_train import TuneReportCallback
    from sgd_tune.trainable import SgdTrainable, make_trainable, trial_resources

__all__ = ["SgdTrainable", "TuneReportCallback", "make_trainable", "trial_resources"]


def __getattr__(name: str) -> Any:
    if name == "TuneReportCallback":
        from sgd_tune.integration import ray_train

        return ray_train.TuneReportCallback
    if name in __all__:
        from sgd_tune import trainable

        return getattr(trainable, name)
    raise AttributeError(f"module 'sgd_tune' has no attribute {name!r}")
