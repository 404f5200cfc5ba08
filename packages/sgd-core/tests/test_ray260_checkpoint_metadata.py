"""Checkpoint metadata and Result.get_best_checkpoint through a real fit() (issue 53)."""

import tempfile
from pathlib import Path

import sgd
from sgd import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig


def loop():
    for step, loss in enumerate([3.0, 1.0, 2.0]):
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if sgd.get_context().get_world_rank() == 0:
                Path(d, "model.txt").write_text(str(step))
                checkpoint = Checkpoint.from_directory(d)
                checkpoint.set_metadata({"step": step, "framework": "sgd"})
            sgd.report({"loss": loss, "step": step}, checkpoint=checkpoint)


def test_metadata_travels_and_get_best_checkpoint_picks_by_metric(ray_cluster, tmp_path):
    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(name="meta", storage_path=str(tmp_path),
                                                      checkpoint_config=CheckpointConfig(num_to_keep=3))).fit()
    assert result.checkpoint.get_metadata() == {"step": 2, "framework": "sgd"}
    best = result.get_best_checkpoint("loss", "min")
    assert best.get_metadata()["step"] == 1
    with best.as_directory() as d:
        assert Path(d, "model.txt").read_text() == "1"
    best.update_metadata({"chosen": True})  # on a committed checkpoint: it still verifies and loads
    again = sgd.Result.from_path(result.path)
    assert again.get_best_checkpoint("loss", "min").get_metadata() == {"step": 1, "framework": "sgd", "chosen": True}
    assert sorted(c.get_metadata()["step"] for c, _ in again.best_checkpoints) == [0, 1, 2]


def test_storage_filesystem_receives_the_runs_checkpoints(ray_cluster, tmp_path):
    import pyarrow.fs as pafs

    remote = tmp_path / "bucket"
    remote.mkdir()
    fs = pafs.SubTreeFileSystem(str(remote), pafs.LocalFileSystem())  # stands for s3 / gcs here
    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=1),
                                 run_config=RunConfig(name="on_fs", storage_path="runs", storage_filesystem=fs)).fit()
    mirrored = sorted(p for p in (remote / "runs" / "on_fs").rglob("model.txt"))
    assert [p.read_text() for p in mirrored] == ["0", "1", "2"]
    assert Path(result.path).name == "on_fs" and not Path(result.path).is_relative_to(remote)  # run kept locally
