"""``sgd_xgboost.xgboost`` and ``sgd_xgboost.lightgbm`` carry Ray Train 2.60's ``ray.train.xgboost``
and ``ray.train.lightgbm`` (issue 53): every name of their ``__all__`` (read from the installed
Ray wheel), with compatible signatures, and the report callbacks' checkpoint rhythm as Ray's."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

import sgd
from sgd_testing.ray_api import compare_in_subprocess

pytest.importorskip("ray.train.xgboost", reason="compares with Ray Train 2.60's modules")

#: Ray's names that are its backend machinery, not a user's API (how Ray's controller enters
#: the collective, which framework it records in its usage stats).
NOT_USER_API = {"XGBoostConfig.train_func_context: no such property in sgd",
                "LightGBMConfig.framework: no such property in sgd"}


def test_every_ray_name_with_a_compatible_signature():
    found = compare_in_subprocess(("ray.train.xgboost", "sgd_xgboost.xgboost"),
                                  ("ray.train.lightgbm", "sgd_xgboost.lightgbm"))
    for module, result in found.items():
        assert "RayTrainReportCallback" in result["names"], module
        assert result["missing"] == [], module
        assert [d for d in result["differences"] if d not in NOT_USER_API] == [], module


def test_the_two_callbacks_stay_apart():
    import sgd_xgboost.lightgbm as lgb_module
    import sgd_xgboost.xgboost as xgb_module

    assert xgb_module.RayTrainReportCallback is not lgb_module.RayTrainReportCallback
    assert xgb_module.RayTrainReportCallback.CHECKPOINT_NAME == "model.ubj"
    assert lgb_module.RayTrainReportCallback.CHECKPOINT_NAME == "model.txt"


# --- the callbacks on 2 workers -------------------------------------------------------------------


class _Rounds(sgd.TrainingCallback):
    def __init__(self):
        self.rounds = []

    def handle_result(self, results, **info):
        self.rounds.append(results)


def _part(frame):
    rank, size = sgd.world_rank(), sgd.world_size()
    return frame.iloc[rank * len(frame) // size:(rank + 1) * len(frame) // size]


def _xgboost_loop(config):
    import xgboost

    from sgd_xgboost.xgboost import RayTrainReportCallback

    part = _part(config["frame"])
    dtrain = xgboost.DMatrix(part.drop(columns="target"), part["target"])
    xgboost.train({"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 2, "nthread": 1},
                  dtrain, num_boost_round=7, evals=[(dtrain, "train")], verbose_eval=False,
                  callbacks=[RayTrainReportCallback(metrics={"loss": "train-logloss"}, frequency=3,
                                                    filename="model.json")])


def _kept_iterations(result):
    """The report each kept checkpoint went with: a checkpoint's metrics are the reported dict only
    (Ray 2.60's), the run's checkpoint index has the iteration."""
    iteration = {c["name"]: c["iteration"] for c in sgd.runs.checkpoints(result.path)}
    return [iteration[os.path.basename(c.path)] for c, _ in result.best_checkpoints]


def test_xgboost_callback_checkpoints_every_frequency_rounds_and_at_the_end(ray_cluster, cancer):
    from sgd_xgboost.xgboost import RayTrainReportCallback, XGBoostTrainer

    train, _ = cancer
    rounds = _Rounds()
    result = XGBoostTrainer(_xgboost_loop, train_loop_config={"frame": train},
                            scaling_config=sgd.ScalingConfig(num_workers=2),
                            run_config=sgd.RunConfig(verbose=0, callbacks=[rounds])).fit()
    # 7 rounds, each reported by both workers under the mapped name, then Ray's extra report at the
    # end (round 7 is not a multiple of 3) that carries the last checkpoint.
    assert len(rounds.rounds) == 8 and all(len(r) == 2 for r in rounds.rounds)
    assert all("loss" in r and "train-logloss" not in r for r in rounds.rounds[0])
    assert _kept_iterations(result) == [3, 6, 8]
    assert "model.json" in os.listdir(result.checkpoint.path)
    assert RayTrainReportCallback.get_model(result.checkpoint, filename="model.json").num_boosted_rounds() == 7
    with pytest.raises(ValueError, match="no xgboost model"):
        RayTrainReportCallback.get_model(result.checkpoint)  # model.ubj: the callback wrote model.json


def _lightgbm_loop(config):
    import lightgbm

    from sgd_xgboost.lightgbm import RayTrainReportCallback, get_network_params

    part = _part(config["frame"])
    params = {"objective": "binary", "metric": "binary_logloss", "num_leaves": 4, "num_threads": 1, "verbose": -1,
              "tree_learner": "data", **get_network_params()}
    dtrain = lightgbm.Dataset(part.drop(columns="target"), part["target"])
    lightgbm.train(params, dtrain, num_boost_round=5, valid_sets=[dtrain], valid_names=["train"],
                   callbacks=[RayTrainReportCallback(metrics="train-binary_logloss", frequency=2)])


def test_lightgbm_callback_checkpoints_every_frequency_rounds_and_with_the_last(ray_cluster, cancer):
    from sgd_xgboost.lightgbm import LightGBMTrainer, RayTrainReportCallback

    train, _ = cancer
    rounds = _Rounds()
    result = LightGBMTrainer(_lightgbm_loop, train_loop_config={"frame": train},
                             scaling_config=sgd.ScalingConfig(num_workers=2),
                             run_config=sgd.RunConfig(verbose=0, callbacks=[rounds])).fit()
    assert len(rounds.rounds) == 5  # one report per round: the end's checkpoint goes with round 5's
    assert set(rounds.rounds[0][0]) >= {"train-binary_logloss"}
    assert _kept_iterations(result) == [2, 4, 5]
    assert RayTrainReportCallback.get_model(result.checkpoint).current_iteration() == 5


# --- in this process --------------------------------------------------------------------------------


def test_framework_checkpoints_round_trip(tmp_path):
    import lightgbm
    import xgboost

    from sgd_xgboost.lightgbm import LightGBMCheckpoint
    from sgd_xgboost.xgboost import XGBoostCheckpoint

    x = np.arange(40, dtype=float).reshape(20, 2)
    y = (x[:, 0] > 20).astype(int)
    booster = xgboost.train({"objective": "binary:logistic", "nthread": 1}, xgboost.DMatrix(x, y), 3)
    checkpoint = XGBoostCheckpoint.from_model(booster)
    assert "model.json" in os.listdir(checkpoint.path)  # Ray's file name
    assert checkpoint.get_model().num_boosted_rounds() == 3
    (tmp_path / "mine").mkdir()
    assert XGBoostCheckpoint.from_model(booster, path=str(tmp_path / "mine")).path == str(tmp_path / "mine")
    with pytest.raises(ValueError, match="must be an existing directory"):
        XGBoostCheckpoint.from_model(booster, path=str(tmp_path / "absent"))

    model = lightgbm.train({"objective": "binary", "verbose": -1, "min_data_in_leaf": 2}, lightgbm.Dataset(x, y), 3)
    assert LightGBMCheckpoint.from_model(model).get_model().current_iteration() == 3
    with pytest.raises(ValueError, match="holds a xgboost model"):
        LightGBMCheckpoint(path=checkpoint.path).get_model()


def test_normalize_pandas_for_lightgbm():
    import lightgbm
    import pyarrow as pa

    from sgd_xgboost.lightgbm import normalize_pandas_for_lightgbm

    frame = pd.DataFrame({"i": pd.array([1, 2, None, 4], dtype=pd.ArrowDtype(pa.int64())),
                          "u": pd.array([1, 2, 3, 4], dtype=pd.ArrowDtype(pa.uint8())),
                          "f": pd.array([0.5, 1.5, 2.5, None], dtype=pd.ArrowDtype(pa.float32())),
                          "b": pd.array([True, False, True, True], dtype=pd.ArrowDtype(pa.bool_())),
                          "plain": np.array([1.0, 2.0, 3.0, 4.0])})
    out = normalize_pandas_for_lightgbm(frame)
    assert [str(t) for t in out.dtypes] == ["Int64", "UInt8", "Float32", "boolean", "float64"]
    assert out["plain"] is frame["plain"] or np.shares_memory(out["plain"].to_numpy(), frame["plain"].to_numpy())
    lightgbm.Dataset(out.drop(columns="b"), label=[0, 1, 0, 1]).construct()  # accepted as it is
    untouched = pd.DataFrame({"x": [1.0]})
    assert normalize_pandas_for_lightgbm(untouched) is untouched


def test_xgboost_config_takes_rays_communicator_only():
    from sgd_xgboost.xgboost import XGBoostConfig

    assert XGBoostConfig(xgboost_communicator="rabit").to_dict()["xgboost_communicator"] == "rabit"
    with pytest.raises(ValueError, match="'rabit' .* is the only communicator"):
        XGBoostConfig(xgboost_communicator="nccl")
