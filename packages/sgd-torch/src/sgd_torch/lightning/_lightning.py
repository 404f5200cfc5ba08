"""The Lightning strategies, cluster environment, report callback and ``prepare_trainer``."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from typing import Any, Dict

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy

import sgd
from sgd_torch._deps import installed
from sgd_torch.train_loop_utils import get_device

logger = logging.getLogger("sgd.lightning")

#: The file name :class:`SgdReportCallback` gives the Lightning checkpoint in the reported folder.
CHECKPOINT_NAME = "checkpoint.ckpt"


class SgdLightningEnvironment(LightningEnvironment):
    """Lightning's view of the cluster, from sgd: ranks and world size are the worker's, and
    the processes and their process group already exist (sgd made them), so Lightning
    launches nothing and tears nothing down."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def world_size(self) -> int:
        return sgd.world_size()

    def global_rank(self) -> int:
        return sgd.world_rank()

    def local_rank(self) -> int:
        return sgd.local_rank()

    def node_rank(self) -> int:
        return sgd.node_rank()

    def set_world_size(self, size: int) -> None:
        pass  # sgd decides (Lightning would set devices x num_nodes)

    def set_global_rank(self, rank: int) -> None:
        pass

    def teardown(self) -> None:
        pass  # the process group is sgd's; it outlives this Trainer


class _SgdDevices:
    """What both strategies take from sgd: the worker's device, and a sampler over all workers
    (Lightning's defaults assume it launched ``devices x num_nodes`` processes itself)."""

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        return {"num_replicas": sgd.world_size(), "rank": sgd.world_rank()}


class SgdDDPStrategy(_SgdDevices, DDPStrategy):
    """Lightning's ``DDPStrategy`` on sgd's process group and devices."""


class SgdFSDPStrategy(_SgdDevices, FSDPStrategy):
    """Lightning's ``FSDPStrategy`` (parameters sharded across the workers) on sgd's process
    group and devices."""


class SgdDeepSpeedStrategy(_SgdDevices, DeepSpeedStrategy):
    """Lightning's ``DeepSpeedStrategy`` on sgd's process group and devices (Ray Train's
    ``RayDeepSpeedStrategy``). Takes Lightning's arguments.

    :raises ImportError: DeepSpeed is not installed (``pip install deepspeed``); the class is
        importable without it, the error comes when it is built.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not installed("deepspeed"):
            raise ImportError("SgdDeepSpeedStrategy (Ray Train's RayDeepSpeedStrategy) needs DeepSpeed, which is not "
                              "installed: pip install deepspeed")
        super().__init__(*args, **kwargs)


def _number(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


class SgdReportCallback(Callback):
    """At the end of every training epoch: one ``sgd.report`` with Lightning's
    ``callback_metrics`` (tensors as numbers), ``epoch`` and ``step``, and the checkpoint
    ``trainer.save_checkpoint`` writes (``checkpoint.ckpt`` in the reported folder).

    Every worker goes through the end of every epoch, so all report the same number of
    times. Continue a run from a reported checkpoint with
    ``trainer.fit(model, ckpt_path=os.path.join(sgd.get_checkpoint().path, CHECKPOINT_NAME))``.

    :param checkpoint_upload_mode: Ray 2.60's ``CheckpointUploadMode`` (or its name), passed to
        :func:`sgd.report`; ``None``: ``SYNC``.
    :param validation: Ray 2.60's ``validation`` argument of ``report``, passed on when set.
    """

    CHECKPOINT_NAME = CHECKPOINT_NAME

    def __init__(self, checkpoint_upload_mode: Any = None, validation: Any = False) -> None:
        super().__init__()
        self.checkpoint_upload_mode = checkpoint_upload_mode
        self.validation = validation

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        metrics = {key: _number(value) for key, value in trainer.callback_metrics.items()}
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        folder = tempfile.mkdtemp(prefix="sgd-lightning-")
        try:
            # Collective: every rank calls it; the strategy decides who writes (rank 0 for DDP).
            trainer.save_checkpoint(os.path.join(folder, CHECKPOINT_NAME), weights_only=False)
            written = os.path.exists(os.path.join(folder, CHECKPOINT_NAME))
            options: Dict[str, Any] = {}
            if self.checkpoint_upload_mode is not None:
                options["checkpoint_upload_mode"] = self.checkpoint_upload_mode
            if self.validation is not False:
                options["validation"] = self.validation
            sgd.report(metrics, checkpoint=sgd.Checkpoint.from_directory(folder) if written else None, **options)
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # sgd has taken the files when report returns


def prepare_trainer(trainer: Trainer) -> Trainer:
    """Check that a ``lightning.pytorch.Trainer`` built in an sgd worker runs on sgd; returns it.

    Warns when its strategy is not :class:`SgdDDPStrategy` / :class:`SgdFSDPStrategy` or its
    cluster environment not :class:`SgdLightningEnvironment`: Lightning would then count one
    process per node and shard the data wrongly, or try to launch processes itself.

    :raises TypeError: ``trainer`` is not a ``lightning.pytorch.Trainer``.
    """
    if not isinstance(trainer, Trainer):
        raise TypeError(f"prepare_trainer takes a lightning.pytorch.Trainer, got {type(trainer).__name__}")
    strategy = trainer.strategy
    if not isinstance(strategy, _SgdDevices):
        warnings.warn(
            f"the Trainer's strategy is {type(strategy).__name__}: pass strategy=SgdDDPStrategy() (or "
            "SgdFSDPStrategy(), SgdDeepSpeedStrategy()) so that Lightning uses sgd's ranks, devices and process group",
            stacklevel=2,
        )
    environment = getattr(strategy, "cluster_environment", None)
    if not isinstance(environment, SgdLightningEnvironment):
        warnings.warn(
            f"the Trainer's cluster environment is {type(environment).__name__}: pass "
            "plugins=[SgdLightningEnvironment()] so that Lightning takes its ranks from sgd",
            stacklevel=2,
        )
    return trainer
