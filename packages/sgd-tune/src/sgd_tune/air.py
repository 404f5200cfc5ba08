"""Ray Tune support for the AIR-style trainers: ``tune.Tuner(trainer, param_space=...)``.

``DataParallelTrainer.as_trainable()`` (and calling the trainer, which is how Tune runs
it when it is passed as is) gives a function trainable that, per trial, runs the trainer
with ``param_space["train_loop_config"]`` merged into its ``train_loop_config`` and hands
Tune rank 0's report of every round, with the checkpoint persisted in that round.

Actor reuse: a function trainable's trials are calls of one function in the trial actor's
process, so the started sgd trainer is kept in this module between calls (:data:`_KEPT`) and
the next trial with the same settings runs on its workers. The mixin
:class:`KeepWorkersMixin` (Tune adds a function's ``__mixins__`` to its trainable class) shuts
them down when Tune stops the actor.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from sgd_tune.trainable import newest_checkpoint, trial_resources

logger = logging.getLogger("sgd")

#: Tune gives a stopping function trainable's thread this long to end before it declines to
#: reuse the actor (``TUNE_FUNCTION_THREAD_TIMEOUT_S``, 2 s): stop the sgd run well within it.
_STOP_PATIENCE_S = 1.0

#: The started sgd trainer this process keeps between trials, with the settings it was made for.
_KEPT: Dict[str, Any] = {"key": None, "trainer": None}
#: Held while a trial runs, so that the actor's cleanup waits for the trial to let go.
_RUNNING = threading.Lock()


def _settings_key(trainer: Any) -> Tuple[Any, ...]:
    """What must be equal for two trials to share workers."""
    return (repr(trainer.backend_config), trainer.min_workers, trainer.max_workers,
            sorted(trainer.resources_per_worker.items()), trainer.placement_strategy, trainer.storage_path)


def _shutdown_kept() -> None:
    trainer, _KEPT["trainer"], _KEPT["key"] = _KEPT["trainer"], None, None
    if trainer is not None:
        try:
            trainer.shutdown()
        except Exception:
            logger.exception("shutting the kept sgd workers down failed")


class KeepWorkersMixin:
    """Mixed into the Tune function trainable of an AIR-style trainer: shuts the workers kept
    between trials down when Tune stops the trial actor."""

    def cleanup(self) -> None:
        try:
            super().cleanup()  # type: ignore[misc]  # tells the trial's thread to stop
        finally:
            # The thread ends its sgd run (STOPPED) before it lets go; then free the workers.
            if _RUNNING.acquire(timeout=30):
                try:
                    _shutdown_kept()
                finally:
                    _RUNNING.release()
            else:
                logger.warning("the trial did not end within 30s; shutting its sgd workers down anyway")
                _shutdown_kept()


#: Keys of ``param_space`` other than ``train_loop_config`` that replace a trainer argument.
_REPLACEABLE = ("scaling_config", "run_config", "datasets", "resume_from_checkpoint")


def _trial_trainer(base: Any, config: Dict[str, Any]) -> Any:
    trainer = copy.copy(base)
    overrides = dict(config)
    trainer.train_loop_config = {**base.train_loop_config, **(overrides.pop("train_loop_config", None) or {})}
    for key in _REPLACEABLE:
        if key in overrides:
            setattr(trainer, key, overrides.pop(key))
    if overrides:  # a framework trainer's own arguments (XGBoostTrainer's params=)
        overrides = trainer.apply_param_space(overrides)
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
        trainer.check_settings()
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
    sgd_trial.__mixins__ = (KeepWorkersMixin,)  # type: ignore[attr-defined]
    return sgd_trial


def _started_trainer(trainer: Any) -> Any:
    """The sgd trainer for this trial: the one kept from the previous trial on this actor if
    its settings match (its workers reused), else a new one, started."""
    # A new run_NNN in the trial's folder for each call: Tune decides what a trial resumes from
    # (tune.get_checkpoint()), not the folder's latest run (a PBT exploit hands another trial's).
    made = trainer.make_trainer(numbered_runs=True)
    key = _settings_key(made)
    kept = _KEPT["trainer"]
    if kept is not None and _KEPT["key"] == key and trainer.resuming_run_dir is None:
        kept.logdir, kept.run_dir, kept.max_retries = made.logdir, made.run_dir, made.max_retries
        kept.retry_worker_errors = made.retry_worker_errors
        return kept
    _shutdown_kept()
    made.start()
    _KEPT["trainer"], _KEPT["key"] = made, key
    return made


def _run_trial(trainer: Any, tune: Any) -> None:
    with _RUNNING:
        sgd_trainer = _started_trainer(trainer)
        context = tune.get_context()
        sgd_trainer.trial_info = {"name": context.get_trial_name(), "id": context.get_trial_id(),
                                  "experiment": context.get_experiment_name()}
        iterator = None
        try:
            iterator = trainer.run_on(sgd_trainer)
            seen: Optional[Path] = None
            for results in iterator:
                newest = newest_checkpoint(sgd_trainer.latest_checkpoint_dir)
                checkpoint = None
                if newest is not None and newest != seen:
                    seen = newest
                    checkpoint = tune.Checkpoint.from_directory(str(newest))
                tune.report(dict(results[0]), checkpoint=checkpoint)
        except SystemExit:
            # Tune stopped the trial (a scheduler, a stopper): its tune.report exits the thread.
            # End the run as STOPPED and keep the workers for the next trial on this actor.
            if iterator is not None:
                iterator.stop(patience_s=_STOP_PATIENCE_S)
            raise
        except BaseException:
            _shutdown_kept()
            raise
