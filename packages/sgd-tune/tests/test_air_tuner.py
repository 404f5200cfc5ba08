"""An AIR-style trainer passed to tune.Tuner as is: param_space["train_loop_config"] per trial."""

from pathlib import Path

import pytest
from ray import tune

import sgd
from sgd import DataParallelTrainer, ScalingConfig


def loop(config):
    start = 0
    ckpt = sgd.get_checkpoint()
    if ckpt is not None:
        start = ckpt.to_dict()["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        checkpoint = sgd.Checkpoint.from_dict({"epoch": epoch}) if sgd.world_rank() == 0 else None
        ctx = sgd.get_context()
        sgd.report({"score": config["lr"] * (epoch + 1), "world": sgd.world_size(),
                    "sgd_trial_id": ctx.get_trial_id(), "sgd_trial_name": ctx.get_trial_name(),
                    "sgd_experiment": ctx.get_experiment_name()}, checkpoint=checkpoint)


def test_tuner_runs_the_trainer_per_trial(ray_cluster, storage_path):
    trainer = DataParallelTrainer(loop, train_loop_config={"epochs": 3, "lr": 0.0},
                                  scaling_config=ScalingConfig(num_workers=2))
    tuner = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"lr": tune.grid_search([0.1, 1.0])}},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(storage_path=storage_path, verbose=0),
    )
    grid = tuner.fit()
    assert not grid.errors
    assert len(grid) == 2
    best = grid.get_best_result()
    assert best.config["train_loop_config"]["lr"] == 1.0
    assert best.metrics["score"] == pytest.approx(3.0)
    assert best.metrics["world"] == 2 and best.metrics["training_iteration"] == 3
    # The workers know which Tune trial and experiment they run in.
    for result in grid:
        assert result.metrics["sgd_trial_id"] == result.metrics["trial_id"]
        assert result.metrics["sgd_trial_name"].endswith(result.metrics["trial_id"])
        assert result.metrics["sgd_experiment"] == Path(result.path).parent.name
    # The trial's checkpoint is the sgd checkpoint of its last round.
    with best.checkpoint.as_directory() as d:
        assert sgd.Checkpoint.from_directory(d).to_dict() == {"epoch": 2}


def test_unknown_param_space_key_fails_the_trial(ray_cluster, storage_path):
    trainer = DataParallelTrainer(loop, train_loop_config={"epochs": 1, "lr": 1.0},
                                  scaling_config=ScalingConfig(num_workers=2))
    grid = tune.Tuner(trainer, param_space={"lr": 0.5},
                      run_config=tune.RunConfig(storage_path=storage_path, verbose=0)).fit()
    assert len(grid.errors) == 1
    assert "train_loop_config" in str(grid.errors[0])


def test_as_trainable_carries_the_trial_resources():
    trainer = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=3,
                                                                     resources_per_worker={"CPU": 2}))
    pgf = trainer.as_trainable()._resources
    assert pgf.bundles == [{"CPU": 1}] + [{"CPU": 2}] * 3
    assert trainer._resources.bundles == pgf.bundles

