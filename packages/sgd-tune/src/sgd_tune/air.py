"""Ray Tune support for the AIR-style trainers: ``tune.Tuner(trainer, param_space=...)``.

``DataParallelTrainer.as_trainable()`` (and calling the trainer, which is how Tune runs
it when it is passed as is) gives a function trainable that, per trial, runs the trainer
with ``param_space["train_loop_config"]`` merged into its ``train_loop_config`` and hands
Tune rank 0's report of every round, with the checkpoint persisted in that round.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from sgd_tune.trainable import newest_checkpoint, trial_resources

#: Keys of ``param_space`` other than ``train_loop_config`` that replace a trainer argument.
_REPLACEABLE = ("scaling_config", "run_config", "datasets", "resume_from_checkpoint")


def _trial_trainer(base: Any, config: Dict[str, Any]) -> Any:
    trainer = copy.copy(base)
    overrides = dict(config)
    trainer.train_loop_config = {**base.train_loop_config, **(overrides.pop("train_loop_config", None) or {})}
    for key in _REPLACEABLE:
        if key in overrides:
            setattr(trainer, key, overrides.pop(key))
    if overrides:
        raise ValueError(
            f"param_space keys {', '.join(sorted(overrides))} are not trainer arguments; put the "
            "training function's settings under param_space={'train_loop_config': {...}}"
        )
    return trainer


def make_air_trainable(base: Any) -> Callable[[Dict[str, Any]], None]:
    """A Tune function trainable (with its resources attached) that runs ``base`` per trial."""
    sc = base.scaling_config
    num_workers = sc.num_workers[1] if isinstance(sc.num_workers, tuple) else sc.num_workers
    from sgd.utils import resolve_resources

    resources = resolve_resources(sc.use_gpu, sc.resources_per_worker)

    def sgd_trial(config: Dict[str, Any]) -> None:
        from ray import tune

        trainer = _trial_trainer(base, config)
        trial_dir = Path(tune.get_context().get_trial_dir())
        trainer.run_config = dataclasses.replace(trainer.run_config, storage_path=str(trial_dir), name="sgd")
        restored = tune.get_checkpoint()
        if restored is not None:  # Tune retrying the trial (max_failures) or resuming it
            own = trial_dir / "sgd_restored_checkpoint"
            shutil.rmtree(own, ignore_errors=True)
            with restored.as_directory() as local:
                shutil.copytree(local, own)
            import sgd

            trainer.resume_from_checkpoint = sgd.Checkpoint.from_directory(own)
        _run_trial(trainer, tune)

    sgd_trial._resources = trial_resources(num_workers, resources)  # type: ignore[attr-defined]
    return sgd_trial


def _run_trial(trainer: Any, tune: Any) -> None:
    sgd_trainer = trainer._make_trainer()
    context = tune.get_context()
    sgd_trainer.trial_info = {"name": context.get_trial_name(), "id": context.get_trial_id(),
                              "experiment": context.get_experiment_name()}
    checkpoint_config = trainer.run_config.checkpoint_config
    strategy = checkpoint_config.to_strategy() if checkpoint_config is not None else None
    sgd_trainer.start()
    try:
        iterator = sgd_trainer.run_iterator(
            trainer.train_loop_per_worker, config=trainer.train_loop_config, dataset=trainer.datasets,
            checkpoint=trainer.resume_from_checkpoint, checkpoint_strategy=strategy,
            callbacks=trainer.run_config.callbacks, dataset_config=trainer.dataset_config,
        )
        seen: Optional[Path] = None
        for results in iterator:
            newest = newest_checkpoint(sgd_trainer.latest_checkpoint_dir)
            checkpoint = None
            if newest is not None and newest != seen:
                seen = newest
                checkpoint = tune.Checkpoint.from_directory(str(newest))
            tune.report(dict(results[0]), checkpoint=checkpoint)
    finally:
        sgd_trainer.shutdown()

