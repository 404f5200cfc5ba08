"""The AIR-style TorchTrainer: the seed snippet, DDP with directory checkpoints, errors."""

import os
import tempfile

import pytest
import torch

import sgd
from sgd import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from sgd_testing import KillWorker


def test_seed_snippet(ray_cluster, results_dir):
    import sgd
    from sgd import ScalingConfig
    from sgd_torch import TorchTrainer

    def train_func(config):
        for i in range(config["num_epochs"]):
            sgd.report({"epoch": i})

    trainer = TorchTrainer(train_func, train_loop_config={"num_epochs": 2},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False))
    result = trainer.fit()
    assert result.metrics["epoch"] == 1
    assert list(result.metrics_dataframe["epoch"]) == [0, 1]
    assert result.checkpoint is None and result.best_checkpoints == [] and result.error is None
    assert os.path.isdir(result.path) and str(results_dir) in result.path


def ddp_loop(config):
    from sgd_torch import prepare_model

    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    ckpt = sgd.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "model.pt"))
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
    g = torch.Generator().manual_seed(sgd.world_rank())
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    for epoch in range(start, config["epochs"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if sgd.world_rank() == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch},
                           os.path.join(d, "model.pt"))
                checkpoint = sgd.Checkpoint.from_directory(d)
            sgd.report({"epoch": epoch, "loss": loss.item(), "pid": os.getpid()}, checkpoint=checkpoint)


def test_ddp_with_directory_checkpoints_and_resume(ray_cluster, tmp_path):
    from sgd_torch import TorchConfig, TorchTrainer

    result = TorchTrainer(
        ddp_loop, {"epochs": 6}, ScalingConfig(num_workers=2), TorchConfig(backend="gloo"),
        RunConfig(name="ddp", storage_path=str(tmp_path),
                  checkpoint_config=CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="loss",
                                                     checkpoint_score_order="min")),
    ).fit()
    assert result.error is None
    losses = list(result.metrics_dataframe["loss"])
    assert losses[-1] < losses[0]
    assert [m["epoch"] for _, m in result.best_checkpoints] == [5]  # best loss is also the latest
    with result.checkpoint.as_directory() as d:
        saved = torch.load(os.path.join(d, "model.pt"))
    assert saved["epoch"] == 5

    # A new run (another name: the same one would resume "ddp", Ray 2.60's rule) from the checkpoint.
    more = TorchTrainer(ddp_loop, {"epochs": 8}, ScalingConfig(num_workers=2),
                        run_config=RunConfig(name="ddp_more", storage_path=str(tmp_path)),
                        resume_from_checkpoint=result.checkpoint).fit()
    assert more.error is None
    assert list(more.metrics_dataframe["epoch"]) == [6, 7]
    assert more.metrics["loss"] < losses[-1]


def test_torch_trainer_argument_errors():
    from sgd_torch import TorchTrainer

    with pytest.raises(TypeError, match="torch_config must be a sgd_torch.TorchConfig"):
        TorchTrainer(ddp_loop, torch_config=sgd.BackendConfig())
    with pytest.raises(ValueError, match="num_workers"):
        TorchTrainer(ddp_loop, scaling_config=ScalingConfig(num_workers=-1))


def test_failure_config_restarts_torch_workers(ray_cluster, tmp_path):
    from sgd_torch import TorchTrainer

    killer = KillWorker(at=2, rank=0)
    result = TorchTrainer(ddp_loop, {"epochs": 5}, ScalingConfig(num_workers=2),
                          run_config=RunConfig(storage_path=str(tmp_path), callbacks=[killer],
                                               failure_config=FailureConfig(max_failures=1))).fit()
    assert killer.killed and result.error is None
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2, 3, 4]


def raises_once_in_the_process_group(config):
    """An all_reduce per epoch over gloo, a checkpoint per epoch; rank 1 raises once at epoch 2."""
    import json
    from pathlib import Path

    import torch.distributed as dist

    start = 0
    checkpoint = sgd.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = json.loads(Path(d, "state.json").read_text())["epoch"] + 1
    for epoch in range(start, 4):
        if epoch == 2 and sgd.world_rank() == 1 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise TimeoutError("a flaky read")
        total = torch.tensor([1.0])
        dist.all_reduce(total)
        with tempfile.TemporaryDirectory() as d:
            Path(d, "state.json").write_text(json.dumps({"epoch": epoch}))
            sgd.report({"epoch": epoch, "start": start, "world": total.item()},
                       checkpoint=sgd.Checkpoint.from_directory(d) if sgd.world_rank() == 0 else None)


def test_max_failures_retries_an_exception_and_the_process_group_is_formed_again(ray_cluster, tmp_path):
    from sgd_torch import TorchTrainer

    result = TorchTrainer(raises_once_in_the_process_group, {"marker": str(tmp_path / "raised")},
                          ScalingConfig(num_workers=2),
                          run_config=RunConfig(storage_path=str(tmp_path),
                                               failure_config=FailureConfig(max_failures=1))).fit()
    assert os.path.exists(tmp_path / "raised")
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2, 3]
    assert result.metrics["start"] == 2 and result.metrics["world"] == 2.0
