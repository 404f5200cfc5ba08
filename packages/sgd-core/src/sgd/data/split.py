"""How each dataset passed to a run is split among the workers: divided into parts, split by
Ray Data's ``streaming_split``, materialised and split, or given whole (:func:`shard_datasets`),
and whether the split outlives a restart of the group."""

from __future__ import annotations

import logging
import secrets
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sgd.data.config import DatasetConfig
from sgd.data.shard import DatasetShard, ShuffledEachEpoch

logger = logging.getLogger("sgd")


def is_ray_dataset(ds: Any) -> bool:
    return hasattr(ds, "streaming_split") and hasattr(ds, "iter_batches")


def _mode(ds: Any, config: DatasetConfig, quiet: bool = False) -> str:
    """How a dataset reaches the workers: "whole", "materialised", "parts" or "coordinated"."""
    if not is_ray_dataset(ds) or config.split is False:
        return "whole"
    if not config.streaming:
        return "materialised"
    if config.split == "coordinated":
        return "coordinated"
    from sgd._common.data_parts import divisible

    why = divisible(ds)
    if why is None:
        return "parts"
    if config.split == "parts":
        raise ValueError(
            f"DatasetConfig(split='parts') cannot divide this dataset: {why}. Pass "
            "split='coordinated' (Ray Data's streaming_split), or split=True, which falls back to it."
        )
    if not quiet:
        logger.warning("the dataset is split by Ray Data's streaming_split, not divided among the workers: %s", why)
    return "coordinated"


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
            name: _split_one(ds, n, configs.get(name, default).resolved(), locality_hints, actors)
            for name, ds in dataset.items()
        }
        return [{name: shards[i] for name, shards in per_name.items()} for i in range(n)]
    config = configs.get("default", DatasetConfig()).resolved()
    return _split_one(dataset, n, config, locality_hints, actors)


def _split_one(ds: Any, n: int, config: DatasetConfig, hints: Optional[Sequence[str]],
               actors: Optional[Sequence[Any]] = None) -> List[Any]:
    if config.per_epoch_preprocessor is not None and is_ray_dataset(ds):
        ds = config.per_epoch_preprocessor.transform(ds)  # lazy: executed again every epoch
    mode = _mode(ds, config)
    if mode == "whole":
        if config.shuffle and is_ray_dataset(ds):
            ds = ds.random_shuffle(seed=config.seed)
        return [ds] * n
    if mode == "parts":
        shards = _divide(ds, n, config)
        if shards is not None:
            return shards
        mode = "coordinated"
    if config.shuffle:
        ds = ds.random_shuffle(seed=config.seed)
    if mode == "coordinated":
        hint_list = list(hints) if hints is not None and len(hints) == n else None
        return list(ds.streaming_split(n, equal=config.equal, locality_hints=hint_list))
    # materialised: one execution, then blocks (equal) or rows (no row left out) per worker
    ds = ds.materialize()
    if config.equal:
        actor_list = list(actors) if actors is not None and len(actors) == n else None
        shards = ds.split(n, equal=True, locality_hints=actor_list)
    else:
        total = ds.count()
        shards = ds.split_at_indices([r * total // n for r in range(1, n)])
    if config.shuffle:
        return [ShuffledEachEpoch(shard, config.seed) for shard in shards]
    return list(shards)


def _divide(ds: Any, n: int, config: DatasetConfig) -> Optional[List[DatasetShard]]:
    import ray

    from sgd._common.data_parts import find_units

    units = find_units(ds, min_units=max(4 * n, 8))
    if config.equal and not units.sliceable:
        if config.split == "parts":
            raise ValueError(
                "DatasetConfig(split='parts', equal=True) needs the row count of every unit of the "
                f"dataset's source, and this {units.kind} source does not give them. Pass equal=False "
                "(no row left out; parts differ by about one unit) or split='coordinated'."
            )
        logger.warning("equal=True: the source's row counts are unknown, so the dataset is split by Ray "
                       "Data's streaming_split")
        return None
    ref = ray.put(units)
    seed = None
    if config.shuffle:
        seed = config.seed if config.seed is not None else secrets.randbits(31)
    # The CPUs free beside the workers, shared among their executors.
    share = max(1.0, float(ray.available_resources().get("CPU", 0)) / n)
    return [DatasetShard(ds, ref, rank, n, config.equal, seed, share) for rank in range(n)]


def _named(dataset: Any, configs: Optional[Dict[str, DatasetConfig]]) -> List[Tuple[Any, DatasetConfig]]:
    configs = dict(configs or {})
    default = configs.get("default", DatasetConfig())
    named = dataset.items() if isinstance(dataset, dict) else [("default", dataset)]
    return [(ds, configs.get(name, default).resolved()) for name, ds in named]


def shards_survive_restart(dataset: Any, configs: Optional[Dict[str, DatasetConfig]] = None,
                           shards: Optional[List[Any]] = None) -> bool:
    """Whether the shards made for a group can serve a restarted group of the same size: not
    for a coordinated split (Ray Data's coordinator cannot forget a dead consumer).

    :param shards: what :func:`shard_datasets` made, when at hand: then its items tell (a
        divided dataset may have fallen back to the coordinated split).
    """
    if shards is not None:
        from ray.data import DataIterator

        items = [v for s in shards for v in (s.values() if isinstance(s, dict) else [s])]
        return not any(isinstance(item, DataIterator) for item in items)
    return not any(_mode(ds, config, quiet=True) == "coordinated" for ds, config in _named(dataset, configs))
