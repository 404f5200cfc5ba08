"""Bad input is a clear error (or a warning saying what was changed) before any worker starts."""

import json
import logging
import os

import pandas as pd
import pytest

import sgd
from sgd_xgboost import (
    LightGBMTrainer,
    XGBoostReportCallback,
    XGBoostTrainer,
    load_lightgbm_model,
    to_lgb_dataset,
    to_quantile_dmatrix,
)
from sgd_xgboost.checkpoints import write_checkpoint

FRAME = pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.0], "b": [0.0, 1.0, 0.0, 1.0], "y": [0, 1, 0, 1]})
TRAINERS = [XGBoostTrainer, LightGBMTrainer]


@pytest.mark.parametrize("trainer_cls", TRAINERS)
def test_a_missing_label_column_names_the_columns(trainer_cls):
    message = r"label column 'target' is not in dataset 'valid'; its columns are: 'a', 'b', 'y'"
    with pytest.raises(ValueError, match=message):
        trainer_cls(params={}, label_column="target", datasets={"train": FRAME.rename(columns={"y": "target"}),
                                                                   "valid": FRAME})


def test_a_missing_label_column_in_a_ray_dataset(ray_cluster, tmp_path):
    import ray.data

    FRAME.to_parquet(tmp_path / "part.parquet")
    with pytest.raises(ValueError, match=r"label column 'target' is not in dataset 'train'; its columns are: 'a'"):
        XGBoostTrainer(params={}, label_column="target", datasets={"train": ray.data.read_parquet(str(tmp_path))})


def test_the_data_helpers_name_the_columns_too():
    with pytest.raises(ValueError, match=r"label column 'label' is not in the dataset; its columns are: 'a', 'b', 'y'"):
        to_quantile_dmatrix(FRAME, "label")
    with pytest.raises(ValueError, match=r"'label' is not in the dataset"):
        to_lgb_dataset(FRAME, "label")
    with pytest.raises(TypeError, match="cannot read training data of type int"):
        to_quantile_dmatrix(3, "y")


@pytest.mark.parametrize("trainer_cls", TRAINERS)
def test_shapes_do_not_mix_and_the_older_one_needs_its_arguments(trainer_cls):
    with pytest.raises(ValueError, match="either train_loop_per_worker .* not both; got train_loop_per_worker and "
                                         "label_column, params"):
        trainer_cls(lambda: None, label_column="y", params={})
    with pytest.raises(ValueError, match="needs label_column="):
        trainer_cls(params={}, datasets={"train": FRAME})
    with pytest.raises(ValueError, match=r"needs datasets=\{'train': ...\}"):
        trainer_cls(params={}, label_column="y", datasets={"valid": FRAME})
    with pytest.raises(ValueError, match="num_boost_round must be a positive int"):
        trainer_cls(params={}, label_column="y", datasets={"train": FRAME}, num_boost_round=0)
    with pytest.raises(ValueError, match=r"dmatrix_params names datasets \['test'\]"):
        trainer_cls(params={}, label_column="y", datasets={"train": FRAME}, dmatrix_params={"test": {}})


def test_xgboost_parameters_that_conflict_with_the_workers():
    two = sgd.ScalingConfig(num_workers=2)
    with pytest.raises(ValueError, match="ask for a GPU .* ScalingConfig\\(use_gpu=True\\)"):
        XGBoostTrainer(params={"device": "cuda"}, label_column="y", datasets={"train": FRAME}, scaling_config=two)
    with pytest.raises(ValueError, match="ask for a GPU"):
        XGBoostTrainer(params={"tree_method": "gpu_hist"}, label_column="y", datasets={"train": FRAME})
    with pytest.raises(ValueError, match="tree_method='exact' does not train across workers"):
        XGBoostTrainer(params={"tree_method": "exact"}, label_column="y", datasets={"train": FRAME})


def test_threads_above_the_workers_cpus_are_lowered_with_a_warning(caplog):
    two_cpus = sgd.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 2})
    with caplog.at_level(logging.WARNING, logger="sgd.xgboost"):
        trainer = XGBoostTrainer(params={"nthread": 8}, label_column="y", datasets={"train": FRAME},
                                 scaling_config=two_cpus)
    assert trainer.params["nthread"] == 2
    assert "nthread=8 does not fit the 2 CPU(s) each worker reserves" in caplog.text
    assert "using nthread=2 instead" in caplog.text
    # Unset: the worker's CPUs, silently.
    caplog.clear()
    assert XGBoostTrainer(params={}, label_column="y", datasets={"train": FRAME},
                          scaling_config=two_cpus).params["nthread"] == 2
    with caplog.at_level(logging.WARNING, logger="sgd.xgboost"):
        lgb = LightGBMTrainer(params={"num_threads": 4}, label_column="y", datasets={"train": FRAME})
    assert lgb.params["num_threads"] == 1 and "num_threads=4" in caplog.text


def test_lightgbm_parameters_that_conflict_with_the_workers():
    two = sgd.ScalingConfig(num_workers=2)
    with pytest.raises(ValueError, match="tree_learner='serial' does not train one model on data split across 2"):
        LightGBMTrainer(params={"tree_learner": "serial"}, label_column="y", datasets={"train": FRAME},
                        scaling_config=two)
    with pytest.raises(ValueError, match=r"\['machines'\] are set by the 'lightgbm' backend"):
        LightGBMTrainer(params={"machines": "a:1"}, label_column="y", datasets={"train": FRAME})
    with pytest.raises(ValueError, match="ask for a GPU"):
        LightGBMTrainer(params={"device_type": "gpu"}, label_column="y", datasets={"train": FRAME})
    # One worker: serial is fine; several: data-parallel by default.
    assert LightGBMTrainer(params={"tree_learner": "serial"}, label_column="y", datasets={"train": FRAME})
    assert LightGBMTrainer(params={}, label_column="y", datasets={"train": FRAME},
                           scaling_config=two).params["tree_learner"] == "data"


def _lightgbm_checkpoint(folder):
    import lightgbm

    booster = lightgbm.train({"objective": "binary", "verbose": -1, "min_data_in_leaf": 1},
                             lightgbm.Dataset(FRAME[["a", "b"]], label=FRAME["y"]), num_boost_round=2)
    with write_checkpoint("lightgbm", lightgbm.__version__, "model.txt", booster.save_model, 2) as ckpt:
        return ckpt.to_directory(str(folder))


def test_a_checkpoint_of_another_framework_or_version(tmp_path):
    lgb_dir = _lightgbm_checkpoint(tmp_path / "lgb")
    with pytest.raises(ValueError, match="holds a lightgbm model \\(model.txt\\), not a xgboost one: load it with "
                                         "sgd_xgboost.LightGBMTrainer.get_model"):
        XGBoostTrainer.get_model(lgb_dir)
    assert load_lightgbm_model(sgd.Checkpoint.from_directory(lgb_dir)).current_iteration() == 2

    # A model file XGBoost cannot read, written (says its note) by another version.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.ubj").write_bytes(b"not a model")
    (bad / "sgd_xgboost.json").write_text(json.dumps({"framework": "xgboost", "version": "9.9.9",
                                                      "model_file": "model.ubj", "rounds": 1}))
    with pytest.raises(ValueError, match=r"XGBoost cannot load .*model.ubj \(written by xgboost 9.9.9; this is "):
        XGBoostTrainer.get_model(str(bad))

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "weights.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="no xgboost model \\(model.ubj or model.json\\) .* it holds: weights.pt"):
        XGBoostTrainer.get_model(str(empty))
    with pytest.raises(FileNotFoundError):
        LightGBMTrainer.get_model(str(tmp_path / "missing"))
    assert os.path.isdir(lgb_dir)


def test_report_callback_arguments():
    with pytest.raises(ValueError, match="frequency must be an int >= 0"):
        XGBoostReportCallback(frequency=-1)
