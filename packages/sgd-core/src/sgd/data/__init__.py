"""Datasets for training runs: how each dataset passed to ``Trainer.run`` reaches the workers.

A Ray Dataset is **divided** by default: its plan's source (the read tasks of a datasource,
the files of a file read, the blocks of in-memory data) is dealt out among the workers, and
each worker executes its own part (the source cut to its units, the maps above unchanged)
with its own Ray Data executor, streaming, with no actor between the workers and the blocks.
Every epoch (each pass a worker makes over its shard) covers the dataset exactly once across
the workers. The parts are a function of the dataset, the number of workers, the rank and
the epoch only, so a restarted group gets the same parts, and a shard's position
(:meth:`DatasetShard.state_dict`) can be saved in a checkpoint and resumed.

A plan that cannot be divided (a shuffle, sort or other operation over the whole dataset
after its source) goes through Ray Data's ``streaming_split`` (``split="coordinated"``), as
Ray Train does. ``DatasetConfig(streaming=False)`` materialises the dataset once in Ray's
object store and splits its blocks. Anything that is not a Ray Dataset (a list, a torch
``Dataset``...) is given whole to every worker.

Re-exports only; the code is in the submodules, one concept each: ``config``
(:class:`DatasetConfig`), ``data_config`` (:class:`DataConfig`, Ray Train 2.60's), ``shard``
(:class:`DatasetShard`), ``split`` (:func:`shard_datasets`), ``cpus`` (:func:`data_cpu_shortfall`),
``folds`` (:func:`cross_validation_folds`). The public classes keep ``sgd.data`` as their
``__module__`` (shards are pickled to the workers, and ``air_trainer.json`` names ``DatasetConfig``).
"""

from sgd.data.config import DatasetConfig
from sgd.data.cpus import data_cpu_shortfall
from sgd.data.data_config import TRAIN_DATASET_KEY, DataConfig
from sgd.data.folds import cross_validation_folds
from sgd.data.shard import DatasetShard
from sgd.data.split import shard_datasets, shards_survive_restart

__all__ = [
    "TRAIN_DATASET_KEY",
    "DataConfig",
    "DatasetConfig",
    "DatasetShard",
    "cross_validation_folds",
    "data_cpu_shortfall",
    "shard_datasets",
    "shards_survive_restart",
]
