"""Datasets for training runs: how each dataset passed to ``Trainer.run`` reaches the workers.

A Ray Dataset is split with ``streaming_split`` — one shard per worker, streamed to it with
locality hints for the worker's node, so data never gathers on the driver, and every epoch
(each pass a worker makes over its shard) covers the dataset exactly once across workers.
With ``DatasetConfig(streaming=False)`` it is instead materialised once in Ray's object store
and its blocks split (``Dataset.split``, as Ray SGD v2 did): no coordinator between the
workers, and the shards outlive a worker failure. Anything that is not a Ray Dataset (a
list, a torch ``Dataset``...) is given whole to every worker.
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
    :param streaming: ``True`` (the default) streams each epoch through Ray Data's
        ``streaming_split``: nothing is held in memory beyond a window, the dataset is read
        again every epoch, and a restarted worker group gets a new split. ``False``
        materialises the dataset once (Ray's object store, spilling to disk) and splits its
        blocks: epochs only read the worker's own blocks, the shards are reused after a
        failure, and with ``shuffle`` the rows are shuffled once globally before the split
        and then within each worker's shard every epoch.
    """

    split: bool = True
    shuffle: bool = False
    seed: Optional[int] = None
    streaming: bool = True


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
    actors: Optional[Sequence[Any]] = None,
) -> Optional[List[Any]]:
    """One item per worker: what ``sgd.get_dataset_shard`` returns there.

    :param dataset: a dataset, or a dict of named datasets.
    :param n: how many workers.
    :param configs: per name (``None`` key or ``"default"`` for a single dataset) options.
    :param locality_hints: the node id of each worker, in rank order.
    :param actors: the worker actors, in rank order (``Dataset.split`` places blocks by actor).
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
            name: _split_one(ds, n, configs.get(name, default), locality_hints, actors)
            for name, ds in dataset.items()
        }
        return [{name: shards[i] for name, shards in per_name.items()} for i in range(n)]
    config = configs.get("default", DatasetConfig())
    return _split_one(dataset, n, config, locality_hints, actors)


def _split_one(ds: Any, n: int, config: DatasetConfig, hints: Optional[Sequence[str]],
               actors: Optional[Sequence[Any]] = None) -> List[Any]:
    ds = _prepare(ds, config)
    if _is_ray_dataset(ds) and config.split:
        hint_list = list(hints) if hints is not None and len(hints) == n else None
        if config.streaming:
            return list(ds.streaming_split(n, equal=True, locality_hints=hint_list))
        actor_list = list(actors) if actors is not None and len(actors) == n else None
        shards = ds.split(n, equal=True, locality_hints=actor_list)
        if config.shuffle:
            return [_ShuffledEachEpoch(shard, config.seed) for shard in shards]
        return list(shards)
    return [ds] * n


class _ShuffledEachEpoch:
    """A materialised shard whose every ``iter_*`` pass (an epoch) shuffles its rows anew."""

    def __init__(self, shard: Any, seed: Optional[int]):
        self._shard = shard
        self._seed = seed

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet while unpickling: no recursion into _shard
            raise AttributeError(name)
        if name.startswith("iter_"):
            return getattr(self._shard.random_shuffle(seed=self._seed), name)
        return getattr(self._shard, name)

    def __repr__(self) -> str:
        return f"ShuffledEachEpoch({self._shard!r})"


def shards_survive_restart(dataset: Any, configs: Optional[Dict[str, DatasetConfig]] = None) -> bool:
    """Whether the shards made for a group can serve a restarted group of the same size:
    not for a streaming split (Ray Data's coordinator cannot forget a dead consumer)."""
    configs = dict(configs or {})
    default = configs.get("default", DatasetConfig())
    named = dataset.items() if isinstance(dataset, dict) else [("default", dataset)]
    return not any(_is_ray_dataset(ds) and configs.get(name, default).split and configs.get(name, default).streaming
                   for name, ds in named)


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
