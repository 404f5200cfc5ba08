"""The TensorFlow backend on real workers: TF_CONFIG, a synchronised 2-worker Keras fit,
checkpoints that load on the driver, datasets, a single worker, and a worker killed mid-fit."""

import json
import os

import numpy as np
import pytest

import sgd
from sgd_tensorflow import TensorflowConfig
from sgd_testing import KillWorker


@pytest.fixture(scope="module")
def tf_trainer(tmp_path_factory):
    """One started 2-worker TensorFlow trainer for the module (TensorFlow imports are slow)."""
    from sgd_testing.fixtures import _start_local_ray

    _start_local_ray()
    trainer = sgd.Trainer(backend="tensorflow", num_workers=2, logdir=tmp_path_factory.mktemp("tensorflow"))
    trainer.start()
    yield trainer
    trainer.shutdown()


def _data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32"))[:, None]
    return x, y


def _model(tf):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    return model


def test_tf_config_on_every_worker(tf_trainer):
    def read_env():
        return json.loads(os.environ["TF_CONFIG"]), os.environ.get("TF_USE_LEGACY_KERAS")

    results = tf_trainer.run(read_env)
    configs = [c for c, _ in results]
    assert configs[0]["cluster"] == configs[1]["cluster"]
    assert len(configs[0]["cluster"]["worker"]) == 2
    assert len(set(configs[0]["cluster"]["worker"])) == 2
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    # tf-keras is installed here, so use_legacy_keras=None switches the workers to it.
    assert [legacy for _, legacy in results] == ["1", "1"]


def test_two_worker_fit_is_synchronised_and_checkpoints_load(tf_trainer):
    def train_func(config):
        import tensorflow as tf

        import sgd_tensorflow

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = _model(tf)
        x, y = _data()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
        history = model.fit(ds, epochs=config["epochs"], verbose=0, callbacks=[
            sgd_tensorflow.ReportCheckpointCallback(metrics=["loss"], checkpoint_on="epoch_end")])
        sgd.save_checkpoint(model=model)
        return history.history["loss"], model.get_weights(), tf.keras.__name__

    rounds = []
    it = tf_trainer.run_iterator(train_func, config={"epochs": 3})
    rounds.extend(it)
    returns = it.get_final_results()

    losses = [r[0]["loss"] for r in rounds]
    assert [r[0]["epoch"] for r in rounds] == [0, 1, 2]
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    assert [r[1]["loss"] for r in rounds] == losses  # the loss is the global (all-reduced) one
    assert returns[0][2].startswith("tf_keras")
    for w0, w1 in zip(returns[0][1], returns[1][1]):
        np.testing.assert_array_equal(w0, w1)

    # The last checkpoint holds the model, rebuilt on the driver with the trained weights;
    # the one before it the epoch-end weights as numpy arrays.
    model = tf_trainer.latest_checkpoint["model"]
    for w, trained in zip(model.get_weights(), returns[0][1]):
        np.testing.assert_array_equal(w, trained)
    x, _ = _data(8)
    assert model.predict(x, verbose=0).shape == (8, 1)
    paths = sorted(tf_trainer.latest_checkpoint_dir.glob("checkpoint_*"))
    epoch_end = sgd.Trainer.load_checkpoint_from_path(paths[-2])
    assert epoch_end["epoch"] == 3
    assert all(isinstance(w, np.ndarray) for w in epoch_end["weights"])
    for w, trained in zip(epoch_end["weights"], returns[0][1]):
        np.testing.assert_array_equal(w, trained)


def test_prepare_dataset_shard(tf_trainer):
    import ray

    def policies(config=None):
        import tensorflow as tf

        from sgd_tensorflow import prepare_dataset_shard

        ds = prepare_dataset_shard(tf.data.Dataset.range(8), (config or {}).get("already_sharded"))
        return tf.data.experimental.AutoShardPolicy(ds.options().experimental_distribute.auto_shard_policy).name

    # No Ray Dataset: TensorFlow keeps sharding by itself; data sharded by sgd: off.
    assert tf_trainer.run(policies) == ["AUTO"] * 2
    assert tf_trainer.run(policies, config={"already_sharded": True}) == ["OFF"] * 2

    def from_ray_data():
        rows = [r["id"] for r in sgd.get_dataset_shard().iter_rows()]
        return policies(), len(rows)

    results = tf_trainer.run(from_ray_data, dataset=ray.data.range(8))
    assert [r[0] for r in results] == ["OFF"] * 2
    assert sum(r[1] for r in results) == 8


def test_single_worker_without_strategy(ray_cluster):
    def train_func():
        import tensorflow as tf

        import sgd_tensorflow

        model = _model(tf)
        x, y = _data(64)
        history = model.fit(x, y, epochs=2, batch_size=16, verbose=0,
                            callbacks=[sgd_tensorflow.ReportCheckpointCallback()])
        return history.history["loss"]

    trainer = sgd.Trainer(backend=TensorflowConfig(), num_workers=1)
    trainer.start()
    try:
        results = trainer.run(train_func)
    finally:
        trainer.shutdown()
    assert len(results) == 1 and len(results[0]) == 2


def test_worker_killed_mid_fit_resumes_from_last_weights(ray_cluster):
    def train_func(config):
        import tensorflow as tf

        import sgd_tensorflow

        class AddPid(tf.keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                logs["pid"] = os.getpid()  # the next callback reports the same logs dict

        state = sgd.load_checkpoint()
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = _model(tf)
        if state:
            model.set_weights(state["weights"])
        x, y = _data()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
        initial_epoch = state["epoch"] if state else 0
        history = model.fit(ds, epochs=config["epochs"], initial_epoch=initial_epoch, verbose=0, callbacks=[
            AddPid(), sgd_tensorflow.ReportCheckpointCallback(checkpoint_on="epoch_end")])
        return initial_epoch, history.history["loss"], model.get_weights()

    killer = KillWorker(at=1)
    trainer = sgd.Trainer(backend="tensorflow", num_workers=2, max_retries=2)
    trainer.start()
    try:
        results = trainer.run(train_func, config={"epochs": 4}, callbacks=[killer])
    finally:
        trainer.shutdown()
    assert killer.killed
    assert killer.values("epoch") == [0, 1, 2, 3]  # every epoch delivered once, in order
    initial_epoch, losses, weights = results[0]
    assert initial_epoch >= 1  # resumed from a checkpoint, not from scratch
    assert len(losses) == 4 - initial_epoch
    assert results[1][0] == initial_epoch
    for w0, w1 in zip(weights, results[1][2]):
        np.testing.assert_array_equal(w0, w1)


def test_keras3_custom_loop_with_strategy_run(ray_cluster):
    """use_legacy_keras=False keeps Keras 3; a custom loop over strategy.run synchronises."""

    def train_func():
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            tf.keras.utils.set_random_seed(0)
            model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
            opt = tf.keras.optimizers.SGD(0.05)
        x, y = _data(64, seed=sgd.world_rank())  # different data per worker
        ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))

        @tf.function
        def step(xb, yb):
            def replica(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2) / strategy.num_replicas_in_sync
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            return strategy.reduce("SUM", strategy.run(replica, args=(xb, yb)), axis=None)

        for epoch in range(2):
            total = sum(float(step(xb, yb)) for xb, yb in ds)
            sgd.report(epoch=epoch, loss=total)
        return tf.keras.__name__, model.get_weights()

    trainer = sgd.Trainer(backend=TensorflowConfig(use_legacy_keras=False), num_workers=2)
    trainer.start()
    try:
        results = trainer.run(train_func)
    finally:
        trainer.shutdown()
    assert [r[0].startswith("keras") for r in results] == [True, True]  # Keras 3, not tf_keras
    for w0, w1 in zip(results[0][1], results[1][1]):
        np.testing.assert_array_equal(w0, w1)
