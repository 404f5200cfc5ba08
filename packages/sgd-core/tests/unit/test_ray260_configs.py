"""Ray Train 2.60's config fields (issue 53): ScalingConfig, RunConfig, FailureConfig,
LoggingConfig, DataConfig, and the storage of RunConfig(storage_filesystem=...). No Ray."""

import logging
import pickle
from types import SimpleNamespace

import pyarrow.fs as pafs
import pytest

import sgd
from sgd import DataConfig, DatasetConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from sgd.air.config_fields import check_ray_settings, storage_location
from sgd.checkpoint.storage import filesystem_of, filesystem_uri, storage_for
from sgd.data.data_config import split_configs

AIR_RULES = sgd.DataParallelTrainer._dataset_config


# --- ScalingConfig -------------------------------------------------------------------


def test_accelerator_type_reserves_rays_accelerator_resource_per_worker():
    sc = ScalingConfig(num_workers=2, use_gpu=True, accelerator_type="A100")
    assert sc.resources_per_worker_resolved == {"CPU": 1, "GPU": 1, "accelerator_type:A100": 0.001}
    assert sc.total_resources == {"CPU": 2, "GPU": 2, "accelerator_type:A100": 0.002}
    assert sc.additional_resources_per_worker == {"accelerator_type:A100": 0.001}


def test_make_trainer_gives_the_workers_the_accelerator_resource(tmp_path):
    trainer = sgd.DataParallelTrainer(
        lambda: None, scaling_config=ScalingConfig(num_workers=2, accelerator_type="H100"),
        run_config=RunConfig(name="acc", storage_path=str(tmp_path))).make_trainer()
    assert trainer.resources_per_worker["accelerator_type:H100"] == 0.001
    assert trainer.resources_per_worker["CPU"] == 1


def test_scaling_config_views_match_ray_names():
    sc = ScalingConfig(num_workers=(2, 4), resources_per_worker={"CPU": 2, "custom": 1})
    assert sc.elasticity_enabled and sc.min_workers == 2 and sc.max_workers == 4
    assert sc.total_resources == {"CPU": 8, "custom": 4}  # an upper bound: max_workers
    assert sc.num_cpus_per_worker == 2 and sc.num_gpus_per_worker == 0 and sc.num_tpus_per_worker == 0
    fixed = ScalingConfig(num_workers=3)
    assert not fixed.elasticity_enabled and fixed.min_workers == fixed.max_workers == 3


@pytest.mark.parametrize("selector, workers", [({"market-type": "spot"}, 2), ([{"a": "1"}, {"a": "2"}], 2)])
def test_label_selector_accepted_as_ray_checks_it_and_refused_at_fit(selector, workers):
    sc = ScalingConfig(num_workers=workers, label_selector=selector)
    assert len(sc.label_selector_per_worker(workers)) == workers
    with pytest.raises(ValueError, match="label_selector=.*not supported by sgd yet.*resources_per_worker"):
        check_ray_settings(sc, RunConfig())


@pytest.mark.parametrize("selector", [[{"a": "1"}], {"a": 1}, "a=1"])
def test_bad_label_selector_is_a_clear_error(selector):
    with pytest.raises(ValueError, match="label_selector"):
        ScalingConfig(num_workers=2, label_selector=selector)


def test_tpu_fields():
    one = ScalingConfig(num_workers=1, use_tpu=True)
    assert one.resources_per_worker_resolved == {"CPU": 1, "TPU": 1}
    check_ray_settings(one, RunConfig())  # one TPU host per worker is fine
    with pytest.raises(ValueError, match="multi-host TPU slice"):
        check_ray_settings(ScalingConfig(num_workers=4, use_tpu=True, topology="2x2x2"), RunConfig())
    with pytest.raises(ValueError, match="use_gpu=True and use_tpu=True"):
        ScalingConfig(use_gpu=True, use_tpu=True)
    with pytest.raises(ValueError, match="use_tpu=False"):
        ScalingConfig(resources_per_worker={"TPU": 1})
    with pytest.raises(ValueError, match="topology"):
        ScalingConfig(topology="4x4")


def test_elastic_interval_and_accelerator_checked():
    assert ScalingConfig(elastic_resize_monitor_interval_s=5).elastic_resize_monitor_interval_s == 5
    with pytest.raises(ValueError, match="elastic_resize_monitor_interval_s"):
        ScalingConfig(elastic_resize_monitor_interval_s=-1)
    with pytest.raises(ValueError, match="accelerator_type"):
        ScalingConfig(accelerator_type="")


# --- FailureConfig -------------------------------------------------------------------


def test_failure_config_has_ray_260_fields_with_rays_defaults():
    fc = FailureConfig()
    assert (fc.controller_failure_limit, fc.max_preemption_failures) == (-1, -1)
    assert fc.relax_collectives_on_preemption is False and fc.preemption_grace_s == 0.0
    FailureConfig(controller_failure_limit=3, max_preemption_failures=0, preemption_grace_s=2.5)
    for bad in (dict(controller_failure_limit=-2), dict(max_preemption_failures=1.5),
                dict(preemption_grace_s=-1), dict(relax_collectives_on_preemption="yes")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FailureConfig(**bad)


def test_fail_fast_as_air_had_it():
    FailureConfig(fail_fast=True)
    FailureConfig(fail_fast="raise")
    with pytest.raises(ValueError, match="max_failures must be 0 with fail_fast"):
        FailureConfig(fail_fast=True, max_failures=2)
    with pytest.raises(ValueError, match="fail_fast must be"):
        FailureConfig(fail_fast="sometimes")


# --- RunConfig ------------------------------------------------------------------------


def test_logging_config():
    assert LoggingConfig("debug").log_level == "DEBUG"
    with pytest.raises(ValueError, match="not a logging level"):
        LoggingConfig("LOUD")
    with pytest.raises(TypeError, match="LoggingConfig"):
        RunConfig(logging_config="DEBUG")


def test_logging_config_sets_sgds_logger_level(tmp_path):
    logger = logging.getLogger("sgd")
    before = logger.level
    try:
        sgd.DataParallelTrainer(lambda: None, run_config=RunConfig(
            name="log", storage_path=str(tmp_path), logging_config=LoggingConfig("WARNING"))).make_trainer()
        assert logger.level == logging.WARNING
    finally:
        logger.setLevel(before)


def test_worker_runtime_env_refused_at_fit_with_what_to_do():
    RunConfig(worker_runtime_env={})  # Ray's default: nothing asked
    with pytest.raises(ValueError, match=r"worker_runtime_env=.*ray.init\(runtime_env=...\)"):
        check_ray_settings(ScalingConfig(), RunConfig(worker_runtime_env={"env_vars": {"A": "1"}}))
    with pytest.raises(TypeError, match="worker_runtime_env"):
        RunConfig(worker_runtime_env=["pip"])


def test_storage_filesystem_checked():
    fs = pafs.LocalFileSystem()
    with pytest.raises(ValueError, match="needs storage_path"):
        RunConfig(storage_filesystem=fs)
    with pytest.raises(ValueError, match="without the URI prefix.*'bucket/runs'"):
        RunConfig(storage_filesystem=fs, storage_path="s3://bucket/runs")
    with pytest.raises(TypeError, match="pyarrow.fs.FileSystem"):
        RunConfig(storage_filesystem="s3", storage_path="bucket/runs")


def test_storage_filesystem_becomes_a_storage_uri_of_that_object(tmp_path):
    local = pafs.LocalFileSystem()
    assert storage_location(str(tmp_path), local) == str(tmp_path)  # a local folder, as it is
    fs = pafs.SubTreeFileSystem(str(tmp_path), local)
    uri = storage_location("runs", fs)
    assert uri.startswith("sgdfs-") and uri.endswith("://runs")
    assert storage_location("other", fs).split("://")[0] == uri.split("://")[0]  # same object, same scheme
    assert filesystem_of(uri) is fs and isinstance(filesystem_of(str(tmp_path)), pafs.LocalFileSystem)
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.txt").write_text("weights")
    storage = storage_for(f"{uri}/exp/checkpoint_000001")
    storage.upload_dir(str(src), f"{uri}/exp/checkpoint_000001")
    assert (tmp_path / "runs" / "exp" / "checkpoint_000001" / "model.txt").read_text() == "weights"
    back = tmp_path / "back"
    storage.download_dir(f"{uri}/exp/checkpoint_000001", str(back))
    assert (back / "model.txt").read_text() == "weights"
    assert filesystem_uri(fs, "x") == uri.split("://")[0] + "://x"


# --- DataConfig -------------------------------------------------------------------------


def test_data_config_default_splits_every_dataset():
    configs = split_configs(DataConfig(), AIR_RULES, {"train": 1, "valid": 2, "test": 3})
    assert {n: c.split for n, c in configs.items()} == {"train": True, "valid": True, "test": True}
    assert configs["train"].fit and not configs["valid"].fit  # the preprocessor rules stay AIR's


def test_data_config_splits_only_the_named_datasets():
    configs = split_configs(DataConfig(datasets_to_split=["train"]), AIR_RULES, {"train": 1, "valid": 2})
    assert configs["train"].split is True and configs["valid"].split is False
    assert configs["train"].equal is True  # Ray's split: the same number of rows on every worker


def test_data_config_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"names \['vaild'\], which are not among the trainer's datasets"):
        split_configs(DataConfig(datasets_to_split=["train", "vaild"]), AIR_RULES, {"train": 1, "valid": 2})
    with pytest.raises(TypeError, match="'all' or a list of dataset names"):
        DataConfig(datasets_to_split="train")


def test_trainer_default_is_ray_260s_and_an_air_dict_keeps_airs_meaning():
    datasets = {"train": [1, 2], "valid": [3]}
    default = sgd.DataParallelTrainer(lambda: None, datasets=datasets)
    assert {n: c.split for n, c in default.dataset_configs().items()} == {"train": True, "valid": True}
    air = sgd.DataParallelTrainer(lambda: None, datasets=datasets, dataset_config={"train": DatasetConfig()})
    assert {n: c.split for n, c in air.dataset_configs().items()} == {"train": True, "valid": False}
    with pytest.raises(TypeError, match="sgd.DataConfig or a dict"):
        sgd.DataParallelTrainer(lambda: None, datasets=datasets, dataset_config=["train"])


def test_data_config_subclass_with_configure_refused():
    class Mine(DataConfig):
        def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
            return []

    with pytest.raises(ValueError, match="overrides DataConfig.configure"):
        split_configs(Mine(), AIR_RULES, {"train": 1})


def test_data_config_execution_options_per_dataset():
    opts = SimpleNamespace(preserve_order=True)  # Ray Data's ExecutionOptions in the Ray tier
    config = DataConfig(execution_options={"train": opts})
    got = config.execution_options_for("train")
    assert got.preserve_order is True and got is not opts
    assert config.execution_options_for("valid") is None
    assert DataConfig(execution_options=opts).execution_options_for("anything").preserve_order is True


def test_configs_pickle():
    for value in (DataConfig(["a"]), LoggingConfig("DEBUG"), FailureConfig(controller_failure_limit=1),
                  ScalingConfig(accelerator_type="A100", label_selector={"a": "b"})):
        assert pickle.loads(pickle.dumps(value)) == value


# --- Ray Train 2.60's environment variables -----------------------------------------------


def test_rays_worker_group_start_timeout_is_sgds_placement_timeout(monkeypatch):
    from sgd._common.placement import placement_timeout_s

    monkeypatch.delenv("SGD_PLACEMENT_TIMEOUT_S", raising=False)
    monkeypatch.delenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", raising=False)
    assert placement_timeout_s() == 120.0
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "45")
    assert placement_timeout_s() == 45.0
    monkeypatch.setenv("SGD_PLACEMENT_TIMEOUT_S", "30")  # sgd's own name wins
    assert placement_timeout_s() == 30.0
    monkeypatch.setenv("SGD_PLACEMENT_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="SGD_PLACEMENT_TIMEOUT_S='soon' is not a number"):
        placement_timeout_s()


def test_new_configs_are_kept_as_json_for_restore(tmp_path):
    from sgd.air.saved import SAVED_CONFIGS, backend_name, config_of_backend
    from sgd.storage import saved_trainer

    trainer = sgd.DataParallelTrainer(
        lambda: None, dataset_config=DataConfig(["train"]),
        run_config=RunConfig(name="x", logging_config=LoggingConfig("DEBUG"),
                             failure_config=FailureConfig(controller_failure_limit=2)),
        scaling_config=ScalingConfig(num_workers=2, accelerator_type="A100"))
    state = saved_trainer.state_of(trainer, ("datasets", "_restore_run_dir", "_restore_trusted"))
    saved_trainer.save(tmp_path, type(trainer), state, SAVED_CONFIGS, backend_name)
    loaded = saved_trainer.SavedTrainer(tmp_path).load(["train_loop_per_worker"], False, SAVED_CONFIGS,
                                                       config_of_backend, "DataParallelTrainer")
    assert loaded["dataset_config"] == DataConfig(["train"])  # JSON, nothing unpickled
    assert loaded["run_config"].logging_config == LoggingConfig("DEBUG")
    assert loaded["run_config"].failure_config.controller_failure_limit == 2
    assert loaded["scaling_config"].accelerator_type == "A100"
