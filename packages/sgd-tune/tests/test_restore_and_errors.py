"""Retries by Tune resume from the trial's checkpoint; a user error fails the trial visibly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import ray
from ray import tune
from ray.tune.error import TuneError

import sgd
from sgd_testing import wait_for

EPOCHS = 4


def fails_once_at_iteration_2(config):
    state = sgd.load_checkpoint() or {"epoch": 0}
    for epoch in range(state["epoch"], EPOCHS):
        if epoch == 2 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise RuntimeError("simulated crash at iteration 2")
        sgd.report(epoch=epoch, resumed_from=state["epoch"])
        sgd.save_checkpoint(epoch=epoch + 1)


@pytest.mark.serial  # failed under load in parallel runs (docs/contributing.md)
def test_retried_trial_resumes_from_its_checkpoint(ray_cluster, storage_path, tmp_path):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2)
    tuner = tune.Tuner(
        trainer.to_tune_trainable(fails_once_at_iteration_2),
        param_space={"marker": str(tmp_path / "failed_once")},
        run_config=tune.RunConfig(storage_path=storage_path, name="restore", verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=1)),
    )
    (result,) = tuner.fit()
    assert result.error is None
    assert (tmp_path / "failed_once").exists()  # it did fail once
    # Resumed from the checkpoint saved after iteration 2 (epoch 1), not from scratch.
    assert result.metrics["resumed_from"] == 2
    assert result.metrics["epoch"] == EPOCHS - 1 and result.metrics["training_iteration"] == EPOCHS
    assert sorted(set(result.metrics_dataframe["epoch"])) == list(range(EPOCHS))
    assert sgd.Trainer.load_checkpoint_from_path(result.checkpoint.path) == {"epoch": EPOCHS}


def raises_value_error(config):
    sgd.report(step=0, run_dir=sgd.get_context().get_trial_dir())
    raise ValueError(f"bad input {config['x']}")


def test_user_error_fails_the_trial(ray_cluster, storage_path):
    trainable = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=1).to_tune_trainable(raises_value_error)
    (result,) = tune.Tuner(
        trainable, param_space={"x": 42},
        run_config=tune.RunConfig(storage_path=storage_path, name="error", verbose=0),
    ).fit()
    assert result.error is not None
    assert "ValueError" in str(result.error) and "bad input 42" in str(result.error)
    assert result.metrics["step"] == 0  # the report before the error still reached Tune
    status = json.loads((Path(result.metrics["run_dir"]) / "status.json").read_text())["status"]
    assert status == "ERRORED"

    with pytest.raises(TuneError):
        tune.run(trainable, config={"x": 1}, storage_path=storage_path, name="error_run", verbose=0)
    wait_for(lambda: ray.available_resources().get("CPU") == ray_cluster["CPU"], timeout=30,
             message=f"CPUs not released: {ray.available_resources()}")


def reports_its_shard(config):
    shard = sgd.get_dataset_shard()
    sgd.report(total=sum(shard) * config["scale"])


def test_dataset_is_passed_to_each_trial(ray_cluster, storage_path):
    trainable = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=1).to_tune_trainable(
        reports_its_shard, dataset=[1, 2, 3])
    results = tune.Tuner(
        trainable, param_space={"scale": tune.grid_search([1, 10])},
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=storage_path, name="dataset", verbose=0),
    ).fit()
    assert sorted(r.metrics["total"] for r in results) == [6, 60]
