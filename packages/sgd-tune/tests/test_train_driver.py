"""Ray Train 2.x's way of tuning (issue 53): ``tune.Tuner(train_driver_fn)``, whose trial builds a
``TorchTrainer`` with ``RunConfig(callbacks=[TuneReportCallback()])`` and calls ``fit()`` (Ray's
"Hyperparameter Tuning with Ray Tune" guide, its imports renamed)."""

import json
import tempfile
from pathlib import Path

import pytest
from ray import tune

import sgd
import sgd_tune
from sgd_torch import TorchTrainer
from sgd_tune.integration.ray_train import TuneReportCallback


def train_fn_per_worker(config):
    """Three epochs; rank 0 passes a checkpoint with each report."""
    for epoch in range(3):
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if sgd.get_context().get_world_rank() == 0:
                Path(d, "state.json").write_text(json.dumps({"epoch": epoch, "lr": config["lr"]}))
                checkpoint = sgd.Checkpoint.from_directory(d)
            sgd.report({"loss": config["lr"] * (3 - epoch), "epoch": epoch}, checkpoint=checkpoint)


def make_driver(storage_path, callback=TuneReportCallback, trainer_cls=TorchTrainer):
    def train_driver_fn(config):
        trainer = trainer_cls(
            train_fn_per_worker,
            train_loop_config=config["train_loop_config"],
            scaling_config=sgd.ScalingConfig(num_workers=config.get("num_workers", 1)),
            run_config=sgd.RunConfig(
                name=f"train-trial_id={tune.get_context().get_trial_id()}",
                storage_path=storage_path,
                callbacks=[callback()],
            ),
        )
        trainer.fit()

    return train_driver_fn


def test_each_trial_reports_its_trainers_rounds_and_checkpoints_to_tune(ray_cluster, storage_path, tmp_path):
    """Two trials at once, each a 1-worker TorchTrainer, on the 4 logical CPUs: a trial takes one CPU
    (Tune's default) and its trainer reserves its worker beside it, as Ray Train does."""
    runs = tmp_path / "train_runs"
    tuner = tune.Tuner(
        make_driver(str(runs)),
        param_space={"train_loop_config": {"lr": tune.grid_search([0.1, 1.0])}},
        tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=storage_path, verbose=0),
    )
    grid = tuner.fit()
    assert not grid.errors and len(grid) == 2
    for result in grid:
        lr = result.config["train_loop_config"]["lr"]
        assert list(result.metrics_dataframe["loss"]) == pytest.approx([lr * 3, lr * 2, lr])
        assert result.metrics["training_iteration"] == 3 and result.metrics["epoch"] == 2
        # Ray's metric: the checkpoint's path in the trainer's run folder...
        path = Path(result.metrics["checkpoint_path"])
        assert runs in path.parents and f"train-trial_id={result.metrics['trial_id']}" in str(path)
        # ...and beyond Ray, the checkpoint itself, kept by Tune.
        with result.checkpoint.as_directory() as d:
            assert json.loads(Path(d, "state.json").read_text()) == {"epoch": 2, "lr": lr}
    best = grid.get_best_result()
    assert best.config["train_loop_config"]["lr"] == 0.1 and best.metrics["loss"] == pytest.approx(0.1)


def test_rays_own_callback_and_a_trial_that_reserves_its_trainers_workers(ray_cluster, storage_path, tmp_path):
    """Code that kept ``from ray.tune.integration.ray_train import TuneReportCallback`` (a Ray Tune
    import, which the renaming leaves alone): rank 0's metrics and the checkpoint's path reach Tune.
    The trial asks for its trainer's 2 workers with its own CPU
    (``tune.with_resources(driver, sgd_tune.trial_resources(...))``), and the trainer uses them."""
    from ray.tune.integration.ray_train import TuneReportCallback as RaysTuneReportCallback

    driver = tune.with_resources(make_driver(str(tmp_path), callback=RaysTuneReportCallback,
                                             trainer_cls=sgd.DataParallelTrainer),
                                 sgd_tune.trial_resources(2, {"CPU": 1}))
    grid = tune.Tuner(driver, param_space={"train_loop_config": {"lr": 0.5}, "num_workers": 2},
                      run_config=tune.RunConfig(storage_path=storage_path, verbose=0)).fit()
    assert not grid.errors
    result = grid[0]
    assert list(result.metrics_dataframe["loss"]) == pytest.approx([1.5, 1.0, 0.5])
    assert Path(result.metrics["checkpoint_path"]).is_dir()
    assert result.checkpoint is None  # Ray's callback hands Tune the path only


def test_the_callback_outside_a_tune_trial_says_where_it_belongs():
    with pytest.raises(RuntimeError, match="Tune session"):
        TuneReportCallback()
    assert sgd_tune.TuneReportCallback is TuneReportCallback
