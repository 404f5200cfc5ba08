"""What a worker gets of a divided dataset: :class:`DatasetShard` (its part of each epoch, a
position that goes into a checkpoint), and a materialised part shuffled anew each epoch."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from sgd._common.public import public_module


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


@public_module("sgd.data")
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


class ShuffledEachEpoch:
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
