"""A worker SIGKILLed mid-boosting: the group restarts from the last booster checkpoint and
boosts on from there (xgb_model= / init_model=), no round lost or doubled."""

import os
import signal

import numpy as np
import xgboost

import sgd
from sgd_xgboost import LightGBMTrainer, XGBoostTrainer

PARAMS = {"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 3, "eta": 0.3, "max_bin": 1024}


class _KillAtIteration(sgd.TrainingCallback):
    """SIGKILLs rank 1's process once, when round ``at`` is delivered (its pid comes from the
    detailed autofilled metrics)."""

    def __init__(self, at):
        self.at = at
        self.iterations = []
        self.killed = []

    def handle_result(self, results, **info):
        iteration = results[0]["_training_iteration"]
        self.iterations.append(iteration)
        if iteration == self.at and not self.killed:
            pid = int(results[1]["_pid"])
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)


class _XGBoostStart(xgboost.callback.TrainingCallback):
    """Notes in a file the number of rounds the model had when rank 0's xgboost.train began."""

    def __init__(self, path):
        self.path = path

    def before_training(self, model):
        if sgd.world_rank() == 0:
            with open(self.path, "a") as f:
                f.write(f"{model.num_boosted_rounds()}\n")
        return model


class _LightGBMStart:
    """The same for lightgbm.train: the first iteration rank 0 boosts."""

    order = 1

    def __init__(self, path):
        self.path = path
        self.seen = False

    def __call__(self, env):
        if not self.seen and sgd.world_rank() == 0:
            self.seen = True
            with open(self.path, "a") as f:
                f.write(f"{env.iteration}\n")


def _resumed_from_a_checkpoint(starts, killed_at, every, rounds):
    first, second = (int(n) for n in starts.read_text().split())
    assert first == 0
    assert second % every == 0 and killed_at - every < second < rounds, second


def _fit(trainer_cls, params, train, killer, start, rounds=30):
    return trainer_cls(
        params=params, label_column="target", datasets={"train": train}, num_boost_round=rounds, callbacks=[start],
        scaling_config=sgd.ScalingConfig(num_workers=2),
        run_config=sgd.RunConfig(verbose=0, callbacks=[killer],
                                 checkpoint_config=sgd.CheckpointConfig(checkpoint_frequency=5),
                                 failure_config=sgd.FailureConfig(max_failures=1)),
    ).fit()


def test_xgboost_resumes_from_the_last_booster_checkpoint(ray_cluster, cancer, monkeypatch, tmp_path):
    monkeypatch.setenv("SGD_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "1")
    train, test = cancer
    killer = _KillAtIteration(at=12)
    starts = tmp_path / "starts"
    result = _fit(XGBoostTrainer, PARAMS, train, killer, _XGBoostStart(str(starts)))
    assert result.error is None, result.error
    assert killer.killed
    # The second attempt began from a booster checkpoint (xgb_model=), not from scratch: round 10's,
    # the last before the kill, or a later one the workers had already sent (they may run ahead of
    # the driver: on a busy machine rounds 13-15 can be in flight when round 12 is delivered).
    _resumed_from_a_checkpoint(starts, killed_at=12, every=5, rounds=30)
    # The rounds after that checkpoint were boosted again after the restart; sgd hands the
    # callbacks each round once, in order.
    assert killer.iterations == list(range(1, 31))
    model = XGBoostTrainer.get_model(result.checkpoint)
    assert model.num_boosted_rounds() == 30
    # The model of an uninterrupted run (the same as one process's): nothing lost, nothing doubled.
    x, y = train.drop(columns="target"), train["target"]
    single = xgboost.train({**PARAMS, "nthread": 1}, xgboost.QuantileDMatrix(x, y, max_bin=1024), 30)
    dtest = xgboost.DMatrix(test.drop(columns="target"))
    np.testing.assert_allclose(model.predict(dtest), single.predict(dtest), atol=1e-5)


def test_lightgbm_resumes_from_the_last_model_checkpoint(ray_cluster, cancer, monkeypatch, tmp_path):
    monkeypatch.setenv("SGD_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "1")
    train, _ = cancer
    killer = _KillAtIteration(at=7)
    params = {"objective": "binary", "num_leaves": 8, "learning_rate": 0.2, "min_data_in_leaf": 5}
    starts = tmp_path / "starts"
    result = _fit(LightGBMTrainer, params, train, killer, _LightGBMStart(str(starts)), rounds=12)
    assert result.error is None, result.error
    assert killer.killed
    _resumed_from_a_checkpoint(starts, killed_at=7, every=5, rounds=12)  # from a saved model (init_model=)
    assert killer.iterations == list(range(1, 13))
    model = LightGBMTrainer.get_model(result.checkpoint)
    assert model.current_iteration() == 12 and model.num_trees() == 12
