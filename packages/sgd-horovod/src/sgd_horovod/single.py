"""Refusing Horovod collectives in code that runs on rank 0 alone.

``RayExecutor.execute_single(fn)`` runs ``fn`` on rank 0 only. A collective there
(``hvd.allreduce``, ``hvd.broadcast_parameters``, a ``DistributedOptimizer`` step,
``hvd.init()`` of a job that is not initialised...) would wait for the other
ranks, which never join: Horovod's ``horovod.ray.RayExecutor`` simply hangs
until the Gloo timeout. :func:`no_collectives` makes the call fail at once.

It works at the one place every torch collective passes through: the
attribute lookup of the enqueue function on Horovod's extension module
(``horovod.torch.mpi_ops.mpi_lib``) and of the init and process-set functions
on its ctypes library. Both are swapped for guards for the duration of the
call and restored afterwards. Polling or waiting on a handle that was
enqueued before, and ``hvd.shutdown()``, stay allowed.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

from sgd.errors import PicklableError

#: ctypes functions of ``horovod.common.basics`` that need every rank.
_COLLECTIVE_BASICS = {"horovod_init", "horovod_init_comm", "horovod_init_multi_comm",
                      "horovod_add_process_set", "horovod_remove_process_set"}
#: Functions of the torch extension that do not start a collective.
_HARMLESS_TORCH = {"horovod_torch_poll", "horovod_torch_wait_and_clear", "horovod_torch_reset"}


class CollectiveInExecuteSingleError(PicklableError, Exception):
    """A Horovod collective was started inside ``RayExecutor.execute_single``, which runs
    on rank 0 alone: it would have waited forever for the other ranks.

    Not a ``RuntimeError`` on purpose: Horovod turns every ``RuntimeError`` raised while
    it enqueues ``join`` or ``barrier`` into a ``HorovodInternalError``, which would hide it.
    """


def _operation(name: str) -> str:
    """``horovod_torch_allreduce_async_torch_FloatTensor`` → ``allreduce``."""
    name = re.sub(r"^horovod_(torch_)?", "", name)
    return re.sub(r"_async.*$", "", name)


def _refuse(name: str, world_size: int) -> CollectiveInExecuteSingleError:
    return CollectiveInExecuteSingleError(
        f"Horovod '{_operation(name)}' was called inside RayExecutor.execute_single, which runs on rank 0 "
        f"only: the other {world_size - 1} worker(s) would never join, and it would block until the Gloo "
        "timeout. Run the function on every worker with RayExecutor.execute(fn) (and keep rank 0's "
        "result), or move the collective out of the function given to execute_single."
    )


class _GuardedTorchLib:
    def __init__(self, lib: Any, world_size: int):
        self._lib = lib
        self._world_size = world_size

    def __getattr__(self, name: str) -> Any:
        if name.startswith("horovod_torch_") and name not in _HARMLESS_TORCH:
            raise _refuse(name, self._world_size)
        return getattr(self._lib, name)


class _GuardedBasicsLib:
    def __init__(self, lib: Any, world_size: int):
        self._lib = lib
        self._world_size = world_size

    def __getattr__(self, name: str) -> Any:
        if name in _COLLECTIVE_BASICS:
            # hvd.init() of a job that is already initialised returns at once on rank 0 alone.
            if not (name.startswith("horovod_init") and self._lib.horovod_is_initialized()):
                raise _refuse(name, self._world_size)
        return getattr(self._lib, name)


@contextlib.contextmanager
def no_collectives(world_size: int) -> Iterator[None]:
    """Within the block, starting a Horovod (torch) collective raises
    :class:`CollectiveInExecuteSingleError` instead of blocking. A no-op for one worker
    (every collective completes alone) or where Horovod's torch extension is not installed."""
    if world_size <= 1:
        yield
        return
    try:
        from horovod.torch import mpi_ops
    except Exception:  # no Horovod here: there is nothing that could block
        yield
        return
    torch_lib, basics = mpi_ops.mpi_lib, mpi_ops._basics
    basics_lib = basics.MPI_LIB_CTYPES
    mpi_ops.mpi_lib = _GuardedTorchLib(torch_lib, world_size)
    basics.MPI_LIB_CTYPES = _GuardedBasicsLib(basics_lib, world_size)
    try:
        yield
    finally:
        mpi_ops.mpi_lib = torch_lib
        basics.MPI_LIB_CTYPES = basics_lib
