"""Ray Dataset shards as torch datasets for a ``transformers.Trainer``, and ``prepare_trainer``.

A worker's shard of a Ray Dataset (``sgd.get_dataset_shard(name)``) already holds only this
worker's rows. ``transformers.Trainer`` would shard its dataset again over the processes
(through ``accelerator.prepare``), so each worker would train on a fraction of its fraction:
:func:`prepare_trainer` makes the Trainer load a :class:`RayShardDataset` as it is.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterator, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

logger = logging.getLogger("sgd.huggingface")

__all__ = ["RayShardDataset", "prepare_trainer"]

#: Set on a Trainer that :func:`prepare_trainer` already patched.
_PREPARED = "_sgd_prepared"


def _to_tensor(value: Any) -> Any:
    """A numeric value as a tensor; anything else (a string, ``None``) as it is."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biufc":
            # Arrays from Ray's object store can be read-only views: torch wants its own copy.
            return torch.from_numpy(np.array(value, copy=True))
        return value
    if isinstance(value, np.generic):
        return torch.from_numpy(np.array(value)) if value.dtype.kind in "biufc" else value
    if isinstance(value, (bool, int, float)):
        return torch.tensor(value)
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (bool, int, float)) for v in value):
        return torch.tensor(value)
    return value


class RayShardDataset(IterableDataset):
    """A torch ``IterableDataset`` over one worker's shard of a Ray Dataset.

    Each pass iterates the shard once (``shard.iter_rows()``: one epoch of the shard) and
    yields every row as a dict whose numeric values are tensors: an array column becomes a
    tensor of its dtype, a number a 0-d tensor; strings and other values are left as they
    are (a Trainer's collator drops the columns its model does not take). Batching is left
    to the Trainer's ``data_collator`` (``default_data_collator`` stacks the tensors).

    :param shard: what ``sgd.get_dataset_shard(name)`` returns for a Ray Dataset (a
        ``DataIterator``), or a Ray Dataset: anything with ``iter_rows()``.
    """

    def __init__(self, shard: Any):
        if not callable(getattr(shard, "iter_rows", None)):
            raise TypeError(f"RayShardDataset takes a Ray Dataset shard (with iter_rows()), got {type(shard).__name__}")
        super().__init__()
        self.shard = shard

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for row in self.shard.iter_rows():
            yield {key: _to_tensor(value) for key, value in row.items()}

    def __repr__(self) -> str:
        return f"RayShardDataset({self.shard!r})"


def _shard_loader(trainer: Any, dataset: RayShardDataset, batch_size: int, description: str) -> DataLoader:
    """A DataLoader over a shard, batched by the Trainer's collator, without re-sharding."""
    args = trainer.args
    collator: Callable[..., Any] = trainer.data_collator
    remove_columns = getattr(trainer, "_get_collator_with_removed_columns", None)  # HF's own step, as for any dataset
    if remove_columns is not None:
        collator = remove_columns(collator, description)
    if args.dataloader_num_workers and not getattr(trainer, "_sgd_warned_workers", False):
        # Loader processes would each iterate the same shard: every row once per process.
        logger.warning("dataloader_num_workers=%d is ignored for a Ray Dataset shard: its rows are read in the "
                       "training process (Ray Data prefetches them in the background).", args.dataloader_num_workers)
        trainer._sgd_warned_workers = True
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collator, num_workers=0,
                      drop_last=args.dataloader_drop_last,
                      pin_memory=bool(args.dataloader_pin_memory) and torch.cuda.is_available())


def prepare_trainer(trainer: Any) -> Any:
    """Prepare a ``transformers.Trainer`` built inside an sgd worker; returns it.

    - adds a :class:`~sgd_torch.huggingface.SgdReportCallback` unless it has one, so HF's
      logs and checkpoints reach ``sgd.report``;
    - makes its train and evaluation dataloaders read a :class:`RayShardDataset` as it is,
      since the shard holds this worker's rows already (other datasets are still sharded
      by the Trainer, with sgd's process group).

    ``TransformersTrainer`` calls it for you. Calling it twice does nothing more.
    """
    from transformers import Trainer

    from sgd_torch.huggingface.callback import SgdReportCallback

    if not isinstance(trainer, Trainer):
        raise TypeError(f"prepare_trainer takes a transformers.Trainer, got {type(trainer).__name__}")
    if not any(isinstance(cb, SgdReportCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(SgdReportCallback())
    if getattr(trainer, _PREPARED, False):
        return trainer
    # Instance attributes shadow the class's methods, for this Trainer only; a subclass's
    # own override still runs for every other dataset.
    original_train = trainer.get_train_dataloader
    original_eval = trainer.get_eval_dataloader

    def get_train_dataloader() -> DataLoader:
        if isinstance(trainer.train_dataset, RayShardDataset):
            batch_size = getattr(trainer, "_train_batch_size", None) or trainer.args.train_batch_size
            return _shard_loader(trainer, trainer.train_dataset, batch_size, "training")
        return original_train()

    def get_eval_dataloader(eval_dataset: Optional[Any] = None) -> DataLoader:
        resolved = eval_dataset
        if isinstance(eval_dataset, str):
            resolved = trainer.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            resolved = trainer.eval_dataset
        if isinstance(resolved, RayShardDataset):
            return _shard_loader(trainer, resolved, trainer.args.eval_batch_size, "evaluation")
        return original_eval(eval_dataset)

    trainer.get_train_dataloader = get_train_dataloader
    trainer.get_eval_dataloader = get_eval_dataloader
    setattr(trainer, _PREPARED, True)
    return trainer
