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
round, 1:1, with ``should_checkpoint=True`` when a checkpoint goes with that report; Tune
then calls ``save_checkpoint``, which copies that sgd checkpoint directory into Tune's (it
loads with ``sgd.Trainer.load_checkpoint_from_path``). Which report a checkpoint goes with is
sgd's rule (``TrainingIterator.checkpoint_for``): ``sgd.report(metrics, checkpoint=...)`` says
it; a separate ``sgd.save_checkpoint`` goes with the report before it, or, in a run whose
first checkpoint came before its first report (save, then report: Ray Train 1.x's tests), with
the report after it. A report reaches Tune once the next round (or the end of the run) has
arrived: a checkpoint saved after it may still come, and the last result carries ``done``.

A reported ``training_iteration`` key would overwrite Tune's own count (and the iteration a
restored trial counts on from): it reaches Tune as ``reported_training_iteration``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple

from ray import tune
from ray.tune.execution.placement_groups import PlacementGroupFactory
from ray.tune.result import DONE, SHOULD_CHECKPOINT, TRAINING_ITERATION

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
        # Rank 0's last round, not yet given to Tune (its checkpoint may still come), with its
        # sgd iteration and, when its checkpoint is already known, a copy of it kept safe.
        self._pending: Optional[Tuple[Dict[str, Any], int, Optional[Path]]] = None
        # The checkpoint of the newest result Tune got that had one: what Tune's save_checkpoint
        # copies, also when Tune asks by itself (PBT, a pause), never one of a later result.
        self._last_checkpoint: Optional[Path] = None
        self._handed: set = set()  # paths of the sgd checkpoints Tune got
        self._checkpoint_dir: Optional[Path] = None  # this trial's sgd run's checkpoints
        self._warned_iteration_key = False
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
            return self._hand_pending()

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        source = self._last_checkpoint or self._restored_dir or self._newest_checkpoint()
        if source is None or not source.is_dir():
            # Asked by Tune (checkpoint_frequency, pause) before the training function saved anything.
            logger.warning("trial %s: no sgd checkpoint to save yet; the Tune checkpoint is empty", self.trial_id)
            return None
        shutil.copytree(source, checkpoint_dir, dirs_exist_ok=True)
        return None

    def load_checkpoint(self, checkpoint: Any) -> None:
        if self._iterator is not None:  # restored into a running trial: start the run over
            self._stop_run()
            self._iterator, self._pending, self._checkpoint_dir = None, None, None
            self._set_last(None)
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
        shutil.rmtree(self._kept_dir(), ignore_errors=True)

    def _next_result(self) -> Dict[str, Any]:
        """The next result for Tune: one report round, with its checkpoint (see the module docstring)."""
        while True:
            try:
                results = next(self._iterator)
            except StopIteration:
                # The workers stay up: a reused actor runs the next trial on them; cleanup()
                # shuts them down otherwise.
                return self._final_result()
            current = self._for_tune(results[0])
            iteration = int(results[0].get("_training_iteration", 0))
            known = self._iterator.checkpoint_for(iteration)  # paired in the report, or saved before it
            # One round held back: its checkpoint may still come (saved after the report), and
            # the end of the run is marked on the last result, not on one of its own. A
            # checkpoint already here is kept safe from sgd's retention meanwhile.
            out = self._hand_pending() if self._pending is not None else None
            if known is not None:
                self._handed.add(str(known))
            self._pending = (current, iteration, self._keep(known, iteration) if known else None)
            if out is not None:
                return out

    def _final_result(self) -> Dict[str, Any]:
        """The end of the run: the last report, marked ``done``. A checkpoint that goes with no
        report (saved after the last one in a run that saves before reporting, or in a run that
        never reports) reaches Tune with it, or, when that report has a checkpoint of its own,
        on one more result of its own (``done``, no metrics)."""
        out = self._hand_pending() if self._pending is not None else None
        newest = self._newest_checkpoint()
        trailing = newest if newest is not None and str(newest) not in self._handed else None
        if trailing is not None and (out is None or not out[SHOULD_CHECKPOINT]):
            self._handed.add(str(trailing))
            self._set_last(trailing)
            return dict(out or {}, **{DONE: True, SHOULD_CHECKPOINT: True})
        if out is None:
            return {DONE: True, SHOULD_CHECKPOINT: False}
        if trailing is None:
            return dict(out, **{DONE: True})
        return out  # not done yet: the next step() hands the trailing checkpoint on a result of its own

    def _hand_pending(self) -> Dict[str, Any]:
        assert self._pending is not None
        result, iteration, kept = self._pending
        self._pending = None
        checkpoint = kept or (self._iterator.checkpoint_for(iteration) if self._iterator is not None else None)
        if checkpoint is not None and kept is None:
            self._handed.add(str(checkpoint))
        if checkpoint is not None:
            self._set_last(checkpoint)
        return dict(result, **{SHOULD_CHECKPOINT: checkpoint is not None})

    def _for_tune(self, result: Dict[str, Any]) -> Dict[str, Any]:
        out = dict(result)
        if TRAINING_ITERATION in out:
            out["reported_training_iteration"] = out.pop(TRAINING_ITERATION)
            if not self._warned_iteration_key:
                self._warned_iteration_key = True
                logger.warning("trial %s: the reported metric %r is Tune's own count of results; it reaches Tune as "
                               "'reported_training_iteration'", self.trial_id, TRAINING_ITERATION)
        return out

    def _set_last(self, checkpoint: Optional[Path]) -> None:
        previous, self._last_checkpoint = self._last_checkpoint, checkpoint
        if previous is not None and previous != checkpoint and previous.parent == self._kept_dir():
            shutil.rmtree(previous, ignore_errors=True)  # a hard-linked copy: the links go

    def _kept_dir(self) -> Path:
        return Path(self.logdir) / "sgd_checkpoints_for_tune"

    def _keep(self, checkpoint: Path, iteration: int) -> Path:
        """A copy of ``checkpoint`` (hard links: no bytes copied) that sgd's retention cannot
        remove before Tune asks for it."""
        target = self._kept_dir() / f"iteration_{iteration:06d}"
        shutil.rmtree(target, ignore_errors=True)
        try:
            shutil.copytree(checkpoint, target, copy_function=os.link)
        except OSError:  # another filesystem
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(checkpoint, target)
        return target

    def _newest_checkpoint(self) -> Optional[Path]:
        return newest_checkpoint(self._checkpoint_dir)

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
