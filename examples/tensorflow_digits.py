"""A Keras classifier on scikit-learn's 8x8 digits with sgd's TensorFlow backend.

Mirrors Ray Train 1.x's ``tensorflow_mnist_example.py`` with the digits set in place of MNIST
(no download): ``TF_CONFIG`` is set on every worker by the ``"tensorflow"`` backend, the model is
built under ``tf.distribute.MultiWorkerMirroredStrategy``, and ``sgd_tensorflow``'s Keras
callback reports each epoch (Ray 1.x used ``train.report`` in a ``TrainReportCallback``)::

    python examples/tensorflow_digits.py                  # 2 workers, 5 epochs
    python examples/tensorflow_digits.py --smoke-test     # quick mode (used by the tests)
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional

from sgd import Trainer


def train_func(config: Dict) -> List[float]:
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    import sgd_tensorflow

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    per_worker_batch = config["batch_size"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = per_worker_batch * strategy.num_replicas_in_sync
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).repeat().batch(global_batch)
    with strategy.scope():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([
            tf.keras.Input((64,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ])
        model.compile(optimizer=tf.keras.optimizers.Adam(config["lr"]),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(dataset, epochs=config["epochs"], steps_per_epoch=config["steps_per_epoch"], verbose=0,
                        callbacks=[sgd_tensorflow.ReportCheckpointCallback(metrics=["loss", "accuracy"])])
    accuracy = float(np.mean(np.argmax(model.predict(x, verbose=0), axis=1) == y))
    return history.history["loss"] + [accuracy]


def train_tensorflow_digits(num_workers: int = 2, epochs: int = 5, steps_per_epoch: int = 30) -> List[List[float]]:
    trainer = Trainer(backend="tensorflow", num_workers=num_workers)
    trainer.start()
    try:
        results = trainer.run(train_func, config={"lr": 1e-2, "batch_size": 32, "epochs": epochs,
                                                  "steps_per_epoch": steps_per_epoch})
    finally:
        trainer.shutdown()
    print("losses and final accuracy per worker:", results)
    return results


def main(argv: Optional[List[str]] = None) -> List[List[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", "-n", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--smoke-test", action="store_true", help="quick mode: 2 epochs of 20 steps")
    args = parser.parse_args(argv)
    if args.smoke_test:
        return train_tensorflow_digits(num_workers=2, epochs=2, steps_per_epoch=20)
    return train_tensorflow_digits(args.num_workers, args.epochs)


if __name__ == "__main__":
    main(sys.argv[1:])
