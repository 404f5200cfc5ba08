"""Ray 2.x's ``python/ray/train/tests/test_xgboost_trainer.py``, ported (issue 38).

Ported from Ray (ray-project/ray at 00a715613d4f3021105db46e2e07af600df4eb6e) as the Ray 2.3 ports
were: imports renamed to sgd's, nothing else changed except where a ``# sgd:`` comment says so.
Deliberate differences are strict ``xfail``s; tests of Ray's internals are skipped; both listed in
docs/migration-ray-train.md ("Ported test status").
"""

from unittest import mock

import pandas as pd
import pytest
import ray
import xgboost as xgb
from ray import tune
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

import sgd as train  # sgd: was ``from ray import train`` (train.Checkpoint, train.RunConfig ...)
from sgd import ScalingConfig  # sgd: was ray.train
from sgd_xgboost import XGBoostReportCallback as RayTrainReportCallback  # sgd: was ray.train.xgboost
from sgd_xgboost import XGBoostTrainer  # sgd: was ray.train.xgboost

TRAIN_DATASET_KEY = "train"  # sgd: was ray.train.constants


@pytest.fixture
def ray_start_4_cpus(ray_cluster, results_dir):
    # sgd: the session's 4-CPU cluster instead of ray.init(num_cpus=4) / ray.shutdown() per test;
    # runs written under a temporary SGD_RESULTS_DIR
    yield ray_cluster


@pytest.fixture
def ray_start_8_cpus(ray_cluster, results_dir, tmp_path, monkeypatch):
    # sgd: the session's 4-CPU cluster too (Tune runs the two trials one after the other); Tune's
    # results under pytest's tmp_path instead of ~/ray_results
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "0")
    yield ray_cluster


scale_config = ScalingConfig(num_workers=2)

data_raw = load_breast_cancer()
dataset_df = pd.DataFrame(data_raw["data"], columns=data_raw["feature_names"])
dataset_df["target"] = data_raw["target"]
train_df, test_df = train_test_split(dataset_df, test_size=0.3)

params = {
    "tree_method": "approx",
    "objective": "binary:logistic",
    "eval_metric": ["logloss", "error"],
}


def test_fit(ray_start_4_cpus):
    train_dataset = ray.data.from_pandas(train_df)
    valid_dataset = ray.data.from_pandas(test_df)
    trainer = XGBoostTrainer(
        scaling_config=scale_config,
        label_column="target",
        params=params,
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
    )
    trainer.fit()


class ScalingConfigAssertingXGBoostTrainer(XGBoostTrainer):
    def training_loop(self) -> None:
        pgf = train.get_context().get_trial_resources()
        assert pgf.strategy == "SPREAD"
        return super().training_loop()


@pytest.mark.skip(reason="sgd: overrides Ray's private BaseTrainer.training_loop and reads the trial's "
                         "placement group factory; sgd's placement_strategy has its own tests")
def test_fit_with_advanced_scaling_config(ray_start_4_cpus):
    """Ensure that extra ScalingConfig arguments are respected."""
    train_dataset = ray.data.from_pandas(train_df)
    valid_dataset = ray.data.from_pandas(test_df)
    trainer = ScalingConfigAssertingXGBoostTrainer(
        scaling_config=ScalingConfig(
            num_workers=2,
            placement_strategy="SPREAD",
        ),
        label_column="target",
        params=params,
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
    )
    trainer.fit()


def test_resume_from_checkpoint(ray_start_4_cpus, tmpdir):
    train_dataset = ray.data.from_pandas(train_df)
    valid_dataset = ray.data.from_pandas(test_df)
    trainer = XGBoostTrainer(
        scaling_config=scale_config,
        label_column="target",
        params=params,
        num_boost_round=5,
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
    )
    result = trainer.fit()
    checkpoint = result.checkpoint
    xgb_model = XGBoostTrainer.get_model(checkpoint)
    assert xgb_model.num_boosted_rounds() == 5

    trainer = XGBoostTrainer(
        scaling_config=scale_config,
        label_column="target",
        params=params,
        num_boost_round=10,
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
        resume_from_checkpoint=result.checkpoint,
    )
    result = trainer.fit()
    model = XGBoostTrainer.get_model(result.checkpoint)
    assert model.num_boosted_rounds() == 10


@pytest.mark.parametrize(
    "freq_end_expected",
    [
        (4, True, 7),  # 4, 8, 12, 16, 20, 24, 25
        (4, False, 6),  # 4, 8, 12, 16, 20, 24
        (5, True, 5),  # 5, 10, 15, 20, 25
        (0, True, 1),  # end
        (0, False, 0),
    ],
)
def test_checkpoint_freq(ray_start_4_cpus, freq_end_expected):
    freq, end, expected = freq_end_expected

    train_dataset = ray.data.from_pandas(train_df)
    valid_dataset = ray.data.from_pandas(test_df)
    trainer = XGBoostTrainer(
        run_config=train.RunConfig(  # sgd: was ray.train.RunConfig
            checkpoint_config=train.CheckpointConfig(  # sgd: was ray.train.CheckpointConfig
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
        # sgd: was metrics["training_iteration"]; a checkpoint's metrics are the reported dict only
        # (Ray 2.60's), so the message shows them whole
        [(metrics, cp) for cp, metrics in result.best_checkpoints]
    )

    # Assert checkpoint numbers are increasing
    cp_paths = [cp.path for cp, _ in result.best_checkpoints]
    assert cp_paths == sorted(cp_paths), str(cp_paths)


@pytest.mark.skip(reason="sgd: mocks ray.train.get_context and calls the callback's private _get_checkpoint; "
                         "sgd's rank-0-only checkpoints are tested through real runs (test_xgboost_trainer.py)")
@pytest.mark.parametrize("rank", [None, 0, 1])
def test_checkpoint_only_on_rank0(rank):
    """Tests that the callback only reports checkpoints on rank 0,
    or if the rank is not available (Tune usage)."""
    callback = RayTrainReportCallback(frequency=2, checkpoint_at_end=True)

    booster = mock.MagicMock()

    with mock.patch("ray.train.get_context") as mock_get_context:
        mock_context = mock.MagicMock()
        mock_context.get_world_rank.return_value = rank
        mock_get_context.return_value = mock_context

        with callback._get_checkpoint(booster) as checkpoint:
            if rank in (0, None):
                assert checkpoint
            else:
                assert not checkpoint


def test_tune(ray_start_8_cpus, tmp_path):
    train_dataset = ray.data.from_pandas(train_df)
    valid_dataset = ray.data.from_pandas(test_df)
    trainer = XGBoostTrainer(
        scaling_config=scale_config,
        label_column="target",
        params={**params, "max_depth": 1},
        datasets={TRAIN_DATASET_KEY: train_dataset, "valid": valid_dataset},
    )

    tuner = tune.Tuner(
        trainer,
        param_space={"params": {"max_depth": tune.grid_search([2, 4])}},
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),  # sgd: Tune's files under tmp_path
    )
    results = tuner.fit()
    assert sorted([r.config["params"]["max_depth"] for r in results]) == [2, 4]


@pytest.mark.xfail(strict=True, raises=ValueError,
                   reason="sgd: a missing 'train' dataset is a ValueError naming the datasets given (Ray: KeyError)")
def test_validation(ray_start_4_cpus):
    valid_dataset = ray.data.from_pandas(test_df)
    with pytest.raises(KeyError, match=TRAIN_DATASET_KEY):
        XGBoostTrainer(
            scaling_config=ScalingConfig(num_workers=2),
            label_column="target",
            params=params,
            datasets={"valid": valid_dataset},
        )


def test_callback_get_model(tmp_path):
    custom_filename = "custom.json"

    bst = xgb.train(
        params,
        dtrain=xgb.DMatrix(train_df, label=train_df["target"]),
        num_boost_round=1,
    )
    bst.save_model(tmp_path.joinpath(custom_filename).as_posix())
    checkpoint = train.Checkpoint.from_directory(tmp_path.as_posix())

    RayTrainReportCallback.get_model(checkpoint, filename=custom_filename)
