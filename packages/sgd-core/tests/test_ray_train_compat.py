"""Ray Train 1.x behaviours users rely on (issue 18): the detailed-metrics switch read in the
driver at every round, and Ray Train's result fields in ``Result.metrics_dataframe`` (``Result.metrics``
is the reported dict only, as Ray 2.60's)."""

from __future__ import annotations

import os
import socket

import pytest

import sgd
from sgd import DataParallelTrainer, RunConfig, ScalingConfig

DETAILED = ("_date", "_time_total_s", "_pid", "_hostname", "_node_ip")


def three_reports(config):
    for i in range(3):
        sgd.report(step=i, rank=sgd.world_rank())
    return os.getpid()


def test_detailed_switch_set_in_the_driver_after_start(base_trainer, monkeypatch):
    monkeypatch.delenv("SGD_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", raising=False)
    monkeypatch.delenv("TRAIN_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", raising=False)
    rounds = list(base_trainer.run_iterator(three_reports))
    assert all(not (set(DETAILED) & set(r)) for rnd in rounds for r in rnd)

    # Ray Train 1.x's own name, set in the driver only, after the workers started.
    monkeypatch.setenv("TRAIN_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "1")
    iterator = base_trainer.run_iterator(three_reports)
    rounds = list(iterator)
    pids = iterator.get_final_results()
    assert len(rounds) == 3
    for rnd in rounds:
        for rank, r in enumerate(rnd):
            assert set(DETAILED) <= set(r)
            assert r["_pid"] == pids[rank] != os.getpid()
            assert r["_hostname"] == socket.gethostname()
            assert r["_time_total_s"] >= r["_time_this_iter_s"] >= 0
    assert [r[0]["_time_total_s"] for r in rounds] == sorted(r[0]["_time_total_s"] for r in rounds)

    # Turned off again between rounds of one run: later rounds lose the keys.
    monkeypatch.setenv("TRAIN_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "0")
    iterator = base_trainer.run_iterator(three_reports)
    monkeypatch.setenv("TRAIN_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "1")
    assert set(DETAILED) <= set(next(iterator)[0])
    monkeypatch.setenv("TRAIN_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "0")
    assert all(not set(DETAILED) & set(rnd[0]) for rnd in iterator)


def test_result_metrics_dataframe_carries_ray_train_fields(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("SGD_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", raising=False)
    monkeypatch.delenv("TRAIN_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", raising=False)
    trainer = DataParallelTrainer(three_reports, train_loop_config={"lr": 0.1},
                                  scaling_config=ScalingConfig(num_workers=2),
                                  run_config=RunConfig(name="ray_fields", storage_path=str(tmp_path)))
    result = trainer.fit()
    assert result.error is None
    assert result.metrics == {"step": 2, "rank": 0}  # what rank 0 reported, as Ray 2.60
    df = result.metrics_dataframe
    m = df.iloc[-1].to_dict()
    assert m["training_iteration"] == m["_training_iteration"] == 3
    assert m["timestamp"] == m["_timestamp"]
    assert m["time_this_iter_s"] == m["_time_this_iter_s"]
    assert m["time_total_s"] >= m["time_this_iter_s"]
    assert m["hostname"] == socket.gethostname() and isinstance(m["node_ip"], str)
    assert isinstance(m["pid"], int) and m["pid"] != os.getpid()
    assert len(m["date"]) == len("2026-01-01_00-00-00")
    assert m["config"] == {"lr": 0.1}
    assert m["done"] is True and m["trial_id"] == "ray_fields"
    # The underscore detailed keys stay off unless the switch is on, as for callbacks.
    assert not set(DETAILED) & set(df.columns)
    assert list(df["training_iteration"]) == [1, 2, 3]
    assert list(df["done"]) == [False, False, True]


def test_failed_run_is_not_done(ray_cluster, tmp_path):
    def fails(config):
        sgd.report(step=0)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom") as info:
        DataParallelTrainer(fails, scaling_config=ScalingConfig(num_workers=1),
                            run_config=RunConfig(name="failing", storage_path=str(tmp_path))).fit()
    result = info.value.result
    assert result.metrics == {"step": 0}
    assert list(result.metrics_dataframe["training_iteration"]) == [1]
    assert list(result.metrics_dataframe["done"]) == [False]
