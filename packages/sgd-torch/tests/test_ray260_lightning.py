"""Ray 2.60's ``python/ray/train/v2/tests/test_lightning_integration.py`` and the Lightning part of
``test_local_mode.py`` on sgd (issue 53).

Ray's wheel does not ship its v2 tests, and Ray's repository text stays out of this one: the test is
written anew from Ray's (the same scenario, public calls and assertions), with the modules renamed by
issue 53's map (``ray.train`` → ``sgd``, ``ray.train.torch`` → ``sgd_torch``, ``ray.train.lightning``
→ ``sgd_torch.lightning``); a ``# sgd:`` comment marks every other difference. Ray's test helpers
``LinearModule`` / ``DummyDataModule`` (``ray.train.tests.lightning_test_utils``, not public) are
written anew below. Runtime: about 15 s for the two cases on a 2-core machine.
"""

import pytest
import torch

from sgd import ScalingConfig
from sgd_torch import TorchTrainer

pl = pytest.importorskip("lightning.pytorch")  # sgd: was ray.train.lightning._lightning_utils.import_lightning()
from sgd_torch.lightning import (  # noqa: E402
    RayDDPStrategy,
    RayFSDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
)


class LinearModule(pl.LightningModule):  # sgd: was ray.train.tests.lightning_test_utils; written anew
    """One linear layer; logs ``loss`` while training and ``val_loss`` at each validation."""

    def __init__(self, input_dim, output_dim, strategy="ddp"):
        super().__init__()
        self.linear = torch.nn.Linear(input_dim, output_dim)

    def training_step(self, batch, batch_idx):
        loss = self.linear(batch).sum()
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        loss = self.linear(batch).sum()
        self.log("val_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class DummyDataModule(pl.LightningDataModule):  # sgd: was ray.train.tests.lightning_test_utils; written anew
    """``dataset_size`` random 32-wide rows for training and for validation."""

    def __init__(self, batch_size, dataset_size):
        super().__init__()
        self.batch_size = batch_size
        self.train_data = torch.randn(dataset_size, 32)
        self.val_data = torch.randn(dataset_size, 32)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train_data, batch_size=self.batch_size)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.val_data, batch_size=self.batch_size)


@pytest.fixture
def ray_start_4_cpus(ray_cluster):
    # sgd: the session's 4-CPU cluster (Ray's autouse HEALTH_CHECK_INTERVAL_S_ENV_VAR fixture sets a
    # private knob of Ray's controller: dropped)
    yield ray_cluster


@pytest.mark.parametrize(
    "strategy_name, accelerator, datasource, num_workers",
    [  # sgd: two of Ray's cases (Ray's FSDP-on-CPU cases return at once), for a short suite
        ("ddp", "cpu", "dataloader", 2),
        ("ddp", "cpu", "datamodule", 0),
    ],
)
def test_trainer_with_native_dataloader_for_distributed_and_local_mode(
    ray_start_4_cpus, strategy_name, accelerator, datasource, num_workers
):
    num_epochs, batch_size, dataset_size = 1, 8, 256
    dataset_shard_size = num_workers if num_workers > 0 else 1
    strategy_map = {"ddp": RayDDPStrategy(), "fsdp": RayFSDPStrategy()}

    def train_loop():
        model = LinearModule(input_dim=32, output_dim=4, strategy=strategy_name)
        trainer = pl.Trainer(
            max_epochs=num_epochs,
            devices="auto",
            accelerator=accelerator,
            strategy=strategy_map[strategy_name],
            plugins=[RayLightningEnvironment()],
            callbacks=[RayTrainReportCallback()],
        )
        datamodule = DummyDataModule(batch_size, dataset_size)
        if datasource == "dataloader":
            trainer.fit(model, train_dataloaders=datamodule.train_dataloader(),
                        val_dataloaders=datamodule.val_dataloader())
        if datasource == "datamodule":
            trainer.fit(model, datamodule=datamodule)

    trainer = TorchTrainer(
        train_loop_per_worker=train_loop,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=(accelerator == "gpu")),
    )
    results = trainer.fit()
    assert results.metrics["epoch"] == num_epochs - 1
    assert results.metrics["step"] == num_epochs * dataset_size / dataset_shard_size / batch_size
    assert "loss" in results.metrics
    assert "val_loss" in results.metrics
