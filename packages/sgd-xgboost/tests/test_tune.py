"""Ray Tune searches over boosting parameters through sgd-tune: the trainer passed to
``tune.Tuner`` as is, each trial one distributed boosting job on its own sgd workers."""

import pytest

import sgd
from sgd_xgboost import LightGBMTrainer, XGBoostReportCallback, XGBoostTrainer, to_quantile_dmatrix

pytest.importorskip("sgd_tune")
tune = pytest.importorskip("ray.tune")


@pytest.fixture
def storage_path(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "0")  # the plain console output: quieter in test logs
    path = tmp_path / "ray_results"
    path.mkdir()
    return str(path)


def _depth(booster):
    """The deepest split of any tree (XGBoost's text dump indents a node by its depth)."""
    return max(line.count("\t") for tree in booster.get_dump() for line in tree.splitlines())


def test_older_shape_tunes_params_and_rounds(ray_cluster, cancer, storage_path):
    train, test = cancer
    trainer = XGBoostTrainer(
        params={"objective": "binary:logistic", "eval_metric": "logloss", "eta": 0.5},
        label_column="target", datasets={"train": train, "valid": test}, num_boost_round=10,
        scaling_config=sgd.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
    )
    grid = tune.Tuner(
        trainer,
        # Ray 2.x's GBDT trainers: "params" merge into the trainer's, other keys replace its arguments.
        param_space={"params": {"max_depth": tune.grid_search([1, 4])}, "num_boost_round": 6},
        tune_config=tune.TuneConfig(metric="train-logloss", mode="min", max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=storage_path, verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    assert len(grid) == 2
    for result in grid:
        depth = result.config["params"]["max_depth"]
        assert result.metrics["training_iteration"] == 6  # num_boost_round from the param space
        with result.checkpoint.as_directory() as folder:
            model = XGBoostTrainer.get_model(folder)
        assert model.num_boosted_rounds() == 6
        assert _depth(model) <= depth
        assert "valid-logloss" in result.metrics
    best = grid.get_best_result()
    assert best.config["params"]["max_depth"] == 4  # deeper trees fit the training set better


def test_param_space_merges_into_the_trainers_params(cancer):
    """What each trial's copy of the trainer gets (no Ray: the trainer is only built)."""
    import copy

    train, _ = cancer
    trainer = XGBoostTrainer(params={"objective": "binary:logistic", "eta": 0.5, "max_depth": 1},
                             label_column="target", datasets={"train": train}, num_boost_round=10,
                             scaling_config=sgd.ScalingConfig(num_workers=2))
    trial = copy.copy(trainer)  # as sgd-tune makes each trial's
    left = trial.apply_param_space({"params": {"max_depth": 4}, "num_boost_round": 3, "unknown": 1})
    assert left == {"unknown": 1}  # sgd-tune fails the trial naming it
    assert trial.train_loop_config["params"]["eta"] == 0.5 and trial.train_loop_config["params"]["max_depth"] == 4
    assert trial.train_loop_config["num_boost_round"] == 3 and trial.num_boost_round == 3
    assert trial.train_loop_config["params"]["nthread"] == 1  # checked again: the worker's CPUs
    assert trainer.params["max_depth"] == 1 and trainer.num_boost_round == 10  # the trainer itself unchanged
    with pytest.raises(ValueError, match="num_boost_round"):
        copy.copy(trainer).apply_param_space({"num_boost_round": 0})
    with pytest.raises(ValueError, match=r"param_space\['params'\] must be a dict"):
        copy.copy(trainer).apply_param_space({"params": 3})


def _loop(config):
    dtrain = to_quantile_dmatrix(sgd.get_dataset_shard("train"), "target")
    import xgboost

    xgboost.train({"objective": "binary:logistic", "eval_metric": "logloss", "nthread": 1, **config["params"]},
                  dtrain, num_boost_round=3, evals=[(dtrain, "train")], verbose_eval=False,
                  callbacks=[XGBoostReportCallback(num_boost_round=3)])


def test_ray_260_shape_tunes_train_loop_config(ray_cluster, cancer, storage_path):
    import ray.data

    train, _ = cancer
    trainer = XGBoostTrainer(_loop, train_loop_config={"params": {}}, datasets={"train": ray.data.from_pandas(train)},
                             scaling_config=sgd.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}))
    grid = tune.Tuner(
        trainer, param_space={"train_loop_config": {"params": {"eta": tune.grid_search([0.01, 0.9])}}},
        tune_config=tune.TuneConfig(metric="train-logloss", mode="min", max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=storage_path, verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    assert grid.get_best_result().config["train_loop_config"]["params"]["eta"] == 0.9
    assert {r.metrics["training_iteration"] for r in grid} == {3}


def test_param_space_errors_name_the_key(ray_cluster, cancer, storage_path):
    train, _ = cancer
    trainer = LightGBMTrainer(params={"objective": "binary"}, label_column="target", datasets={"train": train},
                              scaling_config=sgd.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}))
    grid = tune.Tuner(trainer, param_space={"params": {"tree_learner": "serial"}, "nonsense": 1},
                      run_config=tune.RunConfig(storage_path=storage_path, verbose=0)).fit()
    assert len(grid.errors) == 1
    # the trial's params are checked as the trainer's are; the unknown key is never reached
    assert "tree_learner" in str(grid.errors[0])
