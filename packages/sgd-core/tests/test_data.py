"""Ray Datasets sharded across the workers."""

import os
import signal

import pytest

import sgd

ray_data = pytest.importorskip("ray.data")


def _epochs(config):
    shard = sgd.get_dataset_shard()
    seen = []
    for _ in range(config["epochs"]):
        seen.append(sorted(int(row["id"]) for row in shard.iter_rows()))
    return seen


def test_each_epoch_covers_the_dataset_exactly_once(base_trainer):
    per_worker = base_trainer.run(_epochs, config={"epochs": 2}, dataset=ray_data.range(10))
    for epoch in range(2):
        parts = [w[epoch] for w in per_worker]
        assert sorted(parts[0] + parts[1]) == list(range(10))
        assert not set(parts[0]) & set(parts[1]) and all(parts)


def test_named_datasets_split_and_whole(base_trainer):
    def train_func():
        train = sorted(int(r["id"]) for r in sgd.get_dataset_shard("train").iter_rows())
        val = sorted(int(r["id"]) for r in sgd.get_dataset_shard("val").iter_rows())
        return train, val

    out = base_trainer.run(
        train_func,
        dataset={"train": ray_data.range(10), "val": ray_data.range(6)},
        dataset_config={"val": sgd.DatasetConfig(split=False)},
    )
    assert sorted(out[0][0] + out[1][0]) == list(range(10))
    assert out[0][1] == out[1][1] == list(range(6))  # every worker sees the whole validation set
    with pytest.raises(ValueError, match="not among the datasets"):
        base_trainer.run(train_func, dataset={"train": ray_data.range(4)},
                         dataset_config={"tain": sgd.DatasetConfig()})
    with pytest.raises(TypeError, match="DatasetConfig"):
        base_trainer.run(train_func, dataset={"train": ray_data.range(4)}, dataset_config={"train": {}})


def test_per_epoch_shuffle(base_trainer):
    def orders(config):
        shard = sgd.get_dataset_shard()
        return [[int(r["id"]) for r in shard.iter_rows()] for _ in range(3)]

    shuffled = base_trainer.run(orders, dataset=ray_data.range(40),
                                dataset_config={"default": sgd.DatasetConfig(shuffle=True)})
    epochs = [shuffled[0][e] + shuffled[1][e] for e in range(3)]
    assert all(sorted(e) == list(range(40)) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1  # a new order each epoch
    plain = base_trainer.run(orders, dataset=ray_data.range(40))
    assert plain[0][0] == plain[0][1] == plain[0][2]


def _killable(config):
    state = sgd.load_checkpoint() or {"epoch": 0}
    shard = sgd.get_dataset_shard()
    for epoch in range(state["epoch"], config["epochs"]):
        rows = sorted(int(r["id"]) for r in shard.iter_rows())
        sgd.report(epoch=epoch, rows=rows, pid=os.getpid(), shard=id(shard))
        sgd.save_checkpoint(epoch=epoch + 1)
    return len(rows)


def _run_killing_rank1_at_epoch_1(trainer, dataset_config=None):
    """Run ``_killable`` over range(10) for 4 epochs, SIGKILLing rank 1 after epoch 1.
    Returns the run's results, how many times the datasets were split, and the rows seen."""
    seen = []

    class KillOnce(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            seen.append([r["rows"] for r in results])
            if results[0]["epoch"] == 1 and not getattr(self, "done", False):
                self.done = True
                os.kill(results[1]["pid"], signal.SIGKILL)

    import sgd._internal.controller as trainer_module  # where runs split their datasets

    made = []
    real = trainer_module.shard_datasets

    def counting(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    trainer_module.shard_datasets = counting
    try:
        out = trainer.run(_killable, config={"epochs": 4}, dataset=ray_data.range(10), callbacks=[KillOnce()],
                          dataset_config=dataset_config)
    finally:
        trainer_module.shard_datasets = real
    return out, len(made), seen


def test_worker_killed_mid_run_finishes_with_full_epochs(base_trainer):
    # The shared trainer: Ray Data's own tasks need free CPUs beside the workers'.
    out, splits, seen = _run_killing_rank1_at_epoch_1(base_trainer)
    assert out == [5, 5]
    # Split at the start and once more for the restarted group: Ray Data's streaming split
    # cannot re-admit consumers once one died at its epoch barrier.
    assert splits == 2
    assert [sorted(a + b) for a, b in seen] == [list(range(10))] * 4


def test_cross_validation_folds(ray_cluster):
    folds = sgd.cross_validation_folds(ray_data.range(12), k=3, seed=1)
    assert len(folds) == 3
    vals = []
    for train, val in folds:
        t = sorted(r["id"] for r in train.iter_rows())
        v = sorted(r["id"] for r in val.iter_rows())
        assert sorted(t + v) == list(range(12)) and not set(t) & set(v)
        vals.append(v)
    assert sorted(x for v in vals for x in v) == list(range(12))  # each row validates once
    with pytest.raises(ValueError, match="k must be"):
        sgd.cross_validation_folds(ray_data.range(4), k=1)


BULK = {"default": sgd.DatasetConfig(streaming=False)}


def test_materialised_split_covers_each_epoch_once(base_trainer):
    per_worker = base_trainer.run(_epochs, config={"epochs": 2}, dataset=ray_data.range(10), dataset_config=BULK)
    for epoch in range(2):
        parts = [w[epoch] for w in per_worker]
        assert sorted(parts[0] + parts[1]) == list(range(10))
        assert len(parts[0]) == len(parts[1]) == 5  # equal shards
    assert per_worker[0][0] == per_worker[0][1]  # the same rows every epoch: a worker keeps its blocks


def test_materialised_split_shuffles_within_shards_each_epoch(base_trainer):
    def orders(config):
        shard = sgd.get_dataset_shard()
        return [[int(r["id"]) for r in shard.iter_rows()] for _ in range(3)]

    out = base_trainer.run(orders, dataset=ray_data.range(60),
                           dataset_config={"default": sgd.DatasetConfig(shuffle=True, streaming=False)})
    for worker in out:
        assert len({tuple(sorted(e)) for e in worker}) == 1  # same rows each epoch...
        assert len({tuple(e) for e in worker}) > 1  # ...in a new order
    assert sorted(out[0][0] + out[1][0]) == list(range(60))
    assert out[0][0] != list(range(30))  # shuffled across workers before the split too


def test_materialised_shards_are_reused_after_a_worker_dies(base_trainer):
    out, splits, seen = _run_killing_rank1_at_epoch_1(base_trainer, BULK)
    assert out == [5, 5]
    assert splits == 1  # split once; the restarted group got the same shards
    assert [sorted(a + b) for a, b in seen] == [list(range(10))] * 4
