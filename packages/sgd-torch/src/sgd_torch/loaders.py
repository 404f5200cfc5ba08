"""What :func:`sgd_torch.prepare_data_loader` builds: the distributed sampler and the loader
whose batches arrive on the worker's device (copied on a side CUDA stream with ``auto_transfer``)."""

from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler

__all__ = ["DeviceLoader", "to_device", "with_distributed_sampler"]


def to_device(batch: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """``batch`` with every tensor in it (in lists, tuples, dicts) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking) if batch.device != device else batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(b, device, non_blocking) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


class _EpochSampler(DistributedSampler):
    """The ``DistributedSampler`` that :func:`prepare_data_loader` adds: it remembers
    whether the training function set its epoch since the last pass."""

    user_set = False

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.user_set = True


class DeviceLoader:
    """A DataLoader whose batches arrive on the worker's device and whose
    ``DistributedSampler`` gets a new epoch on every pass.

    The epoch counts passes over this loader, starting at 0. A training function that
    resumes from a checkpoint in a new process sets it (``loader.set_epoch(epoch)``, or
    Ray Train's ``loader.sampler.set_epoch(epoch)``) so the resumed epoch shuffles as the
    lost one would have; the count goes on from there."""

    def __init__(self, loader: DataLoader, device: Optional[torch.device], auto_transfer: bool = True):
        self._loader = loader
        self._device = device
        self._auto_transfer = auto_transfer
        self._epoch = 0
        sampler = getattr(loader, "sampler", None)
        self._last_set: Optional[int] = sampler.epoch if isinstance(sampler, DistributedSampler) else None

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        if name == "_loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._loader, name)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next pass (and ``epoch + 1`` for the one after)."""
        self._epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        sampler = getattr(self._loader, "sampler", None)
        if isinstance(sampler, DistributedSampler):
            if getattr(sampler, "user_set", False) or sampler.epoch != self._last_set:
                self._epoch = sampler.epoch  # set on the sampler itself since the last pass
            DistributedSampler.set_epoch(sampler, self._epoch)
            if isinstance(sampler, _EpochSampler):
                sampler.user_set = False
            self._last_set = self._epoch
        self._epoch += 1
        if self._device is None:
            yield from self._loader
        elif self._auto_transfer and self._device.type == "cuda":
            yield from _prefetched(iter(self._loader), self._device)
        else:
            for batch in self._loader:
                yield to_device(batch, self._device, non_blocking=False)


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for value in batch.values():
            yield from _tensors(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from _tensors(value)


def _prefetched(batches: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """The batches on ``device``, each copied on a CUDA stream of its own while the previous
    one is used on the current stream (Ray Train's ``auto_transfer``)."""
    copier = torch.cuda.Stream(device=device)

    def start_copy() -> Tuple[bool, Any]:
        try:
            batch = next(batches)
        except StopIteration:
            return False, None
        with torch.cuda.stream(copier):
            return True, to_device(batch, device, non_blocking=True)

    more, upcoming = start_copy()
    while more:
        current_stream = torch.cuda.current_stream(device)
        current_stream.wait_stream(copier)  # the copy of this batch is done before it is used
        for tensor in _tensors(upcoming):
            if tensor.device.type == "cuda":
                tensor.record_stream(current_stream)  # its memory is not reused while in use there
        batch = upcoming
        more, upcoming = start_copy()  # the next batch's copy runs while this one trains
        yield batch


def with_distributed_sampler(loader: DataLoader, world_size: int, rank: int) -> DataLoader:
    """``loader`` rebuilt with a ``DistributedSampler`` (shuffling kept if it shuffled); returned
    as it is when it already has one, reads an ``IterableDataset`` or has a custom batch sampler."""
    if isinstance(loader.sampler, DistributedSampler) or isinstance(loader.dataset, IterableDataset):
        return loader
    if loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler:
        return loader  # a custom batch sampler decides itself what each worker reads
    sampler = _EpochSampler(loader.dataset, num_replicas=world_size, rank=rank,
                            shuffle=isinstance(loader.sampler, RandomSampler))
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        persistent_workers=loader.persistent_workers,
    )
