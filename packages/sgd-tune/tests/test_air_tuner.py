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



def counting_loop(config):
    import os

    ckpt = sgd.get_checkpoint()
    epoch = 0
    while config["epochs"] is None or epoch < config["epochs"]:  # None: until Tune stops it
        sgd.report({"epoch": epoch, "pid": os.getpid(), "had_checkpoint": ckpt is not None,
                    "run_dir": sgd.get_context().get_trial_dir()},
                   checkpoint=sgd.Checkpoint.from_dict({"epoch": epoch}) if sgd.world_rank() == 0 else None)
        epoch += 1


def test_tuner_reuses_the_workers_of_an_air_trainer(ray_cluster, storage_path):
    import json

    trainer = DataParallelTrainer(counting_loop, train_loop_config={"epochs": None, "lr": 0.0},
                                  scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}))
    grid = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"lr": tune.grid_search([0.1, 0.2, 0.3])}},
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=1),
        # Tune stops every trial after 2 results (as a scheduler would).
        run_config=tune.RunConfig(storage_path=storage_path, verbose=0, stop={"training_iteration": 2}),
    ).fit()
    assert not grid.errors and len(grid) == 3
    frames = [r.metrics_dataframe for r in grid]
    assert len({pid for f in frames for pid in f["pid"]}) == 1  # every trial on the same workers
    run_dirs = set()
    for f in frames:
        assert list(f["epoch"]) == [0, 1] and not any(f["had_checkpoint"])  # no checkpoint leaked in
        run_dir = Path(f["run_dir"].iloc[-1])
        run_dirs.add(run_dir)
        # Stopped by Tune mid-run: the sgd run says so.
        assert json.loads((run_dir / "status.json").read_text())["status"] == "STOPPED"
    assert len(run_dirs) == 3
