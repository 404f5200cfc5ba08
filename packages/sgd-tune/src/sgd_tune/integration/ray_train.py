"""Ray Tune over an AIR-style trainer, the Ray Train 2.x way: a Tune trial is a *driver function*
that builds a trainer and calls ``fit()``; :class:`TuneReportCallback` in the trainer's
``RunConfig(callbacks=[...])`` hands Tune each round.

Counterpart of ``ray.tune.integration.ray_train`` (also importable as ``sgd_tune.TuneReportCallback``)::

    def train_driver_fn(config):
        trainer = TorchTrainer(train_fn_per_worker, train_loop_config=config["train_loop_config"],
                               scaling_config=sgd.ScalingConfig(num_workers=2),
                               run_config=sgd.RunConfig(name=f"train-{tune.get_context().get_trial_id()}",
                                                        callbacks=[TuneReportCallback()]))
        trainer.fit()

    tune.Tuner(train_driver_fn, param_space={"train_loop_config": {...}}).fit()

sgd's driver is the process that calls ``fit()``, so here the trial's own thread: each round is
reported to Tune from it with ``ray.tune.report``, as the trial would itself.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from sgd import Checkpoint, UserCallback

#: The metric that holds the path of a round's checkpoint (Ray's name).
CHECKPOINT_PATH_KEY = "checkpoint_path"


def _in_tune_session() -> bool:
    try:
        from ray.tune.trainable.trainable_fn_utils import _in_tune_session as in_session
    except ImportError:  # a Ray that moved it: ask Tune's context instead
        import ray.tune

        try:
            return bool(ray.tune.get_context().get_trial_id())
        except Exception:
            return False
    return bool(in_session())


class TuneReportCallback(UserCallback):
    """Reports every round of a trainer's run to the Ray Tune trial that runs ``fit()`` (Ray's
    ``ray.tune.integration.ray_train.TuneReportCallback``).

    Each round, rank 0's metrics go to Tune (``ray.tune.report``), with ``checkpoint_path`` (the
    round's checkpoint folder, as Ray adds it) when the round has a checkpoint. Beyond Ray, the
    checkpoint itself is reported to Tune too, so that the trial's ``Result.checkpoint`` (and
    ``ResultGrid.get_best_result().checkpoint``) is it; ``report_checkpoints=False`` reports the
    path alone, as Ray does (no copy into Tune's trial folder).

    :param report_checkpoints: also hand Tune each checkpoint (Tune copies it into the trial).
    :raises RuntimeError: made outside a Ray Tune trial (as Ray's).
    """

    def __init__(self, report_checkpoints: bool = True):
        if not _in_tune_session():
            raise RuntimeError("TuneReportCallback must be used in a Tune session: make it in the function "
                               "passed to ray.tune.Tuner (the trial), not in the script that starts the Tuner")
        if not isinstance(report_checkpoints, bool):
            raise TypeError(f"report_checkpoints must be True or False, got {report_checkpoints!r}")
        self.report_checkpoints = report_checkpoints

    def after_report(self, run_context: Any, metrics: List[Dict[str, Any]],
                     checkpoint: Optional[Checkpoint]) -> None:
        """Hand rank 0's metrics (and the checkpoint) of one round to Tune."""
        import ray.tune

        result = dict(metrics[0])
        tune_checkpoint = None
        if checkpoint is not None:
            result[CHECKPOINT_PATH_KEY] = checkpoint.path
            if self.report_checkpoints and checkpoint.path is not None:
                tune_checkpoint = ray.tune.Checkpoint.from_directory(checkpoint.path)
        ray.tune.report(result, checkpoint=tune_checkpoint)


__all__ = ["CHECKPOINT_PATH_KEY", "TuneReportCallback"]
