"""``sgd.collective`` inside an XGBoost run (Ray 2.60's ``ray.train.collective`` in an
``XGBoostTrainer`` loop): rank 0's parameters reach every worker, then the workers train together
through XGBoost's own communicator. The collectives themselves: sgd-core's tests/test_collective.py."""

import numpy as np
import pytest

import sgd
import sgd.collective
from sgd import ScalingConfig
from sgd_xgboost.xgboost import XGBoostTrainer

xgboost = pytest.importorskip("xgboost")


def loop(config):
    rank = sgd.get_context().get_world_rank()
    params = sgd.collective.broadcast_from_rank_zero(
        {"objective": "binary:logistic", "max_depth": 2, "seed": 7} if rank == 0 else None)
    sgd.collective.barrier()
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(64, 3))
    booster = xgboost.train(params, xgboost.DMatrix(x, label=(x[:, 0] > 0).astype(int)), num_boost_round=2)
    sgd.report({"params_seed": params["seed"], "trees": booster.num_boosted_rounds()})


def test_broadcast_and_barrier_in_an_xgboost_run(ray_cluster, tmp_path):
    trainer = XGBoostTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                             run_config=sgd.RunConfig(storage_path=str(tmp_path), name="xgb_collective"))
    result = trainer.fit()
    assert result.metrics["params_seed"] == 7 and result.metrics["trees"] == 2
