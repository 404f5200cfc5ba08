"""``sgd_torch.huggingface.transformers``: Ray Train 2.60's ``ray.train.huggingface.transformers``.

Its two names, with Ray's meaning, for a ``transformers.Trainer`` built inside a
:class:`sgd_torch.TorchTrainer` loop::

    from sgd_torch.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    def train_loop_per_worker(config):
        shard = sgd.get_dataset_shard("train")
        trainer = transformers.Trainer(..., train_dataset=shard.iter_torch_batches(batch_size=8))
        trainer.add_callback(RayTrainReportCallback())
        trainer = prepare_trainer(trainer)
        trainer.train()

Importing this module needs neither ``accelerate`` nor ``transformers`` (Ray's imports without
them too); using its names needs ``transformers`` (and a ``transformers.Trainer`` needs
``accelerate``), with an ``ImportError`` naming the install line otherwise.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Dict, Iterator, Optional

import sgd
from sgd_torch.huggingface._deps import INSTALL_HINT

__all__ = ["RayTrainReportCallback", "prepare_trainer"]

_IMPORT_ERROR: Optional[ImportError] = None
try:
    from transformers import TrainerCallback
except ImportError as exc:  # transformers missing, or broken: the names say so when used
    _IMPORT_ERROR = exc
    TrainerCallback = object  # type: ignore[misc,assignment]


def _require_transformers() -> None:
    if _IMPORT_ERROR is not None:
        raise ImportError(f"sgd_torch.huggingface.transformers needs transformers ({_IMPORT_ERROR}): "
                          f"{INSTALL_HINT}") from _IMPORT_ERROR


class RayTrainReportCallback(TrainerCallback):  # type: ignore[misc,valid-type]
    """Ray Train's ``transformers.TrainerCallback``: every time the Trainer saves a checkpoint
    (``on_save``), one :func:`sgd.report` with the latest value of every key logged so far
    (``state.log_history`` merged, so ``eval_loss`` and ``loss`` are there when they were
    logged) and the newest ``checkpoint-N`` folder of ``args.output_dir``.

    The reported checkpoint holds HF's folder under :attr:`CHECKPOINT_NAME`, as Ray's does::

        checkpoint_00000N/     the sgd checkpoint
        └─ checkpoint/         HF's checkpoint (model, optimizer, trainer_state.json, rng states)

    so ``os.path.join(result.checkpoint.path, "checkpoint")`` goes to ``from_pretrained`` or to
    ``trainer.train(resume_from_checkpoint=...)``. Nothing is reported between saves: set the
    save, evaluation and logging steps so the metric you monitor is fresh at each save (as in
    Ray). Every rank must have the callback. (sgd's own :class:`~sgd_torch.huggingface.SgdReportCallback`
    also reports every logging step.)
    """

    CHECKPOINT_NAME = "checkpoint"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _require_transformers()
        super().__init__(*args, **kwargs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After HF saved a checkpoint: report the merged logs with the newest checkpoint folder."""
        from transformers.trainer_utils import get_last_checkpoint

        metrics: Dict[str, Any] = {}
        for log in state.log_history:
            metrics.update(log)
        source = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
        staging = tempfile.mkdtemp(prefix=f"sgd-hf-report-{args.process_index}-")
        try:
            sent = 0
            if source is not None:
                # sgd's own HF callback stages the same files (it imports transformers, so here late)
                from sgd_torch.huggingface.callback import _stage_checkpoint

                sent = _stage_checkpoint(source, args.process_index, os.path.join(staging, self.CHECKPOINT_NAME))
            sgd.report(metrics, checkpoint=sgd.Checkpoint.from_directory(staging) if sent else None)
        finally:  # sgd has taken the files when report returns
            shutil.rmtree(staging, ignore_errors=True)


class _BatchesDataset:
    """A torch ``IterableDataset`` over an iterable of ready batches (Ray Data's
    ``iter_torch_batches()``): each pass iterates it once."""

    def __init__(self, batches: Any):
        self.batches = batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)


def _first(items: Any) -> Any:
    return items[0]


#: What a dataset shard's ``iter_torch_batches()`` (any ``iter_*``) returns: Ray Data's iterable, or
#: sgd's (``sgd.get_dataset_shard`` wraps Ray's shard), each iterable again for every epoch.
_RAY_DATA_ITERABLES = {("ray.data", "_IterableFromIterator"), ("sgd.data", "_Passes")}


def _is_ray_batches(dataset: Any) -> bool:
    """Whether ``dataset`` is what a Ray Data shard's ``iter_torch_batches()`` returns: batches
    already made."""
    kind = type(dataset)
    return any(kind.__module__.startswith(module) and kind.__name__ == name for module, name in _RAY_DATA_ITERABLES)


def _batches_loader(batches: Any) -> Any:
    import torch.utils.data

    dataset = type("RayBatchesDataset", (_BatchesDataset, torch.utils.data.IterableDataset), {})(batches)
    return torch.utils.data.DataLoader(dataset, batch_size=1, collate_fn=_first)


def prepare_trainer(trainer: Any) -> Any:
    """Prepare a ``transformers.Trainer`` built in a training function for Ray Data; returns it.

    As Ray's: its train and evaluation dataloaders read a Ray Data iterable of batches
    (``sgd.get_dataset_shard(name).iter_torch_batches(...)``) as it is, batch by batch, not
    sharded again over the processes (the shard holds this worker's rows already); any other
    dataset is left to the Trainer. sgd's :class:`~sgd_torch.huggingface.RayShardDataset`
    (rows of a shard) is read the same way, batched by the Trainer's collator. It adds no
    report callback: add :class:`RayTrainReportCallback`. (The Trainer needs ``max_steps``
    for an iterable without a length, as for any.)

    :raises TypeError: ``trainer`` is not a ``transformers.Trainer``.
    """
    _require_transformers()
    from transformers import Trainer

    from sgd_torch.huggingface.data import RayShardDataset, _shard_loader

    if not isinstance(trainer, Trainer):
        raise TypeError(f"prepare_trainer takes a transformers.Trainer, got {type(trainer).__name__}")
    base = type(trainer)
    if getattr(base, "_sgd_ray_prepared", False):
        return trainer

    def get_train_dataloader(self: Any) -> Any:
        if _is_ray_batches(self.train_dataset):
            return _batches_loader(self.train_dataset)
        if isinstance(self.train_dataset, RayShardDataset):
            batch_size = getattr(self, "_train_batch_size", None) or self.args.train_batch_size
            return _shard_loader(self, self.train_dataset, batch_size, "training")
        return base.get_train_dataloader(self)

    def get_eval_dataloader(self: Any, eval_dataset: Any = None) -> Any:
        resolved = eval_dataset
        if isinstance(eval_dataset, str) and isinstance(self.eval_dataset, dict):
            resolved = self.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            resolved = self.eval_dataset
        if _is_ray_batches(resolved):
            return _batches_loader(resolved)
        if isinstance(resolved, RayShardDataset):
            return _shard_loader(self, resolved, self.args.eval_batch_size, "evaluation")
        return base.get_eval_dataloader(self, eval_dataset)

    # A subclass of the Trainer's own class, as Ray makes: its overrides still run for other data.
    trainer.__class__ = type(f"Ray{base.__name__}", (base,), {
        "get_train_dataloader": get_train_dataloader, "get_eval_dataloader": get_eval_dataloader,
        "_sgd_ray_prepared": True, "__module__": base.__module__})
    return trainer
