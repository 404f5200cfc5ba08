"""Elastic ``num_workers=(min, max)`` with the boosting backends: each restart's tracker (or
LightGBM ``machines`` list) has exactly the workers of the rebuilt group, and boosting goes on
from the last checkpoint on however many workers there are."""

import os
import signal

import numpy as np
import pytest
import ray
import xgboost

import sgd
from sgd_testing import wait_for
from sgd_xgboost import LightGBMTrainer, XGBoostTrainer

# max_bin above every feature's number of distinct values: the quantile cuts are exact on any
# number of workers, so a model boosted on 4, then 2, then 4 workers is one process's model.
PARAMS = {"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 3, "eta": 0.3, "max_bin": 1024}


class _Chaos(sgd.TrainingCallback):
    """At round ``shrink_at`` removes the second node (its workers die with it); at round
    ``grow_at`` adds a node back and SIGKILLs one worker, so that the restart can grow again.
    Notes each round's iteration and how many workers reported it."""

    def __init__(self, cluster, shrink_at, grow_at):
        self.cluster, self.shrink_at, self.grow_at = cluster, shrink_at, grow_at
        self.seen = []

    def handle_result(self, results, **info):
        iteration = results[0]["_training_iteration"]
        self.seen.append((iteration, len(results)))
        if iteration == self.shrink_at and len(results) == 4:
            second = [n for n in self.cluster.list_all_nodes() if not n.head][0]
            self.cluster.remove_node(second)
        elif iteration == self.grow_at and len(results) == 2:
            self.cluster.add_node(num_cpus=2)
            self.cluster.wait_for_nodes()
            os.kill(int(results[-1]["_pid"]), signal.SIGKILL)


def _sizes(seen):
    """iteration -> the group sizes that reported it (a restart may report a round again
    only if it was never delivered; sgd delivers each once)."""
    out = {}
    for iteration, size in seen:
        out.setdefault(iteration, []).append(size)
    return out


@pytest.mark.multinode
def test_xgboost_shrinks_and_grows_with_the_cluster(two_node_cluster, cancer, monkeypatch):
    monkeypatch.setenv("SGD_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "1")
    train, test = cancer
    chaos = _Chaos(two_node_cluster, shrink_at=4, grow_at=8)
    result = XGBoostTrainer(
        params=PARAMS, label_column="target", datasets={"train": train}, num_boost_round=12,
        scaling_config=sgd.ScalingConfig(num_workers=(2, 4)),
        run_config=sgd.RunConfig(verbose=0, callbacks=[chaos],
                                 checkpoint_config=sgd.CheckpointConfig(checkpoint_frequency=2),
                                 failure_config=sgd.FailureConfig(max_failures=-1)),
    ).fit()
    assert result.error is None, result.error
    sizes = _sizes(chaos.seen)
    assert sorted(sizes) == list(range(1, 13)) and all(len(s) == 1 for s in sizes.values()), chaos.seen
    assert sizes[1] == [4] and sizes[4] == [4]     # the whole cluster at first
    assert sizes[5] == [2] and sizes[8] == [2]     # then what was left (tracker for 2)
    assert sizes[9] == [4] and sizes[12] == [4]    # then grown back to max
    model = XGBoostTrainer.get_model(result.checkpoint)
    assert model.num_boosted_rounds() == 12
    # Nothing lost or doubled, whatever the group size of each round: one process's model.
    x, y = train.drop(columns="target"), train["target"]
    single = xgboost.train({**PARAMS, "nthread": 1}, xgboost.QuantileDMatrix(x, y, max_bin=1024), 12)
    dtest = xgboost.DMatrix(test.drop(columns="target"))
    np.testing.assert_allclose(model.predict(dtest), single.predict(dtest), atol=1e-5)


def _world(config):
    import xgboost as xgb

    return sgd.world_size(), xgb.collective.get_world_size()


@pytest.mark.multinode
def test_trainer_with_a_range_starts_with_what_fits(two_node_cluster):
    """``sgd.Trainer(backend=..., num_workers=(1, 8))`` on 4 CPUs: 4 workers, and XGBoost's
    communicator and LightGBM's machines list have 4 too."""
    trainer = sgd.Trainer(backend="xgboost", num_workers=(1, 8))
    trainer.start()
    try:
        assert trainer.run(_world) == [(4, 4)] * 4
    finally:
        trainer.shutdown()

    def machines(config):
        import sgd_xgboost

        params = sgd_xgboost.get_network_params()
        return sgd.world_size(), params["num_machines"], len(params["machines"].split(","))

    # A range takes what is free when the group starts: wait until the first group's CPUs are back.
    wait_for(lambda: ray.available_resources().get("CPU", 0) >= 4, timeout=30,
             message="the first trainer's CPUs were not released")
    trainer = sgd.Trainer(backend="lightgbm", num_workers=(1, 8))
    trainer.start()
    try:
        assert trainer.run(machines) == [(4, 4, 4)] * 4
    finally:
        trainer.shutdown()


@pytest.mark.multinode
def test_lightgbm_shrinks_to_what_is_left(two_node_cluster, cancer, monkeypatch):
    monkeypatch.setenv("SGD_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "1")
    train, _ = cancer
    chaos = _Chaos(two_node_cluster, shrink_at=3, grow_at=None)
    result = LightGBMTrainer(
        params={"objective": "binary", "num_leaves": 8, "learning_rate": 0.2, "min_data_in_leaf": 5},
        label_column="target", datasets={"train": train}, num_boost_round=8,
        scaling_config=sgd.ScalingConfig(num_workers=(2, 4)),
        run_config=sgd.RunConfig(verbose=0, callbacks=[chaos],
                                 checkpoint_config=sgd.CheckpointConfig(checkpoint_frequency=2),
                                 failure_config=sgd.FailureConfig(max_failures=-1)),
    ).fit()
    assert result.error is None, result.error
    sizes = _sizes(chaos.seen)
    assert sorted(sizes) == list(range(1, 9)), chaos.seen
    assert sizes[1] == [4] and sizes[8] == [2]
    model = LightGBMTrainer.get_model(result.checkpoint)
    assert model.current_iteration() == 8 and model.num_trees() == 8
