"""``TorchTrainer.as_trainable`` under a real ``tune.Tuner``."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from sgd_torch.v1 import BaseTorchTrainable, TorchTrainer


def model_creator(config):
    torch.manual_seed(0)
    return torch.nn.Linear(1, 1)


def optimizer_creator(model, config):
    return torch.optim.SGD(model.parameters(), lr=config["lr"])


def data_creator(config):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 1, generator=g)
    dataset = TensorDataset(x, 3 * x + 1)
    return DataLoader(dataset, batch_size=16, shuffle=True), DataLoader(dataset, batch_size=64)


def test_trial_resources_are_one_bundle_for_the_trial_and_one_per_worker():
    trainable = TorchTrainer.as_trainable(model_creator, data_creator, optimizer_creator, num_replicas=2,
                                          num_cpus_per_worker=2)
    assert issubclass(trainable, BaseTorchTrainable)
    assert trainable.default_resource_request({}).bundles == [{"CPU": 1}, {"CPU": 2}, {"CPU": 2}]
    with pytest.raises(ValueError, match="missing: data_creator"):
        TorchTrainer.as_trainable(model_creator=model_creator, optimizer_creator=optimizer_creator)
    with pytest.raises(TypeError, match="override_tune_step"):
        TorchTrainer.as_trainable(model_creator, data_creator, optimizer_creator, override_tune_step="train")


def test_as_trainable_runs_a_tune_search(ray_cluster, tmp_path, monkeypatch):
    from ray import tune

    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "0")
    trainable = TorchTrainer.as_trainable(model_creator, data_creator, optimizer_creator,
                                          loss_creator=torch.nn.MSELoss, config={"lr": 0.001}, num_workers=1)
    tuner = tune.Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.001, 0.1])},  # Tune's config overrides the trainer's
        tune_config=tune.TuneConfig(metric="val_loss", mode="min"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="v1", verbose=0,
                                  stop={"training_iteration": 2},
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True)),
    )
    results = tuner.fit()
    assert not results.errors, results.errors
    assert len(results) == 2
    for result in results:
        metrics = result.metrics
        assert metrics["training_iteration"] == 2 and metrics["epoch"] == 2
        assert {"train_loss", "val_loss", "num_samples"} <= set(metrics)
    best = results.get_best_result()
    assert best.config["lr"] == 0.1
    worst = results.get_best_result(mode="max")
    assert worst.metrics["val_loss"] > best.metrics["val_loss"]
    # The Tune checkpoint is the file TorchTrainer.save writes.
    state = torch.load(os.path.join(best.checkpoint.path, "trainer.pt"), weights_only=True)
    assert state["epoch"] == 2 and list(state["models"][0]) == ["weight", "bias"]
