"""Helpers for the training function: datasets."""

from __future__ import annotations

from typing import Optional

import tensorflow as tf


def _session_has_ray_data_shard() -> bool:
    from sgd.session import get_session

    session = get_session()
    shard = getattr(session, "dataset_shard", None) if session is not None else None
    shards = shard.values() if isinstance(shard, dict) else [shard]
    # A Ray Dataset passed to Trainer.run reaches each worker as its own streaming split.
    return any(s is not None and type(s).__module__.startswith(("ray.data", "sgd.data")) for s in shards)


def prepare_dataset_shard(tf_dataset_shard: tf.data.Dataset, already_sharded: Optional[bool] = None) -> tf.data.Dataset:
    """Make a ``tf.data.Dataset`` ready for ``MultiWorkerMirroredStrategy``.

    ``MultiWorkerMirroredStrategy`` shards every dataset across the workers itself
    (``AutoShardPolicy.AUTO``). Data that sgd already split (a Ray Dataset passed to
    ``Trainer.run``, read here through ``sgd.get_dataset_shard()``) must not be split
    again, so auto-sharding is turned off for it; other datasets are left as they are,
    and TensorFlow shards them.

    :param tf_dataset_shard: this worker's dataset.
    :param already_sharded: whether the data is this worker's part already; ``None``
        means "when the current run was given a Ray Dataset".
    :returns: the dataset, with auto-sharding off when it was already sharded.
    """
    if already_sharded is None:
        already_sharded = _session_has_ray_data_shard()
    if not already_sharded:
        return tf_dataset_shard
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf_dataset_shard.with_options(options)
