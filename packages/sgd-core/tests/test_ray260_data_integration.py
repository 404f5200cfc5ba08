"""Ray 2.60's ``python/ray/train/v2/tests/test_data_integration.py`` (its public parts) on sgd
(issue 53).

Ray's wheel does not ship its v2 tests, and Ray's repository text stays out of this one: each test
is written anew from Ray's test of the same name (the same scenario, public calls and assertions),
with ``ray.train`` renamed ``sgd`` (issue 53's map); a ``# sgd:`` comment marks every other
difference. Left out (Ray internals): ``test_datasets_callback`` and
``test_v2_no_negative_exclude_resources`` (Ray's ``DatasetsCallback`` / ``DummyWorkerGroup``),
``test_configure_locality`` (mocks a dataset to see ``DataConfig.configure``'s call),
``test_default_ingest_options_inherited_from_context`` (Ray's private
``_resolve_execution_options``), ``test_fixed_scaling_policy_coordinator_lifecycle`` (Ray's
autoscaling coordinator); and, for a short suite, ``test_parquet_file_shuffle_with_executions`` and
the execution-options resource tests (``exclude_resources`` / ``resource_limits``), which check Ray
Data's settings handed through unchanged — ``test_per_dataset_execution_options_*`` check the same
hand-over.
"""

import pytest
import ray
import ray.data
from ray.data import DataContext, ExecutionOptions

import sgd

SHARD = ("issue 53 D: sgd.get_dataset_shard returns a ray Dataset, not Ray 2.60's DataIterator: no get_context(), "
         "so DataConfig(execution_options=...) cannot be seen on the shard")


@pytest.fixture
def ray_start_4_cpus(ray_cluster):
    # sgd: the session's 4-CPU cluster instead of ray.init(num_cpus=4) / ray.shutdown()
    yield ray_cluster


@pytest.fixture
def restore_data_context():  # sgd: was ray.data.tests.conftest's (not public); written anew: undoes the test's key
    yield
    DataContext.get_current().remove_config("foo")


@pytest.mark.parametrize("num_workers", [1, 2])
def test_dataset_sharding_across_workers(ray_start_4_cpus, num_workers):
    NUM_ROWS = 1000
    train_ds = ray.data.range(NUM_ROWS)

    def train_fn():
        with pytest.raises(KeyError):
            sgd.get_dataset_shard("val")
        num_rows = sum(len(batch["id"]) for batch in sgd.get_dataset_shard("train").iter_batches())
        assert num_rows == NUM_ROWS // num_workers

    trainer = sgd.DataParallelTrainer(
        train_fn, datasets={"train": train_ds}, scaling_config=sgd.ScalingConfig(num_workers=num_workers)
    )
    trainer.fit()


@pytest.mark.parametrize("datasets_to_split", ["all", ["train"], []])
def test_multiple_datasets(ray_start_4_cpus, datasets_to_split):
    NUM_ROWS, NUM_WORKERS = 1000, 2

    def train_fn():
        for name in ["train", "val"]:
            num_rows = sum(len(batch["id"]) for batch in sgd.get_dataset_shard(name).iter_batches())
            if datasets_to_split == "all" or name in datasets_to_split:
                assert num_rows == NUM_ROWS // NUM_WORKERS
            else:
                assert num_rows == NUM_ROWS

    trainer = sgd.DataParallelTrainer(
        train_fn,
        datasets={"train": ray.data.range(NUM_ROWS), "val": ray.data.range(NUM_ROWS)},
        dataset_config=sgd.DataConfig(datasets_to_split=datasets_to_split),
        scaling_config=sgd.ScalingConfig(num_workers=NUM_WORKERS),
    )
    trainer.fit()


def test_default_splits_every_dataset(ray_start_4_cpus):
    # sgd: not in Ray's file: Ray 2.60's default (no dataset_config) splits every dataset, which
    # test_multiple_datasets["all"] states only through DataConfig(datasets_to_split="all")
    def train_fn():
        for name in ["train", "val"]:
            assert sum(len(b["id"]) for b in sgd.get_dataset_shard(name).iter_batches()) == 50

    sgd.DataParallelTrainer(
        train_fn, datasets={"train": ray.data.range(100), "val": ray.data.range(100)},
        scaling_config=sgd.ScalingConfig(num_workers=2),
    ).fit()


@pytest.mark.xfail(reason="issue 53 D: sgd's TypeError says 'DataConfig(datasets_to_split=...) takes ...'; Ray's "
                          "'`datasets_to_split` should be ...'", strict=False)
def test_data_config_validation():
    with pytest.raises(TypeError, match="`datasets_to_split` should be.*"):
        sgd.DataConfig(datasets_to_split="hello")
    with pytest.raises(TypeError, match="`datasets_to_split` should be.*"):
        sgd.DataConfig(datasets_to_split={})


@pytest.mark.xfail(reason="issue 53 (no part; D is nearest): the driver's ray.data.DataContext does not reach "
                          "the workers", strict=False)
def test_data_context_propagation(ray_start_4_cpus, restore_data_context):
    DataContext.get_current().set_config("foo", "bar")

    def train_fn():
        assert DataContext.get_current().get_config("foo") == "bar"

    sgd.DataParallelTrainer(
        train_fn, datasets={"train": ray.data.range(2)}, scaling_config=sgd.ScalingConfig(num_workers=2)
    ).fit()


@pytest.mark.parametrize("cache_random_preprocessing", [True, False])
def test_per_epoch_preprocessing(ray_start_4_cpus, cache_random_preprocessing):
    NUM_ROWS, NUM_WORKERS = 32, 2
    ds = ray.data.range(NUM_ROWS, override_num_blocks=NUM_ROWS).random_shuffle()
    if cache_random_preprocessing:
        ds = ds.materialize()  # every epoch then sees the same shuffle

    def train_fn():
        shard = sgd.get_dataset_shard("train")
        epoch_0 = [row["id"] for row in shard.iter_rows()]
        epoch_1 = [row["id"] for row in shard.iter_rows()]
        assert len(epoch_0) == len(epoch_1) == NUM_ROWS // NUM_WORKERS
        if cache_random_preprocessing:
            assert epoch_0 == epoch_1
        else:
            assert epoch_0 != epoch_1, (epoch_0, epoch_1)

    sgd.DataParallelTrainer(
        train_fn, datasets={"train": ds}, scaling_config=sgd.ScalingConfig(num_workers=NUM_WORKERS)
    ).fit()


@pytest.mark.xfail(reason=SHARD, strict=False)
def test_per_dataset_execution_options_single(ray_start_4_cpus):
    execution_options = ExecutionOptions()
    execution_options.preserve_order = True
    execution_options.verbose_progress = True

    def train_fn():
        for name in ("train", "val"):
            options = sgd.get_dataset_shard(name).get_context().execution_options
            assert options.preserve_order is True
            assert options.verbose_progress is True

    sgd.DataParallelTrainer(
        train_fn,
        datasets={"train": ray.data.range(100), "val": ray.data.range(100)},
        dataset_config=sgd.DataConfig(execution_options=execution_options),
        scaling_config=sgd.ScalingConfig(num_workers=2),
    ).fit()


@pytest.mark.xfail(reason=SHARD, strict=False)
def test_per_dataset_execution_options_dict(ray_start_4_cpus):
    train_options = ExecutionOptions()
    train_options.preserve_order = True
    train_options.verbose_progress = True
    train_options.resource_limits = train_options.resource_limits.copy(cpu=4, gpu=2)
    val_options = ExecutionOptions()
    val_options.preserve_order = False
    val_options.verbose_progress = False
    val_options.resource_limits = val_options.resource_limits.copy(cpu=2, gpu=1)

    def train_fn():
        shards = {name: sgd.get_dataset_shard(name) for name in ("train", "val", "test", "test_2")}
        options = {name: shard.get_context().execution_options for name, shard in shards.items()}
        assert options["train"].preserve_order is True and options["train"].verbose_progress is True
        assert options["val"].preserve_order is False and options["val"].verbose_progress is False
        assert (options["train"].resource_limits.cpu, options["train"].resource_limits.gpu) == (4, 2)
        assert (options["val"].resource_limits.cpu, options["val"].resource_limits.gpu) == (2, 1)
        default_options = sgd.DataConfig.default_ingest_options()  # for a dataset not in the dict
        assert options["test"].preserve_order == default_options.preserve_order
        assert options["test"].verbose_progress == default_options.verbose_progress
        assert options["test"].resource_limits == default_options.resource_limits
        assert options["test_2"].preserve_order == options["test"].preserve_order

    sgd.DataParallelTrainer(
        train_fn,
        datasets={name: ray.data.range(100) for name in ("train", "val", "test", "test_2")},
        dataset_config=sgd.DataConfig(execution_options={"train": train_options, "val": val_options}),
        scaling_config=sgd.ScalingConfig(num_workers=2),
    ).fit()
