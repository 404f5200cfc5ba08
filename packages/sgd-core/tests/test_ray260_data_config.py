"""sgd.DataConfig on a real cluster (issue 53): Ray Train 2.60 splits every dataset by default;
``datasets_to_split`` names the split ones; an AIR dict of DatasetConfig keeps AIR's rule; the
split is sgd's deterministic one."""

import pytest
import ray

import sgd
from sgd import DataConfig, DataParallelTrainer, DatasetConfig, RunConfig, ScalingConfig


def count_rows(config):
    counts = {}
    for name in config["names"]:
        shard = sgd.get_dataset_shard(name)
        counts[name] = sum(len(b["id"]) for b in shard.iter_batches(batch_size=3))
    sgd.report(counts)


def per_worker_counts(tmp_path, name, **kwargs):
    datasets = {"train": ray.data.range(8), "valid": ray.data.range(10)}
    seen = []

    class Keep(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            seen.append([{k: r[k] for k in ("train", "valid")} for r in results])

    DataParallelTrainer(count_rows, train_loop_config={"names": ["train", "valid"]},
                        scaling_config=ScalingConfig(num_workers=2), datasets=datasets,
                        run_config=RunConfig(name=name, storage_path=str(tmp_path), callbacks=[Keep()]),
                        **kwargs).fit()
    return seen[-1]


def test_every_dataset_is_split_by_default(ray_cluster, tmp_path):
    assert per_worker_counts(tmp_path, "default") == [{"train": 4, "valid": 5}, {"train": 4, "valid": 5}]


def test_datasets_to_split_gives_the_others_whole(ray_cluster, tmp_path):
    got = per_worker_counts(tmp_path, "only_train", dataset_config=DataConfig(datasets_to_split=["train"]))
    assert got == [{"train": 4, "valid": 10}, {"train": 4, "valid": 10}]


def test_an_air_dict_of_dataset_configs_keeps_airs_rule(ray_cluster, tmp_path):
    got = per_worker_counts(tmp_path, "air", dataset_config={"train": DatasetConfig(shuffle=False)})
    assert got == [{"train": 4, "valid": 10}, {"train": 4, "valid": 10}]


def test_a_bad_name_fails_before_any_worker_starts(ray_cluster, tmp_path):
    trainer = DataParallelTrainer(count_rows, train_loop_config={"names": []},
                                  datasets={"train": ray.data.range(4)},
                                  dataset_config=DataConfig(datasets_to_split=["train", "validation"]),
                                  run_config=RunConfig(name="bad", storage_path=str(tmp_path)))
    with pytest.raises(ValueError, match=r"\['validation'\], which are not among the trainer's datasets"):
        trainer.fit()


def test_execution_options_reach_the_workers_shards(ray_cluster, tmp_path):
    from ray.data import ExecutionOptions

    def loop():
        rows = [r["id"] for r in sgd.get_dataset_shard("train").iter_rows()]
        sgd.report({"rows": rows})

    config = DataConfig(execution_options=ExecutionOptions(preserve_order=True))
    result = DataParallelTrainer(loop, datasets={"train": ray.data.range(6).map(lambda r: r)},
                                 dataset_config=config, scaling_config=ScalingConfig(num_workers=1),
                                 run_config=RunConfig(name="opts", storage_path=str(tmp_path))).fit()
    assert result.metrics["rows"] == list(range(6))
