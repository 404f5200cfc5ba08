"""The AIR-style TensorflowTrainer: same shape as TorchTrainer, TF_CONFIG set on every worker."""

import json
import os

import pytest

import sgd
from sgd import RunConfig, ScalingConfig


def loop(config):
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        v = tf.Variable(1.0)

    @tf.function
    def step():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce("SUM", v * float(sgd.world_rank() + 1))

    total = strategy.run(step)
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    sgd.report({"replicas": strategy.num_replicas_in_sync, "task": task["index"],
                "sum": float(strategy.experimental_local_results(total)[0]), "lr": config["lr"]})


def test_tensorflow_trainer_fit(ray_cluster, tmp_path):
    from sgd_tensorflow import TensorflowTrainer

    result = TensorflowTrainer(loop, {"lr": 0.5}, ScalingConfig(num_workers=2),
                               run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.error is None, result.error
    rows = [json.loads(x) for x in open(os.path.join(result.path, "results.jsonl"))]
    assert [w["task"] for w in rows[0]] == [0, 1]
    assert result.metrics["replicas"] == 2 and result.metrics["lr"] == 0.5
    assert result.metrics["sum"] == pytest.approx(3.0)  # 1*1 + 1*2 across the two workers


def test_tensorflow_trainer_rejects_another_config():
    from sgd_tensorflow import TensorflowTrainer

    with pytest.raises(TypeError, match="TensorflowConfig"):
        TensorflowTrainer(loop, tensorflow_config=sgd.BackendConfig())
