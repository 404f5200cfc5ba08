"""Datasets for training runs: how each dataset passed to ``Trainer.run`` reaches the workers.

A Ray Dataset is split with ``streaming_split`` — one shard per worker, streamed to it with
locality hints for the worker's node, so data never gathers on the driver, and every epoch
(each pass a worker makes over its shard) covers the dataset exactly once across workers.
Anything that is not a Ray Dataset (a list, a torch ``Dataset``...) is given whole to every
worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class DatasetConfig:
    """How one dataset reaches the workers.

    :param split: give each worker its own shard (``True``, the default) or the whole
        dataset to every worker (``False``: a validation set every worker evaluates in full).
    :param shuffle: shuffle the rows again for every epoch (a full ``random_shuffle``
        re-executed per pass: it moves all the data, so it costs an extra pass).
    :param seed: with ``shuffle``, a seed: then every epoch has the same order.
    """

    split: bool = True
    shuffle: bool = False
    seed: Optional[int] = None


def _is_ray_dataset(ds: Any) -> bool:
    return hasattr(ds, "streaming_split") and hasattr(ds, "iter_batches")


def _prepare(ds: Any, config: DatasetConfig) -> Any:
    if config.shuffle and _is_ray_dataset(ds):
        return ds.random_shuffle(seed=config.seed)
    return ds


def shard_datasets(
    dataset: Any,
    n: int,
    configs: Optional[Dict[str, DatasetConfig]] = None,
    locality_hints: Optional[Sequence[str]] = None,
) -> Optional[List[Any]]:
    """One item per worker: what ``sgd.get_dataset_shard`` returns there.

    :param dataset: a dataset, or a dict of named datasets.
    :param n: how many workers.
    :param configs: per name (``None`` key or ``"default"`` for a single dataset) options.
    :param locality_hints: the node id of each worker, in rank order.
    """
    if dataset is None:
        return None
    configs = dict(configs or {})
    if isinstance(dataset, dict):
        unknown = set(configs) - set(dataset) - {"default"}
        if unknown:
            raise ValueError(
                f"dataset_config names {sorted(unknown)}, which are not among the datasets passed "
                f"({sorted(dataset)})"
            )
        default = configs.get("default", DatasetConfig())
        per_name = {
            name: _split_one(ds, n, configs.get(name, default), locality_hints) for name, ds in dataset.items()
        }
        return [{name: shards[i] for name, shards in per_name.items()} for i in range(n)]
    config = configs.get("default", DatasetConfig())
    return _split_one(dataset, n, config, locality_hints)


def _split_one(ds: Any, n: int, config: DatasetConfig, hints: Optional[Sequence[str]]) -> List[Any]:
    ds = _prepare(ds, config)
    if _is_ray_dataset(ds) and config.split:
        hint_list = list(hints) if hints is not None and len(hints) == n else None
        return list(ds.streaming_split(n, equal=True, locality_hints=hint_list))
    return [ds] * n


def cross_validation_folds(dataset: Any, k: int, *, shuffle: bool = True, seed: Optional[int] = 0) -> List[
        Tuple[Any, Any]]:
    """Split a Ray Dataset into ``k`` folds: ``[(train, validation), ...]``, one pair per fold.

    Each validation set is one fold; its training set is the union of the other ``k - 1``.
    Pass each pair to a run, for example
    ``trainer.run(train_func, dataset={"train": train, "val": val},
    dataset_config={"val": sgd.DatasetConfig(split=False)})``.

    :raises ValueError: ``k < 2``.
    """
    if not isinstance(k, int) or k < 2:
        raise ValueError(f"k must be an int >= 2, got {k!r}")
    if not _is_ray_dataset(dataset):
        raise TypeError(f"cross_validation_folds takes a Ray Dataset, got {type(dataset).__name__}")
    if shuffle:
        dataset = dataset.random_shuffle(seed=seed)
    folds = dataset.split(k)
    pairs = []
    for i, val in enumerate(folds):
        others = [f for j, f in enumerate(folds) if j != i]
        train = others[0].union(*others[1:]) if len(others) > 1 else others[0]
        pairs.append((train, val))
    return pairs
