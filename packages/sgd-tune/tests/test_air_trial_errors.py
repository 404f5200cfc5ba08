"""An AIR trainer's failures as a Tune trial (issue 53): its own ``fit()`` raises, but a trial runs
it through ``make_trainer``/``run_on``, so Tune's ``ResultGrid`` keeps reporting errors in
``result.error`` as Tune does; the trainer's ``FailureConfig(max_failures)`` retries an exception
inside the trial first, and Tune's own ``FailureConfig`` retries the trial after."""

from pathlib import Path

from ray import tune

import sgd
from sgd import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig


def fails_first_time(config):
    """Checkpoints epoch 0, then raises on its first attempt only (a marker file remembers it)."""
    start = 0
    checkpoint = sgd.get_checkpoint()
    if checkpoint is not None:
        start = checkpoint.to_dict()["epoch"] + 1
    for epoch in range(start, 3):
        if epoch == 1 and not Path(config["marker"]).exists():
            Path(config["marker"]).write_text("x")
            raise ValueError("transient")
        sgd.report({"epoch": epoch, "start": start}, checkpoint=sgd.Checkpoint.from_dict({"epoch": epoch}))


def _trainer(marker, max_failures=0):
    return DataParallelTrainer(fails_first_time, train_loop_config={"marker": str(marker)},
                               scaling_config=ScalingConfig(num_workers=1),
                               run_config=RunConfig(failure_config=FailureConfig(max_failures=max_failures)))


def test_a_failed_trial_is_reported_in_the_grid_not_raised(ray_cluster, storage_path, tmp_path):
    def always_fails(config):
        sgd.report({"step": 0})
        raise ValueError("bad input 7")

    trainer = DataParallelTrainer(always_fails, scaling_config=ScalingConfig(num_workers=1))
    grid = tune.Tuner(trainer, run_config=tune.RunConfig(storage_path=storage_path, name="air_fails",
                                                         verbose=0)).fit()
    assert len(grid.errors) == 1
    assert "ValueError" in str(grid[0].error) and "bad input 7" in str(grid[0].error)
    assert grid[0].metrics["step"] == 0


def test_tunes_failure_config_retries_the_trial_from_its_checkpoint(ray_cluster, storage_path, tmp_path):
    grid = tune.Tuner(_trainer(tmp_path / "tune_retry"),
                      run_config=tune.RunConfig(storage_path=storage_path, name="air_tune_retry", verbose=0,
                                                failure_config=tune.FailureConfig(max_failures=1))).fit()
    assert not grid.errors and (tmp_path / "tune_retry").exists()
    assert grid[0].metrics["epoch"] == 2 and grid[0].metrics["start"] == 1


def test_the_trainers_max_failures_retries_inside_the_trial(ray_cluster, storage_path, tmp_path):
    grid = tune.Tuner(_trainer(tmp_path / "in_trial", max_failures=1),
                      run_config=tune.RunConfig(storage_path=storage_path, name="air_in_trial", verbose=0)).fit()
    assert not grid.errors and (tmp_path / "in_trial").exists()
    assert grid[0].metrics["epoch"] == 2 and grid[0].metrics["start"] == 1
