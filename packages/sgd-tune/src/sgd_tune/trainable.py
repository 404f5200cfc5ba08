"""``SgdTrainable``: a Ray Tune class trainable that runs one sgd worker group per trial.

A class trainable rather than a function one, on purpose: Tune calls ``step()`` once per
result and ``cleanup()`` when it stops a trial (ASHA, ``max_failures`` retries, the end of
the experiment), so the trial's workers are shut down synchronously in the trial actor
instead of in a daemon thread that Tune may abandon.

Actor reuse (``TuneConfig(reuse_actors=True)``): the started sgd trainer lives as long as the
actor, not the trial. A finished trial leaves its workers up; ``reset_config`` ends a run still
going as ``STOPPED`` (the trial was stopped or paused by a scheduler), clears everything of the
trial, and the next ``step()`` starts the new trial's run on the same workers. ``cleanup()``
(Tune is done with the actor) stops a run still going, then shuts the workers down.

How a round becomes a result: each ``step()`` hands Tune rank 0's dict of one report
round. A checkpoint belongs to the report that *precedes* it (the documented pattern is
``sgd.report(...)`` then ``sgd.save_checkpoint(...)``), which the driver only knows once the
next round (or the end of the run) arrives, so results reach Tune one round late. A result
followed by a checkpoint carries ``should_checkpoint=True``; Tune then calls
``save_checkpoint``, which copies the newest sgd checkpoint directory into Tune's, so a Tune
checkpoint loads with ``sgd.Trainer.load_checkpoint_from_path``.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, List, Optional

from ray import tune
from ray.tune.execution.placement_groups import PlacementGroupFactory
from ray.tune.result import DONE, SHOULD_CHECKPOINT

import sgd
from sgd.checkpoint import METADATA_FILE

logger = logging.getLogger("sgd")

_CHECKPOINT_DIR = re.compile(r"checkpoint_(\d{6})$")


def trial_resources(num_workers: int, resources_per_worker: Dict[str, float]) -> PlacementGroupFactory:
    """The placement group one trial asks for: a bundle for the trial's driver, one per worker.

    sgd's ``WorkerGroup`` started inside this group uses its last ``num_workers`` bundles.
    Zero entries are dropped (Ray rejects them in bundles); custom resources are kept.
    """
    bundle = {k: v for k, v in resources_per_worker.items() if v > 0}
    driver: Dict[str, float] = {"CPU": 1}
    bundles: List[Dict[str, float]] = [driver] + [dict(bundle) for _ in range(num_workers)]
    return PlacementGroupFactory(bundles, strategy="PACK")


def newest_checkpoint(folder: Optional[Path]) -> Optional[Path]:
    """The highest-numbered ``checkpoint_NNNNNN`` directory in ``folder`` (``None`` if none)."""
    if folder is None or not folder.is_dir():
        return None
    found = [p for p in folder.iterdir() if _CHECKPOINT_DIR.match(p.name) and p.is_dir()]
    return max(found, key=lambda p: p.name, default=None)


class SgdTrainable(tune.Trainable):
    """Base class of the trainables ``Trainer.to_tune_trainable`` returns.

    :func:`make_trainable` subclasses it with the trainer's settings, the training function
    and the dataset as class attributes; use that, not this class, directly.
    """

    _sgd_trainer_kwargs: ClassVar[Dict[str, Any]] = {}
    _sgd_train_func: ClassVar[Optional[Callable[..., Any]]] = None
    _sgd_dataset: ClassVar[Any] = None

    @classmethod
    def default_resource_request(cls, config: Dict[str, Any]) -> PlacementGroupFactory:
        kwargs = cls._sgd_trainer_kwargs
        num_workers = kwargs["num_workers"]
        if isinstance(num_workers, tuple):  # elastic: reserve the most it may use
            num_workers = num_workers[1]
        return trial_resources(num_workers, kwargs["resources_per_worker"])

    # --- Tune's lifecycle --------------------------------------------------------------

    def setup(self, config: Dict[str, Any]) -> None:
        # The sgd trainer (and its started workers) outlives a trial when Tune reuses this
        # actor (``reuse_actors=True``): reset_config() keeps it, cleanup() shuts it down.
        self._trainer: Optional[sgd.Trainer] = None
        self._reset_trial_state()

    def _reset_trial_state(self) -> None:
        """Everything that belongs to one trial (and must not reach the next on this actor)."""
        self._iterator: Any = None
        self._pending: Optional[Dict[str, Any]] = None  # rank 0's last round, not yet given to Tune
        self._pending_checkpoint = False  # a checkpoint arrived before the first report
        self._newest_seen: Optional[Path] = None
        self._checkpoint_dir: Optional[Path] = None  # this trial's sgd run's checkpoints
        self._restored_state: Optional[dict] = None
        self._restored_dir: Optional[Path] = None
        self._error: Optional[BaseException] = None  # raised by the step after the last result

    def step(self) -> Dict[str, Any]:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        try:
            if self._iterator is None:
                self._begin()
            return self._next_result()
        except BaseException as exc:
            # Free the workers now: Tune may kill this actor without calling cleanup().
            self._stop_trainer()
            if self._pending is None or not isinstance(exc, Exception):
                raise
            # Hand Tune the round (and checkpoint) that preceded the failure first, so a
            # retry (max_failures) resumes from the newest checkpoint; fail on the next step.
            self._error = exc
            result = dict(self._pending, **{SHOULD_CHECKPOINT: self._saw_new_checkpoint() or self._pending_checkpoint})
            self._pending, self._pending_checkpoint = None, False
            return result

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        source = self._newest_checkpoint() or self._restored_dir
        if source is None:
            # Asked by Tune (checkpoint_frequency, pause) before the training function saved anything.
            logger.warning("trial %s: no sgd checkpoint to save yet; the Tune checkpoint is empty", self.trial_id)
            return None
        shutil.copytree(source, checkpoint_dir, dirs_exist_ok=True)
        return None

    def load_checkpoint(self, checkpoint: Any) -> None:
        if self._iterator is not None:  # restored into a running trial: start the run over
            self._stop_run()
            self._iterator, self._pending, self._pending_checkpoint = None, None, False
            self._newest_seen = self._checkpoint_dir = None
        path = Path(checkpoint) if isinstance(checkpoint, (str, Path)) else None
        if path is None or not (path / METADATA_FILE).exists():
            logger.warning("trial %s: Tune checkpoint %s holds no sgd checkpoint; starting from scratch",
                           self.trial_id, checkpoint)
            self._restored_state = self._restored_dir = None
            return
        # Tune may remove its copy once restored; keep ours for a later save_checkpoint().
        own = Path(self.logdir) / "sgd_restored_checkpoint"
        shutil.rmtree(own, ignore_errors=True)
        shutil.copytree(path, own)
        self._restored_dir = own
        self._restored_state = sgd.Trainer.load_checkpoint_from_path(own)

    def reset_config(self, new_config: Dict[str, Any]) -> bool:
        """Take the next trial on this actor (``reuse_actors=True``), keeping the workers.

        A run still going (the previous trial was stopped by a scheduler, or paused by PBT)
        ends as ``STOPPED``; the next ``step()`` starts a fresh run (new run directory under
        the new trial's directory, new config, no checkpoint unless Tune restores one) on the
        same worker processes. Always returns True: Tune treats False as a failed trial that
        it never reports to its search algorithm, which stalls a search with
        ``max_concurrent_trials`` (the reuse hang of issue 22). If the workers cannot be kept,
        they are shut down and the next trial starts new ones.
        """
        try:
            self._stop_run()
        except Exception:
            logger.exception("trial %s: stopping the previous trial's run failed; starting new workers",
                             self.trial_id)
            self._stop_trainer()
        self._reset_trial_state()
        return True

    def cleanup(self) -> None:
        try:
            self._stop_run()
        finally:
            self._stop_trainer()

    # --- sgd side ------------------------------------------------------------------------

    def _begin(self) -> None:
        logdir = (Path(self.logdir) / "sgd").resolve()
        trainer = self._trainer
        if trainer is None:
            trainer = sgd.Trainer(**self._sgd_trainer_kwargs, logdir=logdir)
            trainer.start()
            self._trainer = trainer
        else:  # a reused actor: the same workers, this trial's directory
            trainer.logdir = logdir
        info = getattr(self, "_trial_info", None)  # Tune's record of the trial; None outside Tune
        trainer.trial_info = {"name": self.trial_name, "id": self.trial_id,
                              "experiment": getattr(info, "experiment_name", None) or Path(self.logdir).parent.name}
        train_func = type(self)._sgd_train_func
        if train_func is None:
            raise TypeError(f"{type(self).__name__} has no training function; build it with sgd_tune.make_trainable")
        self._iterator = trainer.run_iterator(
            train_func, config=self.config, dataset=self._sgd_dataset,
            checkpoint=self._restored_state,
        )
        self._checkpoint_dir = trainer.latest_checkpoint_dir
        self._newest_seen = None

    def _next_result(self) -> Dict[str, Any]:
        while True:
            try:
                results = next(self._iterator)
            except StopIteration:
                # The workers stay up: a reused actor runs the next trial on them; cleanup()
                # shuts them down otherwise.
                new = self._saw_new_checkpoint()
                if self._pending is None:
                    return {DONE: True, SHOULD_CHECKPOINT: new}
                result = dict(self._pending, **{DONE: True, SHOULD_CHECKPOINT: new or self._pending_checkpoint})
                self._pending = None
                return result
            new = self._saw_new_checkpoint()
            current = dict(results[0])
            if self._pending is None:
                # A checkpoint saved before the first report goes with the first report.
                self._pending, self._pending_checkpoint = current, new
                continue
            result = dict(self._pending, **{SHOULD_CHECKPOINT: new or self._pending_checkpoint})
            self._pending, self._pending_checkpoint = current, False
            return result

    def _newest_checkpoint(self) -> Optional[Path]:
        return newest_checkpoint(self._checkpoint_dir)

    def _saw_new_checkpoint(self) -> bool:
        newest = self._newest_checkpoint()
        if newest is None or newest == self._newest_seen:
            return False
        self._newest_seen = newest
        return True

    def _stop_run(self) -> None:
        """End a run still going (Tune stopped or paused the trial) as ``STOPPED``."""
        iterator = self._iterator
        if iterator is not None and not iterator.is_finished():
            iterator.stop()

    def _stop_trainer(self) -> None:
        trainer, self._trainer = self._trainer, None
        if trainer is not None:
            try:
                trainer.shutdown()
            except Exception:
                logger.exception("trial %s: shutting the sgd workers down failed", getattr(self, "trial_id", "?"))


def _trainable_name(train_func: Callable[..., Any]) -> str:
    name = re.sub(r"\W+", "_", getattr(train_func, "__name__", "train_func")).strip("_")
    return f"sgd_{name or 'train_func'}"


def make_trainable(trainer: sgd.Trainer, train_func: Callable[..., Any], dataset: Any = None) -> type:
    """A subclass of :class:`SgdTrainable` that runs ``train_func`` with ``trainer``'s settings.

    Each trial builds its own ``sgd.Trainer`` (same backend config, workers, resources,
    ``max_retries``; ``logdir`` under the trial's directory). ``trainer`` itself is never started.
    """
    kwargs = trainer.settings()
    attrs = {
        "_sgd_trainer_kwargs": kwargs,
        "_sgd_train_func": staticmethod(train_func),
        "_sgd_dataset": dataset,
        "__module__": __name__,
        "__doc__": f"Ray Tune trainable running {getattr(train_func, '__qualname__', train_func)!s} with sgd.",
    }
    return type(_trainable_name(train_func), (SgdTrainable,), attrs)
