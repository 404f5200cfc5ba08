"""Ray 2.x's ``python/ray/train/tests/test_lightgbm_trainer.py``, ported (issue 38).

Ported from Ray (ray-project/ray at 0079072d477bb74bbfccc45142c5750faf2b1dbd, the Ray 2.3 era's AIR
form) as the Ray 2.3 ports were: imports renamed to sgd's, nothing else changed except where a
``# sgd:`` comment says so. Ray's ``LightGBMCheckpoint`` is not in sgd: a checkpoint is an
:class:`sgd.Checkpoint` directory and ``LightGBMTrainer.get_model`` reads it. Deliberate
differences are strict ``xfail``s; tests of Ray's internals are skipped; both listed in
docs/migration-ray-train.md ("Ported test status").
"""

import math

import lightgbm as lgbm
import pandas as pd
import pytest
import ray
from ray import tune
from ray.data.preprocessor import Preprocessor
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

import sgd  # sgd: for sgd.RunConfig / CheckpointConfig, Ray's ray.air.*
from sgd import (
    Checkpoint,  # sgd: was ray.air.checkpoint
    ScalingConfig,  # sgd: was ray.air.config
)
from sgd_xgboost import LightGBMTrainer  # sgd: was ray.train.lightgbm (LightGBMCheckpoint: see the docstring)

TRAIN_DATASET_KEY = "train"  # sgd: was ray.train.constants


@pytest.fixture
def ray_start_6_cpus(ray_cluster, results_dir, tmp_path, monkeypatch):
    # sgd: the session's 4-CPU cluster instead of ray.init(num_cpus=6) / ray.shutdown() per test;
    # runs written under a temporary SGD_RESULTS_DIR, Tune's under pytest's tmp_path
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "0")
    yield ray_cluster


scale_config = ScalingConfig(num_workers=2)

data_raw = load_breast_cancer()
dataset_df = pd.DataFrame(data_raw["data"], columns=data_raw["feature_names"])
dataset_df["target"] = data_raw["target"]
train_df, test_df = train_test_split(dataset_df, test_size=0.3)

params = {
    "objective": "binary",
    "metric": ["binary_logloss", "binary_error"],
}


def get_num_trees(booster: lgbm.Booster) -> int:
    return booster.current_iteration()


def test_fit_with_categoricals(ray_start_6_cpus):
    train_df_with_cat = train_df.copy()
    test_df_with_cat = test_df.copy()
    train_df_with_cat["categorical_column"] = pd.Series(
        (["A", "B"] * math.ceil(len(train_df_with_cat) / 2))[: len(train_df_with_cat)]
    ).astype("category")
    test_df_with_cat["categorical_column"] = pd.Series(
        (["A", "B"] * math.ceil(len(test_df_with_cat) / 2))[: len(test_df_with_cat)]
    ).astype("category")

    train_dataset = ray.data.from_pandas(train_df_with_cat)
    valid_dataset = ray.data.from_pandas(test_df_with_cat)
    trainer = LightGBMTrainer(
        scaling_config=scale_config,
        label_column="target",
        params=params,
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
    )
    result = trainer.fit()
    model = LightGBMTrainer.get_model(result.checkpoint)  # sgd: was LightGBMCheckpoint.from_checkpoint(...).get_model()
    assert model.pandas_categorical == [["A", "B"]]


@pytest.mark.xfail(strict=True, reason="sgd: num_boost_round counts the trees of the final model when resuming "
                                       "(Ray 2.x's later trainers, and its XGBoost test, do too): 5 trees, not 10")
def test_resume_from_checkpoint(ray_start_6_cpus, tmpdir):
    train_dataset = ray.data.from_pandas(train_df)
    valid_dataset = ray.data.from_pandas(test_df)
    trainer = LightGBMTrainer(
        scaling_config=scale_config,
        label_column="target",
        params=params,
        num_boost_round=5,
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
    )
    result = trainer.fit()
    checkpoint = result.checkpoint
    model = LightGBMTrainer.get_model(result.checkpoint)  # sgd: was LightGBMCheckpoint...get_model()
    assert get_num_trees(model) == 5

    # Move checkpoint to a different directory.
    checkpoint_path = checkpoint.to_directory(str(tmpdir))  # sgd: was through to_dict() / from_dict()
    resume_from = Checkpoint.from_directory(checkpoint_path)

    trainer = LightGBMTrainer(
        scaling_config=scale_config,
        label_column="target",
        params=params,
        num_boost_round=5,
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
        resume_from_checkpoint=resume_from,
    )
    result = trainer.fit()
    xgb_model = LightGBMTrainer.get_model(result.checkpoint)  # sgd: was LightGBMCheckpoint...get_model()
    assert get_num_trees(xgb_model) == 10


@pytest.mark.parametrize(
    "freq_end_expected",
    [
        (4, True, 7),  # 4, 8, 12, 16, 20, 24, 25
        (4, False, 6),  # 4, 8, 12, 16, 20, 24
        (5, True, 5),  # 5, 10, 15, 20, 25
        (0, True, 1),
        (0, False, 0),
    ],
)
def test_checkpoint_freq(ray_start_6_cpus, freq_end_expected):
    freq, end, expected = freq_end_expected

    train_dataset = ray.data.from_pandas(train_df)
    valid_dataset = ray.data.from_pandas(test_df)
    trainer = LightGBMTrainer(
        run_config=sgd.RunConfig(  # sgd: was ray.air.RunConfig
            checkpoint_config=sgd.CheckpointConfig(  # sgd: was ray.air.CheckpointConfig
                checkpoint_frequency=freq, checkpoint_at_end=end
            )
        ),
        scaling_config=scale_config,
        label_column="target",
        params=params,
        num_boost_round=25,
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
    )
    result = trainer.fit()

    # Assert number of checkpoints
    assert len(result.best_checkpoints) == expected, str(
        [
            # sgd: was (metrics["training_iteration"], _cp._local_path); a checkpoint's metrics are the
            # reported dict only (Ray 2.60's), so the message shows them whole
            (metrics, _cp.path)
            for _cp, metrics in result.best_checkpoints
        ]
    )

    # Assert checkpoint numbers are increasing
    cp_paths = [cp.path for cp, _ in result.best_checkpoints]  # sgd: was cp._local_path
    assert cp_paths == sorted(cp_paths), str(cp_paths)


def test_preprocessor_in_checkpoint(ray_start_6_cpus, tmpdir):
    train_dataset = ray.data.from_pandas(train_df)
    valid_dataset = ray.data.from_pandas(test_df)

    class DummyPreprocessor(Preprocessor):
        def __init__(self):
            super().__init__()
            self.is_same = True

        def fit(self, dataset):
            self.fitted_ = True

        def _transform_pandas(self, df: "pd.DataFrame") -> "pd.DataFrame":
            return df

    trainer = LightGBMTrainer(
        scaling_config=scale_config,
        label_column="target",
        params=params,
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
        preprocessor=DummyPreprocessor(),
    )
    result = trainer.fit()

    # Move checkpoint to a different directory.
    checkpoint_path = result.checkpoint.to_directory(str(tmpdir))  # sgd: was through to_dict() / from_dict()
    resume_from = Checkpoint.from_directory(checkpoint_path)

    model = LightGBMTrainer.get_model(resume_from)  # sgd: was LightGBMCheckpoint.from_checkpoint(...).get_model()
    # sgd: the preprocessor, of this test's own class, is pickled: loading it needs the trust opt-in
    preprocessor = resume_from.get_preprocessor(trusted=True)
    assert get_num_trees(model) == 10
    assert preprocessor.is_same
    assert preprocessor.fitted_


def test_tune(ray_start_6_cpus, tmp_path):
    train_dataset = ray.data.from_pandas(train_df)
    valid_dataset = ray.data.from_pandas(test_df)
    trainer = LightGBMTrainer(
        scaling_config=scale_config,
        label_column="target",
        params={**params, **{"max_depth": 1}},
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
    )

    tune.run(
        trainer.as_trainable(),
        config={"params": {"max_depth": tune.randint(2, 4)}},
        num_samples=2,
        storage_path=str(tmp_path),  # sgd: Tune's files under tmp_path
        verbose=0,  # sgd: quieter test logs
    )

    # Make sure original Trainer is not affected.
    assert trainer.params["max_depth"] == 1


@pytest.mark.xfail(strict=True, raises=ValueError,
                   reason="sgd: a missing 'train' dataset and dmatrix_params naming unknown datasets are "
                          "ValueErrors naming what is wrong (Ray: KeyError)")
def test_validation(ray_start_6_cpus):
    train_dataset = ray.data.from_pandas(train_df)
    valid_dataset = ray.data.from_pandas(test_df)
    with pytest.raises(KeyError, match=TRAIN_DATASET_KEY):
        LightGBMTrainer(
            scaling_config=ScalingConfig(num_workers=2),
            label_column="target",
            params=params,
            datasets={"valid": valid_dataset},
        )
    with pytest.raises(KeyError, match="dmatrix_params"):
        LightGBMTrainer(
            scaling_config=ScalingConfig(num_workers=2),
            label_column="target",
            params=params,
            dmatrix_params={"data": {}},
            datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
        )


@pytest.mark.skip(reason="sgd: reads lightgbm_ray's private _ray_params; sgd's nthread/num_threads default "
                         "(the worker's CPUs) is tested in test_bad_input.py")
def test_default_parameters_default():
    trainer = LightGBMTrainer(
        datasets={TRAIN_DATASET_KEY: ray.data.from_pandas(train_df)},
        label_column="target",
        params=params,
    )
    assert trainer._ray_params.cpus_per_actor == 2


@pytest.mark.skip(reason="sgd: reads lightgbm_ray's private _ray_params (see test_default_parameters_default)")
def test_default_parameters_scaling_config():
    trainer = LightGBMTrainer(
        datasets={TRAIN_DATASET_KEY: ray.data.from_pandas(train_df)},
        label_column="target",
        params=params,
        scaling_config=ScalingConfig(resources_per_worker={"CPU": 4}),
    )
    assert trainer._ray_params.cpus_per_actor == 4
