"""Ray Train 2.60's Checkpoint metadata and filesystem, and Result.get_best_checkpoint /
filesystem / config (issue 53). No Ray."""

import json
import os
import pickle
from pathlib import Path

import pyarrow.fs as pafs
import pytest

import sgd
from sgd import Checkpoint, Result
from sgd.checkpoint import integrity
from sgd.checkpoint.format import write_directory_metadata
from sgd.errors import CheckpointError


def committed_dir(tmp_path, name="ckpt"):
    d = tmp_path / name
    d.mkdir()
    (d / "model.txt").write_text("weights")
    write_directory_metadata(d)  # as the driver commits a directory checkpoint
    return d


# --- Checkpoint metadata ----------------------------------------------------------------


def test_metadata_round_trip_in_rays_file(tmp_path):
    ckpt = Checkpoint.from_directory(committed_dir(tmp_path))
    assert ckpt.get_metadata() == {}
    ckpt.set_metadata({"epoch": 3, "tags": ["a"]})
    ckpt.update_metadata({"loss": 0.5, "epoch": 4})
    assert ckpt.get_metadata() == {"epoch": 4, "tags": ["a"], "loss": 0.5}
    assert json.loads(Path(ckpt.path, ".metadata.json").read_text())["epoch"] == 4  # Ray's file name


def test_metadata_set_after_commit_does_not_break_verification(tmp_path):
    d = committed_dir(tmp_path)
    Checkpoint.from_directory(d).set_metadata({"a": 1})
    assert integrity.check(d) is None
    (d / "model.txt").write_text("changed")  # every other file is still held to its digest
    assert "model.txt" in integrity.check(d)


def test_metadata_written_before_commit_travels_with_the_checkpoint(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    (d / "m.bin").write_bytes(b"1")
    Checkpoint.from_directory(d).set_metadata({"step": 7})
    copy = Path(Checkpoint.from_directory(d).to_directory(str(tmp_path / "copy")))
    assert Checkpoint.from_directory(copy).get_metadata() == {"step": 7}


def test_metadata_must_be_json(tmp_path):
    ckpt = Checkpoint.from_directory(committed_dir(tmp_path))
    with pytest.raises(ValueError, match="JSON values only"):
        ckpt.set_metadata({"model": object()})
    with pytest.raises(TypeError, match="dict with str keys"):
        ckpt.set_metadata(["a"])
    assert ckpt.get_metadata() == {}  # nothing written


def test_untrusted_metadata_is_never_unpickled_and_stays_in_its_directory(tmp_path):
    d = committed_dir(tmp_path)
    (d / ".metadata.json").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(CheckpointError, match="not valid JSON"):
        Checkpoint.from_directory(d).get_metadata()
    (d / ".metadata.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="JSON object"):
        Checkpoint.from_directory(d).get_metadata()
    outside = tmp_path / "secret.json"
    outside.write_text('{"secret": 1}')
    (d / ".metadata.json").unlink()
    os.symlink(outside, d / ".metadata.json")
    with pytest.raises(CheckpointError, match="leads outside"):
        Checkpoint.from_directory(d).get_metadata()
    with pytest.raises(CheckpointError, match="leads outside"):
        Checkpoint.from_directory(d).set_metadata({"x": 1})
    assert json.loads(outside.read_text()) == {"secret": 1}


def test_dict_checkpoint_keeps_metadata_and_writes_it_with_to_directory(tmp_path):
    ckpt = Checkpoint.from_dict({"w": 1})
    ckpt.set_metadata({"framework": "sgd"})
    out = ckpt.to_directory(str(tmp_path / "out"))
    back = Checkpoint.from_directory(out)
    assert back.get_metadata() == {"framework": "sgd"} and back.to_dict() == {"w": 1}
    assert ckpt.filesystem is None


def test_filesystem_and_rays_constructor(tmp_path):
    d = committed_dir(tmp_path)
    assert isinstance(Checkpoint.from_directory(d).filesystem, pafs.LocalFileSystem)
    local = Checkpoint(str(d), pafs.LocalFileSystem())  # Ray's Checkpoint(path, filesystem)
    assert local.path == str(d)
    sub = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    remote = Checkpoint("ckpt", filesystem=sub)
    assert remote.filesystem is sub
    with remote.as_directory() as got:
        assert Path(got, "model.txt").read_text() == "weights"
    remote.set_metadata({"on": "subtree"})
    assert remote.get_metadata() == {"on": "subtree"}
    assert json.loads((d / ".metadata.json").read_text()) == {"on": "subtree"}
    with pytest.raises(TypeError, match="pyarrow.fs.FileSystem"):
        Checkpoint(str(d), filesystem="s3")


# --- Result -------------------------------------------------------------------------------


def result_with(*metrics):
    kept = [(Checkpoint.from_dict({"i": i}), m) for i, m in enumerate(metrics)]
    return Result(metrics=dict(metrics[-1]) if metrics else None, checkpoint=kept[-1][0] if kept else None,
                  best_checkpoints=kept)


def test_get_best_checkpoint_as_ray():
    result = result_with({"loss": 3.0, "eval": {"acc": 0.1}}, {"loss": 1.0, "eval": {"acc": 0.9}},
                         {"loss": 2.0}, {"acc": 0.5})
    assert result.get_best_checkpoint("loss", "min").to_dict() == {"i": 1}
    assert result.get_best_checkpoint("loss", "max").to_dict() == {"i": 0}
    assert result.get_best_checkpoint("eval/acc", "max").to_dict() == {"i": 1}  # nested, as Ray looks it up


def test_get_best_checkpoint_errors_as_ray():
    with pytest.raises(RuntimeError, match="No checkpoint exists"):
        result_with().get_best_checkpoint("loss", "min")
    result = result_with({"loss": 1.0})
    with pytest.raises(ValueError, match="Unsupported mode: best"):
        result.get_best_checkpoint("loss", "best")
    with pytest.raises(RuntimeError, match=r"Invalid metric name accuracy!.*\['loss'\]"):
        result.get_best_checkpoint("accuracy", "max")


def test_result_filesystem_and_config():
    result = result_with({"loss": 1.0, "config": {"lr": 0.1}})
    assert isinstance(result.filesystem, pafs.LocalFileSystem)
    assert result.config == {"lr": 0.1}
    assert Result(metrics=None, checkpoint=None).config is None


def test_result_names_of_ray_260_exist():
    for name in ("metrics", "checkpoint", "error", "path", "metrics_dataframe", "best_checkpoints",
                 "return_value", "filesystem", "get_best_checkpoint", "from_path", "config"):
        assert hasattr(sgd.Result, name) or name in sgd.Result.__dataclass_fields__, name


# --- context --------------------------------------------------------------------------------


def test_preemption_info_has_ray_260s_names():
    import math

    from sgd._worker.context import PreemptionInfo

    info = PreemptionInfo(1000.25, "10.0.0.2", "n1", {"n1": [2, 0], "n2": [1]})
    assert info.deadline_ms == 1000250 and info.seconds_left == 0.0  # sgd's names stay
    assert info.preempted_node_ids == ["n1", "n2"] and info.preempted_ranks == [0, 1, 2]
    assert info.preempted_node_to_ranks == {"n1": [2, 0], "n2": [1]}
    bare = PreemptionInfo(math.inf, "10.0.0.2", "n1")
    assert bare.deadline_ms is None and bare.preempted_node_ids == ["n1"] and bare.preempted_ranks == []
    assert pickle.loads(pickle.dumps(info)) == info and isinstance(sgd.PreemptionInfo(0, "a", "b"), PreemptionInfo)


def test_get_storage_outside_a_run_and_for_a_run_folder(tmp_path):
    from sgd._worker.context import WorkerContext

    with pytest.raises(RuntimeError, match="no run folder"):
        WorkerContext().get_storage()
    storage = WorkerContext(trial_dir=str(tmp_path / "exp")).get_storage()
    assert storage.experiment_fs_path == (tmp_path / "exp").as_posix()
    assert storage.build_checkpoint_path_from_name("checkpoint_000001").endswith("exp/checkpoints/checkpoint_000001")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # get_context() outside a run warns
        assert isinstance(sgd.get_context(), sgd.TrainContext)  # Ray's name of the context's class
