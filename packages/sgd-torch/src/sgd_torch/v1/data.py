"""Data handling of the v1 operator: per-worker loaders, epochs, batches on the device."""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from typing import Any, Iterable, Iterator, List, Optional, Sequence

import torch
from torch.utils.data import Dataset, DistributedSampler

from sgd_torch.loaders import to_device


def as_list(value: Any) -> List[Any]:
    """``value`` as a list: ``None`` → ``[]``, a list/tuple → a list, one object → ``[value]``."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def one_or_list(values: Sequence[Any]) -> Any:
    """v1's convention: the object itself when there is one, else the list."""
    return values[0] if len(values) == 1 else list(values)


def batch_size(value: Any) -> int:
    """How many samples ``value`` (a tensor's first dimension, or ``len``) holds."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() > 0 else 1
    try:
        return len(value)
    except TypeError:
        return 1


class EpochLoader:
    """A registered data loader. ``set_epoch(n)`` reaches its ``DistributedSampler``, so
    each epoch shuffles differently and a worker rebuilt after a failure shuffles the
    epoch it resumes exactly as the lost worker would have. Other attributes are the
    loader's own (``dataset``, ``batch_size``, ``sampler``...)."""

    def __init__(self, loader: Iterable[Any]):
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        sampler = getattr(self.loader, "sampler", None)
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


class Batches:
    """One pass over a loader: batches moved to ``device``, at most ``num_steps`` of them.
    Iterable once; ``len()`` and the loader's attributes work as on the loader."""

    def __init__(self, loader: EpochLoader, device: torch.device, num_steps: Optional[int]):
        self.loader = loader
        self._device = device
        self._num_steps = num_steps

    def __iter__(self) -> Iterator[Any]:
        it: Iterator[Any] = iter(self.loader)
        if self._num_steps is not None:
            it = itertools.islice(it, self._num_steps)
        for batch in it:
            yield to_device(batch, self._device)

    def __len__(self) -> int:
        n = len(self.loader)
        return min(n, self._num_steps) if self._num_steps is not None else n

    def __getattr__(self, name: str) -> Any:
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


@contextlib.contextmanager
def node_lock(enabled: bool) -> Iterator[None]:
    """One data creator at a time on a node (v1's ``serialize_data_creation``), so that
    several workers do not download the same dataset into the same folder at once."""
    if not enabled:
        yield
        return
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    path = os.path.join(tempfile.gettempdir(), ".sgd_torch_v1_data.lock")
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def split_loaders(loaders: Any) -> Any:
    """``data_creator``'s result as ``(train, validation or None)``."""
    if isinstance(loaders, (list, tuple)) and not isinstance(loaders, Dataset):
        if len(loaders) in (1, 2):
            return loaders[0], (loaders[1] if len(loaders) == 2 else None)
        raise ValueError(
            f"data_creator returned {len(loaders)} objects; return a train loader or (train_loader, validation_loader)"
        )
    return loaders, None
