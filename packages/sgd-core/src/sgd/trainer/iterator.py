"""``TrainingIterator``: the report rounds of one run, as ``Trainer.run_iterator`` hands them out."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from sgd._common.public import public_module
from sgd.run.controller import ActiveRun


@public_module("sgd.trainer")
class TrainingIterator:
    """Iterates over the report rounds of one run; each item is a list of per-worker dicts.

    Made by :meth:`Trainer.run_iterator`, which always returns one: a failure of the run,
    even while it starts, comes out of ``next()``.
    """

    def __init__(self, run: ActiveRun):
        self._run = run

    def __iter__(self) -> TrainingIterator:
        return self

    def __next__(self) -> List[Dict[str, Any]]:
        results = self._run.next()
        if results is None:
            raise StopIteration
        return results

    def is_finished(self) -> bool:
        return self._run.finished

    def checkpoint_for(self, iteration: int) -> Optional[Path]:
        """The committed checkpoint directory that goes with report ``iteration`` (its
        ``_training_iteration``), or ``None`` (none goes with it, or retention removed it).

        ``sgd.report(metrics, checkpoint=...)`` pairs them itself; a separate
        ``sgd.save_checkpoint`` goes with the report before it, or, in a run whose first
        checkpoint came before its first report, with the report after it (docs:
        checkpoints-and-fault-tolerance, "Which report a checkpoint goes with"). A checkpoint
        that goes with the report before it is known once the next round arrives.
        """
        return self._run.checkpoint_for(iteration)

    def stop(self, patience_s: float = 5.0) -> None:
        """End the run early, on purpose, and keep the workers for the next run.

        The run directory's status becomes ``STOPPED`` (``sgd runs ls`` shows it); rounds not
        yet taken are dropped and callbacks get ``finish_training(error=False)``. Each worker's
        training function ends at its next ``sgd.report`` / ``sgd.save_checkpoint`` (which
        raises a ``BaseException`` there, so ``except Exception`` does not catch it); workers
        that do not get there within ``patience_s`` seconds are killed and replaced before
        the next run. Does nothing on a finished run. sgd-tune calls it when Tune stops a
        trial (ASHA, PBT, a stopper).
        """
        if patience_s < 0:
            raise ValueError(f"patience_s must be >= 0 seconds, got {patience_s!r}")
        self._run.stop(patience_s)

    def get_final_results(self, force: bool = False) -> Optional[List[Any]]:
        """The return values in rank order; ``None`` while running unless ``force``,
        which drains (and hands to callbacks) the remaining rounds first."""
        if not self._run.finished:
            if not force:
                return None
            for _ in self:
                pass
        return self._run.returns
