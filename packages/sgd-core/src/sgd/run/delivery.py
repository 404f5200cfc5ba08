"""One run's rounds on their way out: persisted, checkpoints registered, handed to the hooks.

:class:`Delivery` is the run controller's (:mod:`sgd.run.controller`) one place where a round
meets the run directory and the :class:`~sgd.storage.manager.CheckpointManager`. Every report
is written to ``results.jsonl`` once (a round replayed after a restart is recognised by its
iteration and dropped), and every checkpoint (always a folder the workers wrote, a
:class:`~sgd._common.protocol.WrittenCheckpoint`) is registered once, filed under the report it
goes with.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from sgd._common.protocol import Round, WrittenCheckpoint, detailed_metrics_enabled
from sgd.checkpoint import METADATA_FILE
from sgd.storage.manager import CheckpointManager
from sgd.storage.run_dir import RunDirectory

logger = logging.getLogger("sgd")


class Delivery:
    """Rounds in, results out, checkpoints committed.

    :param hand_out: called with each delivered report round's results (the hooks, then the
        callbacks).
    :param after_checkpoint: called after each committed checkpoint (the scaling policy's moment).
    """

    def __init__(self, run_dir: RunDirectory, manager: CheckpointManager,
                 hand_out: Callable[[List[Dict[str, Any]]], None], after_checkpoint: Callable[[], None]):
        self._run_dir = run_dir
        self._manager = manager
        self._hand_out = hand_out
        self._after_checkpoint = after_checkpoint
        #: the last report delivered (a resumed run starts after its run directory's last line)
        self.delivered_iteration = run_dir.last_iteration()
        manager.delivered_iteration = self.delivered_iteration
        # The report the workers' stream is at (replayed ones after a restart included), and
        # whether this run saves its checkpoints before the report they go with: decided by
        # its first checkpoint (saved before any report: yes). See file_under.
        self.position = 0
        self._save_then_report: Optional[bool] = None
        #: asynchronously written checkpoints announced, not yet complete: (payload, iteration)
        self._pending: List[Tuple[WrittenCheckpoint, int]] = []

    def restarted(self, start_iteration: int) -> None:
        """New workers start counting after ``start_iteration``; the old ones' background
        writes never complete."""
        self.position = start_iteration
        self._pending.clear()

    def deliver(self, round_: Round, flush: bool = True) -> Optional[List[Dict[str, Any]]]:
        """Persist one round and hand it out; ``None`` when there is nothing to hand out (a
        checkpoint round, a round replayed after a restart). ``flush=False``: a round of a burst
        that is not its last (see :meth:`RunDirectory.append_line`); a round with a checkpoint
        is flushed whatever it says, before the checkpoint is registered."""
        manager = self._manager
        if self._pending:
            self.commit_pending()
        if round_.is_checkpoint:
            saved = round_.saved_state
            if not isinstance(saved, WrittenCheckpoint):
                raise TypeError(f"rank 0 sent {type(saved).__name__} for a checkpoint, not the folder it wrote")
            if saved.pending:
                # Written in the background: committed once its metadata appears (in order).
                self._pending.append((saved, self.file_under()))
                self.commit_pending()
                return None
            manager.register(Path(saved.path), saved.score_values, self.file_under())
            self._after_checkpoint()
            return None
        iteration = round_.iteration
        self.position = iteration
        if self._save_then_report is None:
            self._save_then_report = False
        if iteration <= self.delivered_iteration:
            manager.discard([c.path for c in round_.checkpoints if isinstance(c, WrittenCheckpoint)])
            return None  # replayed after a restart: callbacks already have it
        self.delivered_iteration = iteration
        results = round_.results
        has_checkpoint = round_.has_reported_checkpoint
        if has_checkpoint:
            manager.registering(iteration)  # before its line: see sgd._worker.reported
        self._run_dir.append_line(round_.json_line(), flush or has_checkpoint)
        manager.delivered(iteration)
        if has_checkpoint:
            # After the results line: a driver that dies in between resumes from an older
            # checkpoint and replays (de-duplicated), never skips, this round.
            # The lowest rank's folder is the checkpoint; other ranks' are merged into it.
            given = [(i, c) for i, c in enumerate(round_.checkpoints) if isinstance(c, WrittenCheckpoint)]
            (first, written), others = given[0], given[1:]
            metrics = round_.full_result(first)
            manager.register(Path(written.path), metrics, iteration, metrics=metrics,
                             shards=[Path(c.path) for _, c in others], name=_first(given, "name"),
                             validation=_first(given, "validation", False))
            self._after_checkpoint()
        if detailed_metrics_enabled():  # persisted above in full; handed on only when asked for
            round_.add_details()
        self._hand_out(results)
        return results

    def file_under(self) -> int:
        """The report a checkpoint saved now goes with (what Tune files it under, what a restart
        from it counts on from). ``sgd.report(metrics, checkpoint=...)`` says it; a separate
        ``save_checkpoint`` goes with the report before it, or, in a run whose first checkpoint
        came before its first report (save, then report), with the report after it. That one
        is restored from only once its report is delivered."""
        if self._save_then_report is None:
            self._save_then_report = True
        return self.position + (1 if self._save_then_report else 0)

    def commit_pending(self, final: bool = False) -> None:
        """Commit the asynchronously written checkpoints whose metadata file appeared, oldest
        first (a newer one waits for an older one). ``final``: the workers have finished, so
        every write that went well is complete; one that is not was abandoned. ``final`` also
        waits for the run's validations (:mod:`sgd.storage.validations`) to end."""
        while self._pending:
            state, iteration = self._pending[0]
            if not (Path(state.path) / METADATA_FILE).is_file():
                if not final:
                    return
                logger.warning("the asynchronous checkpoint %s was not completed by the workers; not committed",
                               state.path)
                self._pending.pop(0)
                continue
            self._pending.pop(0)
            self._manager.register(Path(state.path), state.score_values, iteration)
            self._after_checkpoint()
        if final and self._manager.validations is not None:
            self._manager.validations.finish()


def _first(given: List[Tuple[int, WrittenCheckpoint]], attribute: str, default: Any = None) -> Any:
    """A report option of the lowest rank that set it (``checkpoint_dir_name``, ``validation``):
    every rank that passes a checkpoint may say it, the one committed goes by the first."""
    for _, c in given:
        value = getattr(c, attribute, default)
        if value is not None and value is not False:
            return value
    return default
