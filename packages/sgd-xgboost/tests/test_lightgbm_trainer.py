"""LightGBMTrainer in both shapes, against single-process LightGBM on the same data."""

import os

import numpy as np

import sgd
from sgd_xgboost import LightGBMReportCallback, LightGBMTrainer, get_network_params, to_lgb_dataset

PARAMS = {"objective": "binary", "num_leaves": 8, "learning_rate": 0.2, "min_data_in_leaf": 5}


def _logloss(p, y):
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def test_older_shape_is_as_accurate_as_single_process(ray_cluster, cancer):
    import lightgbm

    train, test = cancer
    result = LightGBMTrainer(
        params=PARAMS, label_column="target", datasets={"train": train, "valid": test}, num_boost_round=20,
        scaling_config=sgd.ScalingConfig(num_workers=2), run_config=sgd.RunConfig(verbose=0),
    ).fit()
    assert result.error is None, result.error
    model = LightGBMTrainer.get_model(result.checkpoint)
    assert model.current_iteration() == 20
    assert list(result.metrics_dataframe["training_iteration"]) == list(range(1, 21))  # one report per round
    x, y = test.drop(columns="target"), test["target"].to_numpy()
    # The validation set reaches every worker whole: its metric is the whole set's.
    assert result.metrics["valid-binary_logloss"] == __import__("pytest").approx(_logloss(model.predict(x), y),
                                                                               abs=1e-6)
    # Each worker bins its own features from its own rows, so the trees are not bit-identical
    # to one process's; the accuracy is the same within two of the 143 test rows.
    single = lightgbm.train({**PARAMS, "num_threads": 1, "verbose": -1},
                            lightgbm.Dataset(train.drop(columns="target"), train["target"]), 20)
    distributed_acc = np.mean((model.predict(x) > 0.5) == y)
    single_acc = np.mean((single.predict(x) > 0.5) == y)
    assert abs(distributed_acc - single_acc) <= 2 / len(y) and distributed_acc > 0.93
    assert open(f"{result.checkpoint.path}/model.txt").read().startswith("tree\n")  # LightGBM's text model


def _train_loop(config):
    import lightgbm

    params = {**config["params"], **get_network_params()}
    dtrain = to_lgb_dataset(sgd.get_dataset_shard("train"), "target", params=params)
    # Not dtrain.construct(): LightGBM bins the data across the workers only once lightgbm.train
    # has connected them; a Dataset constructed before that differs between workers.
    rows = len(dtrain.data)
    lightgbm.train(params, dtrain, num_boost_round=8, valid_sets=[dtrain], valid_names=["train"],
                   callbacks=[LightGBMReportCallback(frequency=4, results_postprocessing_fn=lambda m: {
                       **m, "rows": rows, "machines": params.get("num_machines")})])


class _AllRanks(sgd.TrainingCallback):
    def __init__(self):
        self.rounds = []

    def handle_result(self, results, **info):
        self.rounds.append(results)


def test_ray_260_shape_with_network_params(ray_cluster, digits, parquet_parts):
    import ray.data

    params = {"objective": "multiclass", "num_class": 10, "num_leaves": 8, "tree_learner": "data",
              "num_threads": 1, "verbose": -1, "min_data_in_leaf": 5}
    seen = _AllRanks()
    result = LightGBMTrainer(
        _train_loop, train_loop_config={"params": params},
        datasets={"train": ray.data.read_parquet(parquet_parts(digits, parts=4))},
        scaling_config=sgd.ScalingConfig(num_workers=2), run_config=sgd.RunConfig(verbose=0, callbacks=[seen]),
    ).fit()
    assert result.error is None, result.error
    first = seen.rounds[0]
    assert [r["machines"] for r in first] == [2, 2]
    # Ray 2.60's DataConfig (the default) cuts equal parts: up to num_workers - 1 rows (here 1) are
    # left out, as Ray's streaming_split(equal=True) leaves them.
    assert len(digits) - 1 <= sum(r["rows"] for r in first) <= len(digits) and all(r["rows"] > 0 for r in first)
    assert first[0]["rows"] == first[1]["rows"]
    assert len(seen.rounds) == 8  # the end checkpoint goes with round 8's report
    # A checkpoint's metrics are the reported dict only (Ray 2.60's): the run's index has its iteration.
    iteration = {c["name"]: c["iteration"] for c in sgd.runs.checkpoints(result.path)}
    kept = [iteration[os.path.basename(c.path)] for c, _ in result.best_checkpoints]
    assert kept == [4, 8]
    model = LightGBMTrainer.get_model(result.checkpoint)
    accuracy = np.mean(model.predict(digits.drop(columns="target")).argmax(axis=1) == digits["target"])
    assert model.current_iteration() == 8 and accuracy > 0.9
