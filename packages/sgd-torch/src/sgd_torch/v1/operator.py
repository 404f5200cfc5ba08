"""``TrainingOperator``: Ray SGD v1's unit of training logic, running on sgd.

One operator lives in each worker process. ``setup(config)`` builds the models, optimizers,
loss and data and hands them to :meth:`TrainingOperator.register` and
:meth:`TrainingOperator.register_data`, which move them to the worker's device, wrap the
models in ``DistributedDataParallel`` (through :func:`sgd_torch.prepare_model`) and give each
worker its own part of the data. ``train_epoch`` / ``train_batch`` and ``validate`` /
``validate_batch`` hold the loops; override any of them.

The same class runs under :class:`sgd_torch.v1.TorchTrainer` and, unchanged, inside a v2
training function: ``MyOperator(config)`` reads its rank and device from the process group
sgd set up, and :meth:`TrainingOperator.run_train_epoch` does what the v1 trainer does for
one ``train()`` call.

This module holds the class, its construction and its state; its registration
(:mod:`sgd_torch.v1.registration`) and its loops (:mod:`sgd_torch.v1.loops`) are its bases.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from sgd_torch.v1.data import EpochLoader
from sgd_torch.v1.fp16 import Amp
from sgd_torch.v1.loops import _Loops

SCHEDULER_STEP_FREQS = ("batch", "epoch", "manual")
#: Version tag of the dict that :meth:`TrainingOperator.full_state_dict` returns.
STATE_FORMAT = "sgd_torch.v1/1"


class TrainingOperator(_Loops):
    """Training logic for one worker: subclass it and implement :meth:`setup`.

    Every argument may be left out: under sgd the rank comes from ``torch.distributed``,
    the device from :func:`sgd_torch.get_device`; outside any process group the operator
    is a single-process one (rank 0, no DDP). The v1 trainer passes them explicitly.

    :param config: the configuration handed to :meth:`setup` (``self.config``).
    :param world_rank: this worker's rank (default: ``torch.distributed`` rank, else 0).
    :param local_rank: its rank on its node (default: ``$LOCAL_RANK``, else 0).
    :param is_distributed: wrap models in DDP and shard data (default: world size > 1).
    :param device: where models and batches go (default: this worker's GPU, else CPU).
    :param use_gpu: with ``device`` left out, ``False`` keeps everything on the CPU.
    :param use_fp16: mixed precision with ``torch.amp`` (see :mod:`sgd_torch.v1.fp16`).
    :param use_tqdm: accepted for v1 compatibility; no progress bar is drawn.
    :param wrap_ddp: wrap registered models in ``DistributedDataParallel``.
    :param add_dist_sampler: give each worker its own part of registered ``DataLoader`` s.
    :param scheduler_step_freq: when registered schedulers step: ``"batch"`` (the default),
        ``"epoch"`` or ``"manual"`` (never by the operator).
    """

    def __init__(
        self,
        config: Optional[Dict[str, Any]] = None,
        world_rank: Optional[int] = None,
        local_rank: Optional[int] = None,
        is_distributed: Optional[bool] = None,
        device: Optional[Any] = None,
        use_gpu: Optional[bool] = None,
        use_fp16: bool = False,
        use_tqdm: bool = False,
        wrap_ddp: bool = True,
        add_dist_sampler: bool = True,
        scheduler_step_freq: Optional[str] = None,
    ):
        if scheduler_step_freq is not None and scheduler_step_freq not in SCHEDULER_STEP_FREQS:
            raise ValueError(
                f"scheduler_step_freq must be one of {', '.join(map(repr, SCHEDULER_STEP_FREQS))} or None, "
                f"got {scheduler_step_freq!r}"
            )
        group = dist.is_available() and dist.is_initialized()
        self._config: Dict[str, Any] = config if config is not None else {}
        self._world_size = dist.get_world_size() if group else 1
        self._world_rank = int(world_rank) if world_rank is not None else (dist.get_rank() if group else 0)
        self._local_rank = int(local_rank) if local_rank is not None else int(os.environ.get("LOCAL_RANK", "0"))
        self._is_distributed = bool(is_distributed) if is_distributed is not None else self._world_size > 1
        if device is None:
            from sgd_torch.train_loop_utils import get_device

            device = get_device() if use_gpu is not False else torch.device("cpu")
        self._device = torch.device(device)
        self._use_fp16 = bool(use_fp16)
        self._use_tqdm = bool(use_tqdm)
        self._wrap_ddp = bool(wrap_ddp)
        self._add_dist_sampler = bool(add_dist_sampler)
        self._scheduler_step_freq = scheduler_step_freq or "batch"
        self._amp = Amp(self._use_fp16, self._device)

        self._original_models: List[torch.nn.Module] = []
        self._models: List[torch.nn.Module] = []
        self._optimizers: List[Any] = []
        self._criterion: Any = None
        self._schedulers: List[Any] = []
        self._train_loader: Optional[EpochLoader] = None
        self._validation_loader: Optional[EpochLoader] = None
        self._overrides: Dict[str, Any] = {}
        self._registered = False
        self._in_setup = False
        self._epoch = 0
        #: Batches trained so far (all epochs); part of the operator's state.
        self.global_step = 0

    # --- state ----------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """Extra state of your operator to checkpoint (registered objects are saved anyway)."""
        return {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load what :meth:`state_dict` returned."""

    def full_state_dict(self) -> Dict[str, Any]:
        """Everything to resume from: models (unwrapped), optimizers, schedulers, the AMP
        scaler, epoch and step counters and :meth:`state_dict`. What ``TorchTrainer.save``
        writes; in a v2 ``train_func`` hand it to ``sgd.save_checkpoint(**state)``."""
        self._ensure_setup()
        return {
            "format": STATE_FORMAT,
            "epoch": self._epoch,
            "global_step": self.global_step,
            "models": [m.state_dict() for m in self._original_models],
            "optimizers": [o.state_dict() for o in self._optimizers],
            "schedulers": [s.state_dict() for s in self._schedulers],
            "amp": self._amp.state_dict(),
            "operator": self.state_dict(),
        }

    def load_full_state_dict(self, state: Dict[str, Any]) -> None:
        """Load what :meth:`full_state_dict` returned (on every worker)."""
        self._ensure_setup()
        if not isinstance(state, dict) or "models" not in state:
            raise ValueError("not a state written by sgd_torch.v1 (TorchTrainer.save / full_state_dict)")
        for what, mine in (("model", self._original_models), ("optimizer", self._optimizers),
                           ("scheduler", self._schedulers)):
            theirs = state.get(f"{what}s") or []
            if len(theirs) != len(mine):
                raise ValueError(
                    f"the state holds {len(theirs)} {what}(s) but {type(self).__name__} registered {len(mine)}; "
                    "restore it into a trainer built with the same creators / operator class."
                )
        for model, sd in zip(self._original_models, state["models"]):
            model.load_state_dict(sd)
        for optimizer, sd in zip(self._optimizers, state["optimizers"]):
            optimizer.load_state_dict(sd)
        for scheduler, sd in zip(self._schedulers, state.get("schedulers") or []):
            scheduler.load_state_dict(sd)
        self._amp.load_state_dict(state.get("amp"))
        self._epoch = int(state.get("epoch", 0))
        self.global_step = int(state.get("global_step", 0))
        self.load_state_dict(state.get("operator") or {})

    # --- building from creator functions ------------------------------------------------------

    @classmethod
    def from_creators(
        cls,
        model_creator: Callable[[Dict[str, Any]], Any],
        optimizer_creator: Callable[[Any, Dict[str, Any]], Any],
        data_creator: Optional[Callable[[Dict[str, Any]], Any]] = None,
        loss_creator: Any = None,
        scheduler_creator: Optional[Callable[[Any, Dict[str, Any]], Any]] = None,
        serialize_data_creation: bool = True,
    ) -> type:
        """A ``TrainingOperator`` subclass whose ``setup`` calls the v1 creator functions.

        ``model_creator(config)`` → model(s); ``optimizer_creator(models, config)`` →
        optimizer(s); ``data_creator(config)`` → a train loader or ``(train, validation)``;
        ``loss_creator(config)`` or a loss class (``torch.nn.MSELoss``);
        ``scheduler_creator(optimizers, config)`` → scheduler(s). With
        ``serialize_data_creation`` the workers of a node run ``data_creator`` one at a time.
        """
        from sgd_torch.v1.creators import operator_from_creators

        return operator_from_creators(cls, model_creator, optimizer_creator, data_creator, loss_creator,
                                      scheduler_creator, serialize_data_creation)
