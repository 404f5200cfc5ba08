"""Across hosts: XGBoost and LightGBM with workers on two hosts of sgd_testing's three-host
cluster (a head at 127.0.0.2 with no CPUs, where the driver and so XGBoost's tracker run, and
worker hosts at 127.0.0.3 and 127.0.0.4 with private disks). The workers reach the tracker, and
each other's LightGBM listen ports, at the hosts' own addresses."""

import numpy as np
import pytest
import xgboost

import sgd
from sgd_xgboost import LightGBMTrainer, XGBoostReportCallback, XGBoostTrainer

pytestmark = pytest.mark.multinode

PARAMS = {"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 3, "eta": 0.3, "max_bin": 1024,
          "nthread": 1}


def _loop(config):
    import ray

    frame = config["train"]
    rank, size = sgd.world_rank(), sgd.world_size()
    part = frame.iloc[rank::size]  # this worker's rows
    dtrain = xgboost.QuantileDMatrix(part.drop(columns="target"), part["target"], max_bin=1024)
    ip = ray.util.get_node_ip_address()
    xgboost.train(config["params"], dtrain, num_boost_round=8, evals=[(dtrain, "train")], verbose_eval=False,
                  callbacks=[XGBoostReportCallback(
                      num_boost_round=8,
                      results_postprocessing_fn=lambda m: {**m, "ip": ip,
                                                           "collective": xgboost.collective.get_world_size()})])


class _Rounds(sgd.TrainingCallback):
    def __init__(self):
        self.rounds = []

    def handle_result(self, results, **info):
        self.rounds.append(results)


def test_xgboost_on_two_hosts_is_one_job(hosts, cancer):
    train, test = cancer
    rounds = _Rounds()
    result = XGBoostTrainer(
        _loop, train_loop_config={"train": train, "params": PARAMS},
        scaling_config=sgd.ScalingConfig(num_workers=4),
        run_config=sgd.RunConfig(verbose=0, callbacks=[rounds]),
    ).fit()
    assert result.error is None, result.error
    last = rounds.rounds[-1]
    assert sorted({r["ip"] for r in last}) == ["127.0.0.3", "127.0.0.4"]  # workers on both hosts
    assert {r["collective"] for r in last} == {4}  # one communicator of 4 across them
    model = XGBoostTrainer.get_model(result.checkpoint)  # written on a worker host, read on the driver's
    # One job over all rows: the model one process makes of the whole set (exact quantile cuts).
    single = xgboost.train(PARAMS, xgboost.QuantileDMatrix(train.drop(columns="target"), train["target"],
                                                           max_bin=1024), 8)
    dtest = xgboost.DMatrix(test.drop(columns="target"))
    np.testing.assert_allclose(model.predict(dtest), single.predict(dtest), atol=1e-5)


def test_lightgbm_on_two_hosts(hosts, cancer):
    train, test = cancer
    result = LightGBMTrainer(
        params={"objective": "binary", "num_leaves": 8, "learning_rate": 0.2, "min_data_in_leaf": 5},
        label_column="target", datasets={"train": train}, num_boost_round=6,
        scaling_config=sgd.ScalingConfig(num_workers=4), run_config=sgd.RunConfig(verbose=0),
    ).fit()
    assert result.error is None, result.error
    model = LightGBMTrainer.get_model(result.checkpoint)
    assert model.current_iteration() == 6
    # Trained on all 4 workers' rows together: every tree's root counts the whole training set.
    assert f"internal_count={len(train)}" in model.model_to_string()
    accuracy = ((model.predict(test.drop(columns="target")) > 0.5) == test["target"]).mean()
    assert accuracy > 0.9
