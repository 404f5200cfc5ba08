"""``SgdReportCallback``: a ``transformers.Trainer``'s logs and checkpoints as ``sgd.report`` calls.

Every rank must call ``sgd.report`` the same number of times, so the callback reports only
at events every rank goes through in step: HF's logging (``on_log``: the loss is averaged
over all processes first, so every rank logs the same values at the same steps),
checkpointing (``on_save``) and the end of training (``on_train_end``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from typing import Any, Dict, Optional

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

import sgd

logger = logging.getLogger("sgd.huggingface")

__all__ = ["SgdReportCallback"]

_RNG_FILE = re.compile(r"rng_state_(\d+)\.pth")


def _plain(value: Any) -> Any:
    """A JSON-friendly metric value (tensors and numpy scalars as Python numbers)."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        try:
            return value.item()
        except (TypeError, ValueError, RuntimeError):
            return value
    return value


def _wanted(rank: int, relative: str) -> bool:
    """Whether ``rank`` sends this file of its checkpoint folder.

    Rank 0 sends the checkpoint, except the other ranks' RNG states: each rank sends its
    own, which may not be written yet when rank 0 reports (or live on another node).
    """
    match = _RNG_FILE.fullmatch(relative)
    if rank == 0:
        return match is None or int(match.group(1)) == 0
    return match is not None and int(match.group(1)) == rank


def _stage_checkpoint(source: str, rank: int, target: str) -> int:
    """Link (or copy) the files of HF's checkpoint folder ``source`` that ``rank`` sends into
    ``target``; how many. Rank 0 sends the checkpoint but the other ranks' RNG states, each
    other rank its own RNG state (it may not be written yet when rank 0 reports, or live on
    another node); sgd merges the ranks' folders into one checkpoint."""
    count = 0
    for root, _dirs, files in os.walk(source):
        for name in files:
            src = os.path.join(root, name)
            relative = os.path.relpath(src, source)
            if not _wanted(rank, relative):
                continue
            dst = os.path.join(target, relative)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:  # another filesystem, or no hard links there
                shutil.copy2(src, dst)
            count += 1
    return count


def _stage(source: str, rank: int, parent: str) -> Optional[str]:
    """A folder with the files of ``source`` this rank sends (hard links where possible);
    ``None`` if there are none."""
    staging = tempfile.mkdtemp(prefix=f".sgd-report-{rank}-", dir=parent)
    if _stage_checkpoint(source, rank, staging) == 0:
        shutil.rmtree(staging, ignore_errors=True)
        return None
    return staging


class SgdReportCallback(TrainerCallback):
    """Reports a ``transformers.Trainer``'s logs and checkpoints to sgd.

    - Logs (training loss, learning rate, evaluation metrics...) are collected and reported
      together once per logging step, with ``step`` (the global step) and ``epoch``.
    - On every HF checkpoint (``on_save``), rank 0 reports its ``<output_dir>/checkpoint-N``
      folder as an :class:`sgd.Checkpoint` (the files directly, so ``result.checkpoint`` is
      a folder ``Trainer.train(resume_from_checkpoint=...)`` and ``from_pretrained`` read),
      and every other rank adds its ``rng_state_<rank>.pth``. The metrics of that report
      are the latest value of every key logged so far (so a ``checkpoint_score_attribute``
      such as ``eval_loss`` is there).
    - At the end of training, one last report with the latest value of every key, including
      HF's training summary (``train_loss``, ``train_runtime``...): ``result.metrics``.

    Logs that arrive outside ``train()`` (a ``trainer.evaluate()`` afterwards) are reported
    at once. ``TransformersTrainer`` adds this callback itself; add it (or call
    :func:`~sgd_torch.huggingface.prepare_trainer`) when you build a Trainer inside a
    ``TorchTrainer`` loop. Every rank must have it.
    """

    def __init__(self) -> None:
        self._pending: Dict[str, Any] = {}
        self._latest: Dict[str, Any] = {}
        self._in_train = False

    # --- what is reported ---------------------------------------------------------------

    @staticmethod
    def _position(state: Any) -> Dict[str, Any]:
        position = {"step": state.global_step}
        if state.epoch is not None:
            position["epoch"] = state.epoch
        return position

    def _report_pending(self, state: Any) -> None:
        metrics = {**self._pending, **self._position(state)}
        self._pending = {}
        sgd.report(metrics)

    # --- HF events --------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._in_train = True
        self._pending = {}

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None,
               **kwargs: Any) -> None:
        values = {key: _plain(value) for key, value in (logs or {}).items()}
        self._pending.update(values)
        self._latest.update(values)
        if not self._in_train:
            self._report_pending(state)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The logs of the previous step (its training loss, an evaluation) form one report.
        if self._pending:
            self._report_pending(state)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        rank = args.process_index
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        staging = None
        if os.path.isdir(folder):
            staging = _stage(folder, rank, args.output_dir)
        elif rank == 0:
            logger.warning("HF saved checkpoint %d, but %s does not exist on rank 0; reporting without a checkpoint",
                           state.global_step, folder)
        metrics = {**self._latest, **self._position(state)}
        self._pending = {}
        try:
            sgd.report(metrics, checkpoint=sgd.Checkpoint.from_directory(staging) if staging else None)
        finally:  # the files were taken before report returned
            if staging:
                shutil.rmtree(staging, ignore_errors=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._in_train = False
        self._pending = {}
        sgd.report({**self._latest, **self._position(state)})
