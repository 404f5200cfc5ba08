"""XGBoostTrainer in both shapes, against single-process XGBoost on the same data."""

import os

import numpy as np
import pytest
import xgboost

import sgd
from sgd_xgboost import XGBoostConfig, XGBoostReportCallback, XGBoostTrainer, to_quantile_dmatrix

# max_bin above the number of distinct values of every feature: the quantile cuts are the values
# themselves, on one process or merged from two, so distributed training builds the same trees.
PARAMS = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"], "max_depth": 3, "eta": 0.3,
          "max_bin": 1024}


def _single_process(train, params, rounds):
    x, y = train.drop(columns="target"), train["target"]
    return xgboost.train({**params, "nthread": 1}, xgboost.QuantileDMatrix(x, y, max_bin=params["max_bin"]), rounds)


def _predict(booster, frame):
    return booster.predict(xgboost.DMatrix(frame.drop(columns="target")))


def test_older_shape_equals_single_process(ray_cluster, cancer):
    train, test = cancer
    result = XGBoostTrainer(
        params=PARAMS, label_column="target", datasets={"train": train, "valid": test}, num_boost_round=20,
        scaling_config=sgd.ScalingConfig(num_workers=2), run_config=sgd.RunConfig(verbose=0),
    ).fit()
    assert result.error is None, result.error
    model = XGBoostTrainer.get_model(result.checkpoint)
    single = _single_process(train, PARAMS, 20)
    assert model.num_boosted_rounds() == 20
    np.testing.assert_allclose(_predict(model, test), _predict(single, test), atol=1e-5)

    # One report per round, the evaluation of the whole sets (XGBoost sums it over the workers).
    frame = result.metrics_dataframe
    assert list(frame["training_iteration"]) == list(range(1, 21))
    expected = single.eval(xgboost.DMatrix(test.drop(columns="target"), label=test["target"]), "valid")
    logloss = float(expected.split("valid-logloss:")[1].split()[0])
    assert result.metrics["valid-logloss"] == pytest.approx(logloss, abs=1e-5)
    assert {"train-logloss", "train-error", "valid-error"} <= set(result.metrics)

    # The checkpoint is XGBoost's own UBJSON model and a JSON note: nothing pickled.
    files = sorted(os.listdir(result.checkpoint.path))
    assert "model.ubj" in files and "sgd_xgboost.json" in files
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".pt"))], files


class _AllRanks(sgd.TrainingCallback):
    def __init__(self):
        self.rounds = []

    def handle_result(self, results, **info):
        self.rounds.append(results)


def _train_loop(config):
    shard = sgd.get_dataset_shard("train")
    dtrain = to_quantile_dmatrix(shard, "target", max_bin=config["params"]["max_bin"])
    rows = dtrain.num_row()
    report = XGBoostReportCallback(
        metrics={"loss": "train-mlogloss"}, frequency=5,
        results_postprocessing_fn=lambda m: {**m, "rows": rows, "collective": xgboost.collective.get_world_size()})
    xgboost.train(config["params"], dtrain, num_boost_round=config["rounds"], evals=[(dtrain, "train")],
                  callbacks=[report], verbose_eval=False)


def test_ray_260_shape_streams_ray_data_shards(ray_cluster, digits, parquet_parts):
    import ray.data

    params = {"objective": "multi:softprob", "num_class": 10, "eval_metric": "mlogloss", "max_depth": 4,
              "max_bin": 64, "nthread": 1}
    seen = _AllRanks()
    result = XGBoostTrainer(
        _train_loop, train_loop_config={"params": params, "rounds": 12},
        datasets={"train": ray.data.read_parquet(parquet_parts(digits, parts=4))},
        scaling_config=sgd.ScalingConfig(num_workers=2),
        run_config=sgd.RunConfig(verbose=0, callbacks=[seen]),
        # sgd's divided split (an AIR DatasetConfig): every row once, so the trees are one process's.
        # Ray 2.60's default DataConfig cuts equal parts and may leave num_workers - 1 rows out.
        dataset_config={"train": sgd.DatasetConfig()},
    ).fit()
    assert result.error is None, result.error
    # Each worker built its matrix from its own part of the files; together, every row once.
    first = seen.rounds[0]
    assert [r["collective"] for r in first] == [2, 2]
    assert sum(r["rows"] for r in first) == len(digits) and all(r["rows"] > 0 for r in first)
    # Every round reported by both workers; checkpoints at rounds 5, 10 and the end (12).
    assert len(seen.rounds) == 13 and list(result.metrics_dataframe["training_iteration"]) == list(range(1, 14))
    # A checkpoint's metrics are the reported dict only (Ray 2.60's): the run's index has its iteration.
    iteration = {c["name"]: c["iteration"] for c in sgd.runs.checkpoints(result.path)}
    kept = [iteration[os.path.basename(c.path)] for c, _ in result.best_checkpoints]
    assert kept == [5, 10, 13]
    model = XGBoostTrainer.get_model(result.checkpoint)
    assert model.num_boosted_rounds() == 12
    # The features are small integers: the cuts are exact and the trees those of one process.
    single = xgboost.train(params, xgboost.QuantileDMatrix(digits.drop(columns="target"), digits["target"],
                                                           max_bin=64), 12)
    np.testing.assert_allclose(_predict(model, digits), _predict(single, digits), atol=1e-5)


def test_a_plain_trainer_with_the_xgboost_backend(ray_cluster, cancer):
    """No AIR trainer: Trainer(backend="xgboost") and xgboost.train in the function, twice in a
    row on the same workers (one tracker per run)."""
    train, _ = cancer

    def train_func():
        rank, size = sgd.world_rank(), sgd.world_size()
        part = train.iloc[rank * len(train) // size:(rank + 1) * len(train) // size]
        dtrain = to_quantile_dmatrix(part, "target", max_bin=1024)
        return xgboost.train({**PARAMS, "nthread": 1}, dtrain, 5).save_raw("json")

    trainer = sgd.Trainer(backend="xgboost", num_workers=2)
    trainer.start()
    try:
        for _ in range(2):
            first, second = trainer.run(train_func)
            assert first == second  # one model, on both workers
        single = _single_process(train, PARAMS, 5)
        model = xgboost.Booster(model_file=bytearray(first))
        np.testing.assert_allclose(_predict(model, train), _predict(single, train), atol=1e-5)
    finally:
        trainer.shutdown()


def test_a_tracker_port_in_use_is_named(ray_cluster, cancer):
    import socket

    train, _ = cancer
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(sgd.TrainingFailedError) as info:
            XGBoostTrainer(
                params=PARAMS, label_column="target", datasets={"train": train}, num_boost_round=2,
                xgboost_config=XGBoostConfig(tracker_port=port),
                scaling_config=sgd.ScalingConfig(num_workers=2), run_config=sgd.RunConfig(verbose=0),
            ).fit()
    error = info.value.__cause__  # what failed, in its own type
    assert isinstance(error, RuntimeError)
    assert f":{port}" in str(error) and "tracker_port=0" in str(error)
    assert info.value.result.checkpoint is None
