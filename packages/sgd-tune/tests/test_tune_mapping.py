"""Rank 0's reports and checkpoints map 1:1 onto Tune's results and checkpoints, across retries.

Ray Train 1.12's ``test_tune.py::test_retry`` pattern (save, then report; a user-reported
``training_iteration``; one failure at i=2; ``max_failures=3``) and the same with the other
order and with the explicit pairing ``sgd.report(metrics, checkpoint=...)``.
"""

from __future__ import annotations

import os

import pandas
import pytest
from ray import tune

import sgd

STEPS = 4


def _ray_112_retry(config):
    """Ray 1.12's test_retry training function, as it was written there (sgd names)."""
    ckpt = sgd.load_checkpoint()
    restored = bool(ckpt)
    itr = 0
    if ckpt:
        itr = ckpt["iter"] + 1
    for i in range(itr, STEPS):
        if i == 2 and not restored and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise Exception("try to fail me")
        sgd.save_checkpoint(iter=i)
        sgd.report(test=i, training_iteration=i)


def _report_then_save(config):
    ckpt = sgd.load_checkpoint()
    start = ckpt["iter"] + 1 if ckpt else 0
    for i in range(start, STEPS):
        if i == config["fail_at"] and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise Exception("try to fail me")
        sgd.report(test=i, resumed=start)
        sgd.save_checkpoint(iter=i)


def _explicit(config):
    ckpt = sgd.get_checkpoint()
    start = ckpt.to_dict()["iter"] + 1 if ckpt else 0
    for i in range(start, STEPS):
        if i == config["fail_at"] and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise Exception("try to fail me")
        sgd.report({"test": i, "resumed": start}, checkpoint=sgd.Checkpoint.from_dict({"iter": i}))


class _Rows(tune.Callback):
    """Every result Tune's driver received, in order: what sgd handed Tune. The trial's own
    ``progress.csv`` can lose a failed attempt's rows: Tune 2.60 copies its staging folder to
    storage in the background, skips a copy while one runs, and on a retry copies the storage
    copy back over the staging one (Tune's race, not sgd's: docs/tune.md)."""

    def __init__(self):
        self.rows = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.rows.append(dict(result))


def _fit(func, config, storage_path, name, workers=1):
    """The result, and the rows Tune's callbacks received as a dataframe."""
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=workers)
    seen = _Rows()
    (result,) = tune.Tuner(
        trainer.to_tune_trainable(func), param_space=config,
        run_config=tune.RunConfig(storage_path=storage_path, name=name, verbose=0, callbacks=[seen],
                                  failure_config=tune.FailureConfig(max_failures=3)),
    ).fit()
    assert result.error is None, result.error
    return result, pandas.DataFrame(seen.rows)


def test_ray_112_test_retry_keeps_every_row_and_counts_on(ray_cluster, storage_path, tmp_path):
    result, df = _fit(_ray_112_retry, {"marker": str(tmp_path / "failed")}, storage_path, "retry")
    assert (tmp_path / "failed").exists()
    assert list(df["test"]) == [0, 1, 2, 3]
    assert list(df["training_iteration"]) == [1, 2, 3, 4]  # Tune's count, not the reported key
    assert list(df["reported_training_iteration"]) == [0, 1, 2, 3]  # the user's, kept
    assert sgd.Trainer.load_checkpoint_from_path(result.checkpoint.path)["iter"] == 3


@pytest.mark.parametrize("func", [_report_then_save, _explicit], ids=["report-then-save", "explicit"])
@pytest.mark.parametrize("fail_at", [1, 3])
def test_either_order_maps_each_checkpoint_to_its_result(ray_cluster, storage_path, tmp_path, func, fail_at):
    result, df = _fit(func, {"marker": str(tmp_path / "failed"), "fail_at": fail_at}, storage_path, "order")
    assert (tmp_path / "failed").exists()
    assert list(df["test"]) == [0, 1, 2, 3]
    assert list(df["training_iteration"]) == [1, 2, 3, 4]
    # The retry resumed from the checkpoint filed under the last result before the failure.
    assert list(df["resumed"]) == [0] * fail_at + [fail_at] * (STEPS - fail_at)
    assert sgd.Trainer.load_checkpoint_from_path(result.checkpoint.path)["iter"] == 3


def _only_checkpoints(config):
    for i in range(2):
        sgd.save_checkpoint(iter=i)


def _saves_after_its_last_report(config):
    for i in range(STEPS):
        sgd.save_checkpoint(iter=i)
        sgd.report(test=i)
    sgd.save_checkpoint(iter=STEPS)  # goes with no report


def test_a_checkpoint_without_a_report_still_reaches_tune(ray_cluster, storage_path):
    result, _ = _fit(_only_checkpoints, {}, storage_path, "no_reports")
    assert sgd.Trainer.load_checkpoint_from_path(result.checkpoint.path) == {"iter": 1}

    result, df = _fit(_saves_after_its_last_report, {}, storage_path, "trailing")
    # Every report is a row with its own checkpoint; the last checkpoint on a result of its own.
    assert list(df["test"].dropna()) == [0, 1, 2, 3] and len(df) == STEPS + 1
    assert sgd.Trainer.load_checkpoint_from_path(result.checkpoint.path) == {"iter": STEPS}
