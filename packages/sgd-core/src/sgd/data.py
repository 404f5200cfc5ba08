"""Datasets for training runs: how each dataset passed to ``Trainer.run`` reaches the workers.

A Ray Dataset is **divided** by default: its plan's source (the read tasks of a datasource,
the files of a file read, the blocks of in-memory data) is dealt out among the workers, and
each worker executes its own part (the source cut to its units, the maps above unchanged)
with its own Ray Data executor, streaming, with no actor between the workers and the blocks.
Every epoch (each pass a worker makes over its shard) covers the dataset exactly once across
the workers. The parts are a function of the dataset, the number of workers, the rank and
the epoch only, so a restarted group gets the same parts, and a shard's position
(:meth:`DatasetShard.state_dict`) can be saved in a checkpoint and resumed.

A plan that cannot be divided (a shuffle, sort or other operation over the whole dataset
after its source) goes through Ray Data's ``streaming_split`` (``split="coordinated"``), as
Ray Train does. ``DatasetConfig(streaming=False)`` materialises the dataset once in Ray's
object store and splits its blocks. Anything that is not a Ray Dataset (a list, a torch
``Dataset``...) is given whole to every worker.
"""

from __future__ import annotations

import logging
import secrets
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

logger = logging.getLogger("sgd")

_SPLITS = (True, False, "parts", "coordinated")


@dataclass(frozen=True)
class DatasetConfig:
    """How one dataset reaches the workers.

    :param split: ``True`` (the default): each worker gets its own part, **divided** when the
        dataset's plan allows it (a source followed by maps), else through Ray Data's
        ``streaming_split`` (a warning says why). ``"parts"``: divided, or ``ValueError`` when
        the plan cannot be. ``"coordinated"``: always ``streaming_split`` (one coordinator
        actor hands the blocks out; all workers iterate together; it can balance any plan).
        ``False``: the whole dataset to every worker (a validation set each worker
        evaluates in full).
    :param shuffle: a new order every epoch. Divided: the source's units (read tasks, files,
        blocks) are dealt to the workers in a new random order each epoch and the rows of
        every block are permuted (a shuffle at the granularity of the units, no pass over
        the data). Coordinated (and ``split=False``): a full ``random_shuffle`` re-executed
        per epoch. ``streaming=False``: shuffled once globally, then within each shard
        every epoch.
    :param seed: with ``shuffle``, the seed. Divided: epoch ``e``'s order is drawn from
        ``(seed, e)``, so a run is repeatable and epochs still differ. Coordinated: every
        epoch has the same order (Ray Data's ``random_shuffle(seed=)``).
    :param streaming: ``True`` (the default) reads the dataset again every epoch, holding
        nothing in memory beyond Ray Data's window. ``False`` materialises it once (Ray's
        object store, spilling to disk) and splits its blocks.
    :param equal: every worker gets the same number of rows, and up to ``num_workers - 1``
        rows (the last ones of the epoch's order) are left out of each epoch. The default,
        ``False``, leaves no row out: parts differ by at most one row where the source's
        row counts are known (read tasks and in-memory blocks are cut at a row), by about
        one unit (a file) where they are not. Divided, ``equal`` counts the rows the
        source yields: a ``filter`` or a ``map_batches`` that changes the row count makes
        the parts differ again; ``split="coordinated"`` equalises what comes out instead.

    Ray AIR's ``DatasetConfig`` fields (``from ray.air.config import DatasetConfig`` code runs
    with ``from sgd import DatasetConfig``); every field left ``None`` takes the trainer's
    default for that dataset, as AIR merged a user's config into the trainer's:

    :param fit: the AIR trainer's ``preprocessor`` is fitted on this dataset (default: only
        on ``"train"``; at most one dataset may say ``True``).
    :param transform: the preprocessor transforms this dataset (default ``True``).
    :param required: ``fit()`` fails with ``ValueError`` when this dataset is not passed.
    :param global_shuffle: AIR's name of ``shuffle``.
    :param randomize_block_order: ``True`` is ``shuffle`` (sgd's shuffle deals the source's
        blocks in a new order every epoch); ``False`` or ``None``: no change.
    :param max_object_store_memory_fraction: ``-1`` materialises the dataset once
        (``streaming=False``), AIR's bulk ingest; any other value streams.
    :param per_epoch_preprocessor: a fitted or stateless preprocessor applied to this dataset's
        rows every epoch (lazily, so random transforms differ per epoch).

    ``split`` left ``None`` is ``True`` in ``Trainer.run``; AIR trainers split ``"train"`` and
    give every other dataset whole to every worker.
    """

    split: Union[bool, str, None] = None
    shuffle: bool = False
    seed: Optional[int] = None
    streaming: bool = True
    equal: bool = False
    fit: Optional[bool] = None
    required: Optional[bool] = None
    transform: Optional[bool] = None
    global_shuffle: Optional[bool] = None
    randomize_block_order: Optional[bool] = None
    max_object_store_memory_fraction: Optional[float] = None
    per_epoch_preprocessor: Any = None

    def resolved(self, split: Union[bool, str] = True) -> DatasetConfig:
        """This config with AIR's fields turned into sgd's and ``split=None`` set to ``split``."""
        import dataclasses

        shuffle = self.shuffle or bool(self.global_shuffle) or bool(self.randomize_block_order)
        fraction = self.max_object_store_memory_fraction
        streaming = self.streaming and not (fraction is not None and fraction < 0)
        return dataclasses.replace(self, split=split if self.split is None else self.split, shuffle=shuffle,
                                   streaming=streaming)

    def merged(self, base: DatasetConfig) -> DatasetConfig:
        """``base`` with the fields this config sets (AIR's ``DatasetConfig.merge``): a field
        left at its default (``None``, or sgd's defaults) keeps ``base``'s."""
        import dataclasses

        defaults = DatasetConfig()
        changes = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if getattr(self, f.name) is not getattr(defaults, f.name)
                   and getattr(self, f.name) != getattr(defaults, f.name)}
        return dataclasses.replace(base, **changes)

    def __post_init__(self) -> None:
        if self.split is not None and not any(
                self.split is s or (isinstance(s, str) and self.split == s) for s in _SPLITS):
            raise ValueError(
                f"DatasetConfig(split={self.split!r}) is not one of True (divide the dataset, or "
                "coordinate when it cannot be divided), 'parts', 'coordinated' or False (the whole "
                "dataset to every worker)"
            )
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"DatasetConfig(seed={self.seed!r}) must be an int or None")


def _is_ray_dataset(ds: Any) -> bool:
    return hasattr(ds, "streaming_split") and hasattr(ds, "iter_batches")


def _mode(ds: Any, config: DatasetConfig, quiet: bool = False) -> str:
    """How a dataset reaches the workers: "whole", "materialised", "parts" or "coordinated"."""
    if not _is_ray_dataset(ds) or config.split is False:
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
    if config.per_epoch_preprocessor is not None and _is_ray_dataset(ds):
        ds = config.per_epoch_preprocessor.transform(ds)  # lazy: executed again every epoch
    mode = _mode(ds, config)
    if mode == "whole":
        if config.shuffle and _is_ray_dataset(ds):
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
        return [_ShuffledEachEpoch(shard, config.seed) for shard in shards]
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


def _batch_len(batch: Any) -> Optional[int]:
    if isinstance(batch, dict):
        first = next(iter(batch.values()), None)
        return len(first) if first is not None else 0
    rows = getattr(batch, "num_rows", None)
    if isinstance(rows, int):
        return rows
    try:
        return len(batch)
    except TypeError:
        return None


def _batch_tail(batch: Any, start: int) -> Any:
    if isinstance(batch, dict):
        return {k: v[start:] for k, v in batch.items()}
    if hasattr(batch, "iloc"):
        return batch.iloc[start:]
    if hasattr(batch, "num_rows") and hasattr(batch, "slice"):
        return batch.slice(start)
    return batch[start:]


class DatasetShard:
    """One worker's part of a divided Ray Dataset: what ``sgd.get_dataset_shard()`` returns
    for it. Iterate it like a Ray Dataset; each ``iter_*`` call (and ``to_tf``) is one epoch.

    The part of epoch ``e`` is a function of the dataset, the number of workers, this rank
    and ``e`` (and the seed, with ``shuffle``): a restarted worker gets the same part. Its
    position (:meth:`state_dict`) goes into a checkpoint; :meth:`load_state_dict` resumes an
    epoch after the rows already taken (rows are re-read up to there and skipped).
    Any other attribute is the current epoch's part as a Ray Dataset (``shard.count()``,
    ``shard.schema()``...), and :meth:`dataset` returns it.
    """

    def __init__(self, dataset: Any, units_ref: Any, rank: int, num_parts: int, equal: bool,
                 seed: Optional[int], cpu_share: Optional[float] = None):
        self._dataset = dataset
        self._units_ref = units_ref
        self._units: Any = None
        self.rank = rank
        self.num_parts = num_parts
        self._equal = equal
        self._seed = seed
        self._cpu_share = cpu_share
        self._next_epoch = 0
        self._skip = 0
        self._current: Optional[List[Optional[int]]] = None  # [epoch, rows taken] while a pass runs

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_units"] = None  # fetched again where it lands
        return state

    def _get_units(self) -> Any:
        if self._units is None:
            import ray

            self._units = ray.get(self._units_ref)
        return self._units

    def part(self, epoch: Optional[int] = None) -> List[Tuple[int, Optional[int], Optional[int]]]:
        """This worker's units in ``epoch`` (default: the next): ``(unit, first row, end row)``,
        rows ``None`` for a whole unit. Units are the source's read tasks, files or blocks."""
        from sgd._common.data_parts import deal

        units = self._get_units()
        order = list(range(len(units.items)))
        epoch = self._next_epoch if epoch is None else epoch
        if self._seed is not None:
            import numpy as np

            order = [int(i) for i in np.random.default_rng([self._seed, epoch]).permutation(len(order))]
        return deal(units, order, self.num_parts, self.rank, self._equal)

    def dataset(self, epoch: Optional[int] = None) -> Any:
        """The Ray Dataset this worker reads in ``epoch`` (default: the next)."""
        from sgd._common.data_parts import build_part

        epoch = self._next_epoch if epoch is None else epoch
        seed = (self._seed, epoch) if self._seed is not None else None
        return build_part(self._dataset, self._get_units(), self.part(epoch), seed, self._cpu_share)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter_*`` call reads (counted from 0)."""
        return self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next, from its start (as ``DistributedSampler.set_epoch``)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"set_epoch takes an int >= 0, got {epoch!r}")
        self._next_epoch, self._skip, self._current = epoch, 0, None

    def state_dict(self) -> Dict[str, Any]:
        """Where this worker is: ``{"epoch", "rows", "parts"}``. Mid-pass, ``rows`` is how many
        rows the pass has handed out (``None`` when batches of unknown length hid it); after
        a pass, the next epoch at row 0. Save it with a checkpoint."""
        if self._current is not None:
            return {"epoch": self._current[0], "rows": self._current[1], "parts": self.num_parts}
        return {"epoch": self._next_epoch, "rows": 0, "parts": self.num_parts}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position: the next pass is that epoch, after
        its first ``rows`` rows. A state saved with another number of workers (an elastic
        group that changed size) resumes at the start of its epoch: the parts differ."""
        if not isinstance(state, dict) or not isinstance(state.get("epoch"), int):
            raise ValueError(f"load_state_dict takes what DatasetShard.state_dict() returned, got {state!r}")
        rows = state.get("rows") or 0
        if state.get("parts") != self.num_parts and rows:
            warnings.warn(
                f"the dataset position was saved with {state.get('parts')} workers and this group has "
                f"{self.num_parts}: epoch {state['epoch']} restarts from its beginning", RuntimeWarning,
                stacklevel=2)
            rows = 0
        self._next_epoch, self._skip, self._current = state["epoch"], int(rows), None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet while unpickling: no recursion
            raise AttributeError(name)
        if name.startswith("iter_") or name == "to_tf":
            return self._pass(name)
        return getattr(self.dataset(), name)

    def _pass(self, name: str) -> Callable[..., Any]:
        def passes(*args: Any, **kwargs: Any) -> Any:
            if name == "to_tf":  # a tf.data.Dataset of this epoch's part; its position is not counted
                ds = self.dataset(self._next_epoch)
                self._next_epoch, self._skip, self._current = self._next_epoch + 1, 0, None
                return ds.to_tf(*args, **kwargs)
            return _Passes(self, name, args, kwargs)
        return passes

    def _start(self, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Iterator[Any]:
        epoch, skip = self._next_epoch, self._skip
        ds = self.dataset(epoch)
        self._next_epoch, self._skip = epoch + 1, 0
        state: List[Optional[int]] = [epoch, skip]
        self._current = state
        return self._count(getattr(ds, name)(*args, **kwargs), state, skip, rows=name == "iter_rows")

    def _count(self, items: Any, state: List[Optional[int]], skip: int, rows: bool) -> Iterator[Any]:
        for item in items:
            size = 1 if rows else _batch_len(item)
            if skip:
                if size is None:
                    raise ValueError("cannot resume mid-epoch: the length of a batch is unknown (a collate_fn?)")
                if size <= skip:
                    skip -= size
                    continue
                item, size, skip = _batch_tail(item, skip), size - skip, 0
            if state[1] is not None:
                state[1] = None if size is None else state[1] + size
            yield item
        if self._current is state:
            self._current = None

    def __repr__(self) -> str:
        return f"DatasetShard(rank={self.rank} of {self.num_parts}, next epoch {self._next_epoch})"


class _Passes:
    """What a shard's ``iter_*`` returns: iterable again and again (as Ray Data's), each
    iteration one epoch of the shard (Lightning iterates one such object every epoch)."""

    def __init__(self, shard: DatasetShard, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]):
        self._shard, self._name, self._args, self._kwargs = shard, name, args, kwargs

    def __iter__(self) -> Iterator[Any]:
        return self._shard._start(self._name, self._args, self._kwargs)


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


def data_cpu_shortfall(dataset: Any, patience_s: float = 10.0) -> Optional[str]:
    """Why a run with ``dataset`` would wait forever for CPUs, or ``None``.

    Ray Data reads and transforms in Ray tasks that need a CPU each; with the workers
    started, at least one CPU of the cluster must be free (or become free within
    ``patience_s``: other work may be finishing), else iterating would wait with no end.
    """
    import time

    import ray

    items = dataset.values() if isinstance(dataset, dict) else [dataset]
    if not any(_is_ray_dataset(ds) and _needs_tasks(ds) for ds in items):
        return None
    deadline = time.monotonic() + patience_s
    while True:
        free = float(ray.available_resources().get("CPU", 0))
        if free >= 1:
            return None
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)  # polling the cluster's state with a deadline, not waiting for an event
    total = float(ray.cluster_resources().get("CPU", 0))
    return (
        f"no CPU of the cluster's {total:g} is free ({free:g}) with the workers started, and Ray Data needs "
        "at least one to read and transform the dataset: iterating it would wait forever. Leave a CPU "
        "free: fewer workers (num_workers), fewer CPUs per worker (resources_per_worker={'CPU': ...}), or "
        "a bigger cluster (ray.init(num_cpus=...), more nodes)."
    )


def _needs_tasks(ds: Any) -> bool:
    try:
        op = ds._logical_plan.dag
        return bool(op.input_dependencies) or op.output_data() is None
    except AttributeError:
        return True


def cross_validation_folds(dataset: Any, k: int, *, shuffle: bool = True, seed: Optional[int] = 0) -> List[
        Tuple[Any, Any]]:
    """Split a Ray Dataset into ``k`` folds: ``[(train, validation), ...]``, one pair per fold.

    Each validation set is one fold; its training set is the union of the other ``k - 1``.
    Folds differ by at most one row, and every row is in exactly one validation set (the
    dataset is materialised once, shuffled first with ``shuffle``). Pass each pair to a run,
    for example ``trainer.run(train_func, dataset={"train": train, "val": val},
    dataset_config={"val": sgd.DatasetConfig(split=False)})``.

    :raises ValueError: ``k < 2``, or more folds than rows.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise ValueError(f"k must be an int >= 2, got {k!r}")
    if not _is_ray_dataset(dataset):
        raise TypeError(f"cross_validation_folds takes a Ray Dataset, got {type(dataset).__name__}")
    if shuffle:
        dataset = dataset.random_shuffle(seed=seed)
    dataset = dataset.materialize()
    total = dataset.count()
    if total < k:
        raise ValueError(f"cross_validation_folds: {k} folds need at least {k} rows; the dataset has {total}")
    folds = dataset.split_at_indices([i * total // k for i in range(1, k)])
    pairs = []
    for i, val in enumerate(folds):
        others = [f for j, f in enumerate(folds) if j != i]
        train = others[0].union(*others[1:]) if len(others) > 1 else others[0]
        pairs.append((train, val))
    return pairs
