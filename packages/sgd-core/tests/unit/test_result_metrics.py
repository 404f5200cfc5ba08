"""``Result.metrics`` holds exactly what rank 0 reported, as Ray 2.60's ``ray.train.Result``:
without sgd's autofilled keys and without AIR's result fields, which stay in
``metrics_dataframe``; the kept checkpoints' metrics likewise. Over a run folder written here
as a driver leaves it (no Ray)."""

import json
from pathlib import Path

import pytest

import sgd
from sgd._common.protocol import AUTOFILLED_KEYS, DETAIL_KEY, DETAILED_AUTOFILLED_KEYS, CheckpointTarget, reported_only
from sgd.storage.staging import stage_state
from sgd.trainer.run_dirs import open_run


def _row(step, **reported):
    """A line of ``results.jsonl`` as the driver writes it: the report plus what sgd stamps."""
    return {**reported, "_training_iteration": step, "_timestamp": 1_700_000_000 + step, "_time_this_iter_s": 0.5,
            "_date": "2026-11-29_07-00-00", "_time_total_s": 0.5 * step, "_pid": 123, "_hostname": "h",
            "_node_ip": "10.0.0.1"}


def _write_run(path: Path, losses, checkpointed, saved=()):
    """A finished run: rank 0 reported ``loss`` per step; a checkpoint with the report at each
    step in ``checkpointed``, and one saved by ``save_checkpoint`` (no metrics) in ``saved``."""
    run, manager = open_run(None, path.parent, None, sgd.CheckpointStrategy(), "sgd", None, named=path)
    run.write_settings({"backend": "base", "run_config": {"lr": 0.1}})
    target = CheckpointTarget(str(manager.checkpoint_dir), manager.codec, manager.strategy.checkpoint_score_attribute)
    for step, loss in enumerate(losses, start=1):
        row = _row(step, loss=loss)
        run.append_line(json.dumps([row]))
        if step in checkpointed:
            manager.register(Path(stage_state(target, {"step": step}).path), row, step, metrics=row)
        if step in saved:
            manager.register(Path(stage_state(target, {"step": step}).path), {}, step)
    run.close(error=False)
    return path


def test_metrics_are_rank_0s_last_report_exactly(tmp_path):
    # The last report carried no checkpoint: sgd's metrics are still that report (Ray 2.60's:
    # the last one with a checkpoint).
    result = sgd.Result.from_path(_write_run(tmp_path / "exp", [0.9, 0.5, 0.3], checkpointed={1, 2}))
    assert result.metrics == {"loss": 0.3}
    assert result.config == {"lr": 0.1}


def test_best_checkpoints_metrics_are_what_was_reported_with_them(tmp_path):
    result = sgd.Result.from_path(_write_run(tmp_path / "exp", [0.9, 0.5, 0.3], checkpointed={1, 2}, saved={3}))
    assert [m for _, m in result.best_checkpoints] == [{"loss": 0.9}, {"loss": 0.5}, {"loss": 0.3}]
    assert result.get_best_checkpoint("loss", "min").path == result.best_checkpoints[-1][0].path
    with pytest.raises(RuntimeError, match=r"Invalid metric name training_iteration!.*\['loss'\]"):
        result.get_best_checkpoint("training_iteration", "max")


def test_metrics_dataframe_keeps_every_report_with_airs_fields(tmp_path):
    result = sgd.Result.from_path(_write_run(tmp_path / "exp", [0.9, 0.5, 0.3], checkpointed={2}))
    df = result.metrics_dataframe
    assert list(df["loss"]) == [0.9, 0.5, 0.3]
    assert list(df["training_iteration"]) == [1, 2, 3] and list(df["_training_iteration"]) == [1, 2, 3]
    assert list(df["timestamp"]) == [1_700_000_001, 1_700_000_002, 1_700_000_003]
    assert list(df["done"]) == [False, False, True]
    assert set(df["trial_id"]) == {"exp"} and df["config"].iloc[-1] == {"lr": 0.1}
    assert "time_this_iter_s" in df.columns
    # Reading metrics_dataframe never adds AIR's fields to metrics.
    assert result.metrics == {"loss": 0.3}


def test_a_key_the_worker_reported_under_an_air_name_is_kept(tmp_path):
    path = tmp_path / "exp"
    run, _ = open_run(None, path.parent, None, sgd.CheckpointStrategy(), "sgd", None, named=path)
    run.write_settings({"backend": "base"})
    run.append_line(json.dumps([_row(1, loss=1.0, training_iteration=7, done="mine")]))
    run.close(error=False)
    result = sgd.Result.from_path(path)
    assert result.metrics == {"loss": 1.0, "training_iteration": 7, "done": "mine"}
    assert result.metrics_dataframe["training_iteration"].iloc[-1] == 7  # the worker's own value wins


def test_reported_only_leaves_out_every_stamped_key():
    stamped = {k: 1 for k in (*AUTOFILLED_KEYS, *DETAILED_AUTOFILLED_KEYS, DETAIL_KEY)}
    row = {"loss": 0.1, "nested": {"_timestamp": 2}, **stamped}
    assert reported_only(row) == {"loss": 0.1, "nested": {"_timestamp": 2}}
    assert row["_training_iteration"] == 1  # a copy: the row is left as it was
