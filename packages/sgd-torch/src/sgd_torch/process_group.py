"""What the ``"torch"`` backend runs on the workers: the process group and a run's fresh state.

Setting ``torch.distributed``'s process group up (or, when the training code creates it itself,
watching it and building it again on a reset in place), recording the sockets it opens so that
an interrupt can fail a collective blocked on a lost peer, destroying it, and giving every run
the torch state a fresh process would have. Nothing here imports torch at module level.
"""

from __future__ import annotations

import contextlib
import os
import sys
from datetime import timedelta
from typing import Any, Dict, Iterator, Optional, Tuple

from sgd.backend import on_worker_interrupt, on_worker_reset, on_worker_run, on_worker_run_end, on_worker_run_error
from sgd_torch.sockets import OpenedSockets


def _set_env(env: Dict[str, str]) -> None:
    os.environ.update(env)


def _init_process_group(backend: str, init_method: str, rank: int, world_size: int, timeout_s: int,
                        release_on_error: bool = False) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    if backend == "nccl":
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    _recording_sockets(dist.init_process_group)(
        backend=backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    on_worker_interrupt(_interrupt_process_group)
    if release_on_error:
        on_worker_run_error(_release_process_group)
    # Every run starts fresh on its own (no call from the driver), and says at its end whether
    # it left the group in place: the driver asks the workers before a run only when one did not.
    on_worker_run(_fresh_run)
    on_worker_run_end(GROUP_NOTE, _has_group)


#: The run-end note (``Workers.run_notes``) that says a worker's process group is still there.
GROUP_NOTE = "sgd_torch.process_group"


@contextlib.contextmanager
def _fresh_run() -> Iterator[None]:
    """Around every training function (in the training thread): the torch state of a fresh
    process (:func:`_reset_run_state`) and the device for Hugging Face Accelerate."""
    _prepare_run()
    yield


def _has_group() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


#: The sockets the current process group opened on this worker (what an interrupt shuts).
_GROUP_SOCKETS = OpenedSockets()


def _recording_sockets(init: Any) -> Any:
    """``init`` (``init_process_group``) that records the sockets the group opens (its store
    and its connections to the peers): what an interrupt shuts (see _interrupt_process_group)."""
    return _GROUP_SOCKETS.recording(init)


def _interrupt_process_group() -> None:
    """Make a collective blocked on a lost peer fail now (sgd.elastic's interrupt), so the
    worker comes to the reset barrier instead of waiting out ``timeout_s``.

    gloo: shut down (not close: the group still owns them) the connections the group opened;
    every pending and later operation on them fails at once, and so do the collectives of the
    peers connected to this worker. Listening sockets are left alone (gloo's listener thread
    aborts on one). Destroying the group is not enough: its connections close only once nothing
    refers to it, and a DDP model or a failed step's frames do. NCCL: abort the communicators."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "nccl":
        dist.distributed_c10d._abort_process_group()
        return
    _GROUP_SOCKETS.shut_down()


def _track_own_group(timeout_s: int) -> None:
    """On a worker whose training code creates the process group itself: record the sockets
    of the group it creates (so an interrupt can fail a blocked collective), and on a reset in
    place build it again, with the same backend, from the environment the re-formed group got."""
    import torch.distributed as dist

    global _OWN_GROUP_TIMEOUT_S
    _OWN_GROUP_TIMEOUT_S = timeout_s
    if not getattr(dist.init_process_group, "_sgd_tracked", False):
        dist.init_process_group = _recording_sockets(dist.init_process_group)
    on_worker_interrupt(_interrupt_process_group)
    on_worker_reset(_rebuild_own_group)


_OWN_GROUP_TIMEOUT_S = 1800


def _rebuild_own_group() -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return  # the code has not created one (yet): nothing to build again
    backend = dist.get_backend()
    dist.destroy_process_group()
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=_OWN_GROUP_TIMEOUT_S))


#: torch's global switches as this worker process had them before its first run.
_FRESH_STATE: Optional[Tuple[Any, bool, bool]] = None


def _reset_run_state() -> None:
    """Give every run on this worker what a fresh process would give it: torch's default
    CPU random generator state (so unseeded model initialisation is the same as on new
    workers), deterministic algorithms and cudnn.benchmark as they were. The first run on a
    process records them; later runs (a re-run, the next Tune trial on reused workers)
    restore them."""
    global _FRESH_STATE
    import torch

    if _FRESH_STATE is None:
        _FRESH_STATE = (torch.get_rng_state(), torch.are_deterministic_algorithms_enabled(),
                        bool(torch.backends.cudnn.benchmark))
        return
    rng, deterministic, benchmark = _FRESH_STATE
    torch.set_rng_state(rng)
    if torch.are_deterministic_algorithms_enabled() != deterministic:
        # Only when it changed: each call (torch 2.13) leaves references to the default
        # process group behind, which then outlives destroy_process_group (its connections
        # stay open: see _release_process_group).
        torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = benchmark


def _release_process_group() -> None:
    """Run, for gloo, when a training function raised (``on_worker_run_error``): shut the
    group's connections down, then destroy it. A peer blocked in a collective with this worker
    fails at once instead of at the timeout, and the failure spreads through the group (a
    survivor next to the failed worker fails and releases its own...). The survivors' runs end
    within milliseconds: they are kept (``keeps_survivors``).

    Destroying the group alone closes its connections only when nothing refers to it any more,
    and much does: an FSDP model's device mesh (torch caches meshes for the process), a DDP
    model kept in a global, a failed step's frames, ``torch.use_deterministic_algorithms``
    called after the group exists (torch 2.13). Then the peer waited in its collective until it
    was replaced. Shutting the connections down does not depend on who still holds the group."""
    _interrupt_process_group()
    _destroy_process_group()


def _destroy_process_group() -> None:
    """Destroy this worker's default process group, if there is one (the group's connections
    close once nothing else refers to it: see :func:`_release_process_group`)."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _start_run() -> bool:
    """Before a run on a worker: reset torch's state (:func:`_reset_run_state`); whether the
    process group sgd set up is still there (a failed run destroys it)."""
    _prepare_run()
    return _has_group()


def _prepare_run() -> None:
    _reset_run_state()
    from sgd_torch.train_loop_utils import get_device

    # Hugging Face Accelerate reads the device from here (Ray Train sets it too); set only when
    # it changes (each setting is a call into the C library's environment, every run). What the
    # device follows from is asked for first: the same as at the last run, the same device.
    global _DEVICE_FOR
    inputs = (os.environ.get("SGD_OWN_GPU_IDS"), os.environ.get("CUDA_VISIBLE_DEVICES"), _local_gpus())
    if _DEVICE_FOR is not None and _DEVICE_FOR[0] == inputs:
        device = _DEVICE_FOR[1]
    else:
        device = str(get_device())
        _DEVICE_FOR = (inputs, device)
    if os.environ.get("ACCELERATE_TORCH_DEVICE") != device:
        os.environ["ACCELERATE_TORCH_DEVICE"] = device


#: (what the worker's device follows from, the device) at the last run: see _prepare_run.
_DEVICE_FOR: Optional[Tuple[Any, str]] = None


def _local_gpus() -> Any:
    """The run's own GPUs in local mode (``num_workers=0``), else ``None``."""
    from sgd_torch.train_loop_utils import _current_run

    run = _current_run()
    return None if run is None or run.context.local_gpus is None else tuple(run.context.local_gpus)
