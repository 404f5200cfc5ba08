"""PyTorch Lightning on sgd: a real ``lightning.pytorch.Trainer`` per worker over sgd's gloo group."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

import sgd
from sgd import RunConfig, ScalingConfig

pytest.importorskip("lightning", reason='needs lightning: pip install "sgd-torch[lightning]"')

ROWS, BATCH = 256, 16


def make_module():
    import lightning.pytorch as pl

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss, on_epoch=True, on_step=False, sync_dist=True)
            # Per worker, not synchronised: what this worker went through in the epoch.
            self.log("batches", 1.0, on_epoch=True, on_step=False, reduce_fx="sum")
            self.log("rows", float(len(x)), on_epoch=True, on_step=False, reduce_fx="sum")
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Regression()


def make_loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1)
    ds = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True)


def lightning_loop(config):
    import lightning.pytorch as pl

    from sgd_torch.lightning import (
        CHECKPOINT_NAME,
        SgdDDPStrategy,
        SgdLightningEnvironment,
        SgdReportCallback,
        prepare_trainer,
    )

    torch.manual_seed(sgd.world_rank())  # different initial weights: DDP must broadcast rank 0's
    trainer = pl.Trainer(max_epochs=config["epochs"], accelerator="cpu", devices="auto",
                         strategy=SgdDDPStrategy(), plugins=[SgdLightningEnvironment()],
                         callbacks=[SgdReportCallback()], enable_checkpointing=False, logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer = prepare_trainer(trainer)
    checkpoint = sgd.get_checkpoint()
    ckpt_path = os.path.join(checkpoint.path, CHECKPOINT_NAME) if checkpoint else None
    module = make_module()
    trainer.fit(module, train_dataloaders=make_loader(), ckpt_path=ckpt_path)
    params = torch.cat([p.detach().flatten() for p in module.parameters()])
    return trainer.world_size, trainer.global_rank, params


def test_lightning_trains_on_sgd_workers_and_resumes_from_its_checkpoint(ray_cluster, tmp_path):
    from sgd_torch import TorchTrainer
    from sgd_torch.lightning import CHECKPOINT_NAME

    def fit(epochs, resume=None):
        return TorchTrainer(lightning_loop, train_loop_config={"epochs": epochs},
                            scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(storage_path=str(tmp_path), name=f"pl{epochs}"),
                            resume_from_checkpoint=resume).fit()

    first = fit(3)
    assert first.error is None, first.error
    df = first.metrics_dataframe
    assert list(df["epoch"]) == [0, 1, 2]
    assert list(df["step"]) == [8, 16, 24]  # 256 rows / 2 workers / 16 per batch = 8 steps an epoch
    assert set(df["batches"]) == {8.0} and set(df["rows"]) == {128.0}  # each worker: half the rows
    losses = list(df["loss"])
    assert losses[-1] < losses[0] * 0.5
    with first.checkpoint.as_directory() as d:
        assert CHECKPOINT_NAME in os.listdir(d)
        state = torch.load(os.path.join(d, CHECKPOINT_NAME), weights_only=False)
    assert state["epoch"] == 2 and state["global_step"] == 24

    # A new run from that checkpoint goes on with epochs 3 and 4 (Lightning restores the
    # weights, optimizer and loop state), on both workers, with the same weights.
    second = fit(5, resume=first.checkpoint)
    assert second.error is None, second.error
    assert list(second.metrics_dataframe["epoch"]) == [3, 4]
    assert list(second.metrics_dataframe["step"]) == [32, 40]
    assert second.metrics_dataframe["loss"].iloc[-1] < losses[-1]


def test_lightning_world_ranks_and_weights_are_sgds(ray_cluster):
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainer.start()
    try:
        (size0, rank0, w0), (size1, rank1, w1) = trainer.run(lightning_loop, config={"epochs": 1})
    finally:
        trainer.shutdown()
    assert (size0, rank0, size1, rank1) == (2, 0, 2, 1)
    assert torch.equal(w0, w1)  # DDP kept the copies identical from different initial weights


def test_ray_train_names_are_the_same_classes():
    from sgd_torch import lightning

    assert lightning.RayDDPStrategy is lightning.SgdDDPStrategy
    assert lightning.RayFSDPStrategy is lightning.SgdFSDPStrategy
    assert lightning.RayLightningEnvironment is lightning.SgdLightningEnvironment
    assert lightning.RayTrainReportCallback is lightning.SgdReportCallback


def test_prepare_trainer_warns_about_a_strategy_that_is_not_sgds():
    import lightning.pytorch as pl

    from sgd_torch.lightning import prepare_trainer

    plain = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert prepare_trainer(plain) is plain
    messages = [str(w.message) for w in caught]
    assert any("strategy=SgdDDPStrategy()" in m for m in messages), messages
    assert any("plugins=[SgdLightningEnvironment()]" in m for m in messages), messages
    with pytest.raises(TypeError, match="lightning.pytorch.Trainer, got int"):
        prepare_trainer(3)


def test_import_error_names_the_extra():
    code = ("import sys; sys.modules['lightning'] = None\n"
            "try:\n    import sgd_torch.lightning\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.strip() == ('sgd_torch.lightning needs lightning, which is not installed: '
                           'pip install "sgd-torch[lightning]"')


def fsdp_loop(config):
    import lightning.pytorch as pl

    from sgd_torch.lightning import SgdFSDPStrategy, SgdLightningEnvironment, SgdReportCallback, prepare_trainer

    trainer = pl.Trainer(max_epochs=2, accelerator="gpu", devices="auto", strategy=SgdFSDPStrategy(),
                         plugins=[SgdLightningEnvironment()], callbacks=[SgdReportCallback()],
                         enable_checkpointing=False, logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer = prepare_trainer(trainer)
    trainer.fit(make_module(), train_dataloaders=make_loader())


@pytest.mark.gpu
def test_lightning_fsdp_on_gpu_workers(ray_cluster, tmp_path):
    """Lightning's FSDP needs an accelerator (on CPU it raises "FSDP needs a non-CPU
    accelerator device"); sgd_torch.prepare_model(parallel_strategy="fsdp") works on CPU."""
    from sgd_torch import TorchTrainer

    n = min(2, torch.cuda.device_count())
    result = TorchTrainer(fsdp_loop, scaling_config=ScalingConfig(num_workers=n, use_gpu=True),
                          run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.error is None, result.error
    assert list(result.metrics_dataframe["epoch"]) == [0, 1]
    assert set(result.metrics_dataframe["rows"]) == {ROWS / n}


def ray_data_loop(config):
    import lightning.pytorch as pl

    from sgd_torch.lightning import SgdDDPStrategy, SgdLightningEnvironment, SgdReportCallback, prepare_trainer

    shard = sgd.get_dataset_shard("train")
    batches = shard.iter_torch_batches(batch_size=BATCH, collate_fn=_xy)  # a fresh pass every epoch
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices="auto", strategy=SgdDDPStrategy(),
                         plugins=[SgdLightningEnvironment()], callbacks=[SgdReportCallback()],
                         enable_checkpointing=False, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False)
    trainer = prepare_trainer(trainer)
    trainer.fit(make_module(), train_dataloaders=batches)


def _xy(batch):
    x = torch.as_tensor(batch["x"], dtype=torch.float32)
    return x, x.sum(1, keepdim=True)


def test_lightning_reads_a_ray_dataset_shard(ray_cluster, tmp_path):
    import numpy as np
    import ray.data

    from sgd_torch import TorchTrainer

    ds = ray.data.from_items([{"x": np.random.default_rng(i).standard_normal(8)} for i in range(ROWS)])
    result = TorchTrainer(ray_data_loop, scaling_config=ScalingConfig(num_workers=2), datasets={"train": ds},
                          run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.error is None, result.error
    df = result.metrics_dataframe
    assert list(df["epoch"]) == [0, 1]
    assert set(df["rows"]) == {ROWS / 2}  # each worker its own half of the rows, every epoch
    assert df["loss"].iloc[-1] < df["loss"].iloc[0]
