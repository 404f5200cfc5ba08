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

    import sgd.group.inputs as trainer_module  # where runs split their datasets

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
    assert splits == 1  # divided once; the restarted group got the same parts
    assert [sorted(a + b) for a, b in seen] == [list(range(10))] * 4


def test_coordinated_split_is_made_again_after_a_worker_dies(base_trainer):
    out, splits, seen = _run_killing_rank1_at_epoch_1(
        base_trainer, {"default": sgd.DatasetConfig(split="coordinated")})
    assert out == [5, 5]
    # Split at the start and once more for the restarted group: Ray Data's streaming split
    # cannot re-admit consumers once one died at its epoch barrier.
    assert splits == 2
    assert [sorted(a + b) for a, b in seen] == [list(range(10))] * 4


def _batches(config):
    """Reads ``config["epochs"]`` epochs in batches of 10, reporting each batch's ids and
    saving the shard's position with every batch; resumes from the checkpoint."""
    shard = sgd.get_dataset_shard()
    state = sgd.load_checkpoint()
    if state is not None:
        shard.load_state_dict(state["data"])
    while shard.epoch < config["epochs"]:
        epoch = shard.epoch
        for batch in shard.iter_batches(batch_size=10):
            sgd.report(epoch=epoch, ids=[int(i) for i in batch["id"]], pid=os.getpid())
            sgd.save_checkpoint(data=shard.state_dict())
    return shard.epoch


def test_killed_mid_epoch_the_restarted_group_reads_the_same_parts(base_trainer):
    dataset = ray_data.range(200, override_num_blocks=8)
    config = {"default": sgd.DatasetConfig(shuffle=True, seed=3)}

    def rounds(callbacks=()):
        seen = []

        class Keep(sgd.TrainingCallback):
            def handle_result(self, results, **info):
                seen.append([(r["epoch"], r["ids"]) for r in results])

        base_trainer.run(_batches, config={"epochs": 2}, dataset=dataset, dataset_config=config,
                         callbacks=[Keep(), *callbacks])
        return seen

    undisturbed = rounds()

    class KillMidEpoch(sgd.TrainingCallback):
        rounds = 0

        def handle_result(self, results, **info):
            self.rounds += 1
            if self.rounds == 4:  # epoch 0, 40 of each worker's 100 rows taken
                os.kill(results[1]["pid"], signal.SIGKILL)

    killed = rounds([KillMidEpoch()])
    assert killed == undisturbed  # every batch once, each worker the same rows in the same order
    for epoch in range(2):
        per_rank = [[i for r in killed for e, ids in [r[rank]] if e == epoch for i in ids] for rank in range(2)]
        assert sorted(per_rank[0] + per_rank[1]) == list(range(200))  # no row lost or read twice
        assert len(per_rank[0]) == len(per_rank[1]) == 100
    first = [i for r in killed for e, ids in [r[0]] if e == 0 for i in ids]
    second = [i for r in killed for e, ids in [r[0]] if e == 1 for i in ids]
    assert first != second  # a new order each epoch


def test_no_row_is_left_out_unless_equal_is_asked_for(base_trainer):
    out = base_trainer.run(_epochs, config={"epochs": 1}, dataset=ray_data.range(17))
    assert sorted(out[0][0] + out[1][0]) == list(range(17))
    assert sorted(len(w[0]) for w in out) == [8, 9]
    equal = base_trainer.run(_epochs, config={"epochs": 1}, dataset=ray_data.range(17),
                             dataset_config={"default": sgd.DatasetConfig(equal=True)})
    assert [len(w[0]) for w in equal] == [8, 8]
    bulk = base_trainer.run(_epochs, config={"epochs": 1}, dataset=ray_data.range(17), dataset_config=BULK)
    assert sorted(bulk[0][0] + bulk[1][0]) == list(range(17))
    coordinated = base_trainer.run(_epochs, config={"epochs": 1}, dataset=ray_data.range(17),
                                   dataset_config={"default": sgd.DatasetConfig(split="coordinated")})
    assert sorted(coordinated[0][0] + coordinated[1][0]) == list(range(17))


def test_a_plan_that_cannot_be_divided(base_trainer, caplog):
    shuffled = ray_data.range(12).random_shuffle(seed=0)
    with caplog.at_level("WARNING", logger="sgd"):
        out = base_trainer.run(_epochs, config={"epochs": 1}, dataset=shuffled)
    assert sorted(out[0][0] + out[1][0]) == list(range(12))
    assert "streaming_split" in caplog.text and "RandomShuffle" in caplog.text
    with pytest.raises(ValueError, match=r"split='parts'\) cannot divide this dataset.*RandomShuffle"):
        base_trainer.run(_epochs, config={"epochs": 1}, dataset=shuffled,
                         dataset_config={"default": sgd.DatasetConfig(split="parts")})
    with pytest.raises(ValueError, match="is not one of True"):
        sgd.DatasetConfig(split="even")


def test_parts_of_in_memory_and_mapped_data(base_trainer):
    items = ray_data.from_items([{"id": i} for i in range(11)])
    mapped = ray_data.range(30, override_num_blocks=3).map_batches(lambda b: {"id": b["id"] * 2})
    for ds, expected in [(items, list(range(11))), (mapped, list(range(0, 60, 2)))]:
        out = base_trainer.run(_epochs, config={"epochs": 2}, dataset=ds)
        for epoch in range(2):
            assert sorted(out[0][epoch] + out[1][epoch]) == expected
            assert abs(len(out[0][epoch]) - len(out[1][epoch])) <= 1


def test_a_block_cut_between_workers_gives_each_row_to_one_worker(base_trainer):
    """In-memory data whose blocks must be cut between two workers: one block of 569 rows
    (from_pandas), blocks of several rows (from_items). Ray's RefBundle.slice only marks the cut,
    which reading ignored: each worker read the whole block."""
    import pandas as pd

    one_block = ray_data.from_pandas(pd.DataFrame({"id": range(569)}))
    items = ray_data.from_items([{"id": i} for i in range(569)])
    for ds in (one_block, items):
        out = base_trainer.run(_epochs, config={"epochs": 1}, dataset=ds)
        first, second = out[0][0], out[1][0]
        assert sorted(first + second) == list(range(569)), (len(first), len(second))
        assert not set(first) & set(second) and abs(len(first) - len(second)) <= 1


def test_fewer_workers_get_the_parts_redivided(ray_cluster):
    from sgd.data import shard_datasets

    ds = ray_data.range(30, override_num_blocks=6)
    for n in (3, 2):  # an elastic group that came back smaller: the same units, dealt anew
        shards = shard_datasets(ds, n)
        parts = [sorted(int(r["id"]) for r in s.iter_rows()) for s in shards]
        assert sorted(sum(parts, [])) == list(range(30)) and {len(p) for p in parts} == {30 // n}
    three = shard_datasets(ds, 3)[0]
    two = shard_datasets(ds, 2)[0]
    next(iter(three.iter_batches(batch_size=5)))
    assert three.state_dict() == {"epoch": 0, "rows": 5, "parts": 3}
    with pytest.warns(RuntimeWarning, match="saved with 3 workers and this group has 2"):
        two.load_state_dict(three.state_dict())
    assert two.epoch == 0 and len(list(two.iter_rows())) == 15  # the epoch from its start


def test_each_iteration_of_an_iter_call_is_an_epoch(ray_cluster):
    from sgd.data import shard_datasets

    shard = shard_datasets(ray_data.range(20), 2, {"default": sgd.DatasetConfig(shuffle=True, seed=0)})[0]
    batches = shard.iter_batches(batch_size=4)  # Lightning iterates one such object every epoch
    first = [int(i) for b in batches for i in b["id"]]
    second = [int(i) for b in batches for i in b["id"]]
    assert len(first) == len(second) == 10 and first != second and shard.epoch == 2


def test_every_cpu_taken_fails_fast_naming_the_fix(ray_cluster):
    import time

    import ray

    # Every CPU no placement group holds (the module's shared trainer may hold some; Ray Data
    # tasks of earlier tests may still be finishing, so not what is available this instant).
    groups = ray.util.placement_group_table().values()
    held = sum(b.get("CPU", 0) for g in groups if g["state"] == "CREATED" for b in g["bundles"].values())
    free = int(ray_cluster["CPU"] - held)
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=free)
    trainer.start()
    try:
        t = time.monotonic()
        with pytest.raises(sgd.ResourcesUnavailableError, match="Leave a CPU free"):
            trainer.run(_epochs, config={"epochs": 1}, dataset=ray_data.range(4))
        assert time.monotonic() - t < 30
        assert trainer.run(lambda: 1) == [1] * free  # the trainer still works
    finally:
        trainer.shutdown()


def test_cross_validation_folds(ray_cluster):
    for rows, k in [(12, 3), (30, 3), (31, 4)]:
        folds = sgd.cross_validation_folds(ray_data.range(rows), k=k, seed=1)
        assert len(folds) == k
        vals = []
        for train, val in folds:
            t = sorted(r["id"] for r in train.iter_rows())
            v = sorted(r["id"] for r in val.iter_rows())
            assert sorted(t + v) == list(range(rows)) and not set(t) & set(v)
            vals.append(v)
        assert sorted(x for v in vals for x in v) == list(range(rows))  # each row validates once
        assert max(map(len, vals)) - min(map(len, vals)) <= 1  # balanced folds
    with pytest.raises(ValueError, match="k must be"):
        sgd.cross_validation_folds(ray_data.range(4), k=1)
    with pytest.raises(ValueError, match="3 folds need at least 3 rows"):
        sgd.cross_validation_folds(ray_data.range(2), k=3)


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


_WITHOUT_AIOHTTP = r'''
import sys
import pyarrow as pa, pyarrow.parquet as pq, ray, ray.data
import sgd

folder = sys.argv[1]
for f in range(32):  # 16 files a part: Ray Data resolves them in 8 threads
    pq.write_table(pa.table({"id": list(range(f * 10, (f + 1) * 10))}), f"{folder}/part-{f:02d}.parquet")
ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)

def train_func():  # every epoch lists the part's files again: 8 listings in all
    shard = sgd.get_dataset_shard()
    epochs = [sorted(int(row["id"]) for row in shard.iter_rows()) for _ in range(4)]
    assert all(e == epochs[0] for e in epochs), "the parts changed between epochs"
    return epochs[0]

trainer = sgd.Trainer(backend="base", num_workers=2)
trainer.start()
try:
    out = trainer.run(train_func, dataset=ray.data.read_parquet(folder))
finally:
    trainer.shutdown()
    ray.shutdown()
assert sorted(out[0] + out[1]) == list(range(320)), out
assert len(out[0]) == len(out[1]) == 160
print("PARTS-OK")
'''


def test_parquet_parts_without_aiohttp(tmp_path):
    """Without ``aiohttp``, Ray Data fails to list an explicit list of files in threads (the
    racy ``HTTPFileSystem`` import); a part of a Parquet directory is such a list. A fresh
    Ray cluster whose processes cannot import ``aiohttp`` reads the parts all the same."""
    import subprocess
    import sys

    shadow = tmp_path / "shadow" / "aiohttp"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'aiohttp'\", name='aiohttp')\n")
    data = tmp_path / "data"
    data.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(shadow.parent),
                                                                     os.environ.get("PYTHONPATH")])))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_AIOHTTP, str(data)], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0 and "PARTS-OK" in proc.stdout, proc.stderr[-3000:]


def test_a_part_starts_the_footer_readers_its_files_need(ray_cluster, tmp_path):
    """Ray Data's Parquet listing starts a pool of footer-reading actors (32 by default) for
    every listing, and gives them the files 10 at a time: a part of 16 files asks for 2."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sgd._common.data_parts import _chain, _listing_indexer

    for f in range(4):
        pq.write_table(pa.table({"id": [f]}), tmp_path / f"part-{f}.parquet")
    indexer = _chain(ray_data.read_parquet(str(tmp_path)))[0].file_indexer
    if not hasattr(indexer, "_num_actors"):
        pytest.skip(f"this Ray's Parquet listing has no footer actors ({type(indexer).__name__})")
    assert indexer._num_actors > 2
    part = _listing_indexer(indexer, 16)
    assert (part._num_actors, part._max_inflight_batches) == (2, 4)
    assert _listing_indexer(indexer, 1)._num_actors == 1
    assert indexer._num_actors > 2  # the dataset's own indexer is unchanged
