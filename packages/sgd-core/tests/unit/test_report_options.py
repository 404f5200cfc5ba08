"""Ray 2.60's report options without Ray: the arguments checked before anything runs, the
enums and configs, a checkpoint committed under its own folder name, and the index that
``sgd.get_all_reported_checkpoints`` reads."""

import json
import pickle
from pathlib import Path

import pytest
from ray.train import CheckpointUploadMode as RayMode  # imported at collection: it defines Ray tasks

import sgd
from sgd._common.protocol import CheckpointTarget
from sgd._worker.uploads import CheckpointUploadError, check_deletable, check_dir_name
from sgd.checkpoint import METADATA_FILE
from sgd.checkpoint.integrity import checkpoint_dirs
from sgd.storage.manager import CheckpointManager
from sgd.storage.reported import index_path, read_index
from sgd.storage.staging import stage_directory, stage_state


def _manager(tmp_path, start_id=0, **strategy):
    return CheckpointManager(tmp_path / "checkpoints", sgd.CheckpointStrategy(**strategy), "pickle", start_id=start_id)


def _target(m):
    return CheckpointTarget(str(m.checkpoint_dir), m.codec, m.strategy.checkpoint_score_attribute)


def _ckpt():
    return sgd.Checkpoint.from_dict({"w": 1})


# --- the enums and configs are Ray's -------------------------------------------------------------


def test_the_enums_have_rays_members_and_values():
    assert [m.value for m in sgd.CheckpointUploadMode] == ["ASYNC", "SYNC", "NO_UPLOAD"]
    assert [m.value for m in sgd.CheckpointConsistencyMode] == ["COMMITTED", "VALIDATED"]
    assert [m.value for m in sgd.ReportedCheckpointStatus] == [
        "COMMITTED", "PENDING_VALIDATION", "VALIDATED", "VALIDATION_TIMEOUT", "VALIDATION_FAILED"]
    assert sgd.CheckpointUploadMode.ASYNC.default_delete_local_checkpoint_after_upload()
    assert not sgd.CheckpointUploadMode.SYNC.default_delete_local_checkpoint_after_upload()
    # Ray's own member (code that still imports ray.train) and a name are the same mode.
    assert sgd.CheckpointUploadMode.parse(RayMode.ASYNC) is sgd.CheckpointUploadMode.ASYNC
    assert sgd.CheckpointUploadMode.parse("async") is sgd.CheckpointUploadMode.ASYNC


def test_validation_configs_default_as_ray_and_refuse_bad_values():
    config = sgd.ValidationConfig(lambda checkpoint: {})
    assert config.task_config == sgd.ValidationTaskConfig() and config.task_config.fn_kwargs == {}
    assert config.ray_remote_kwargs == {}
    with pytest.raises(ValueError, match="timeout_s.*greater than zero, got 0"):
        sgd.ValidationTaskConfig(timeout_s=0)
    with pytest.raises(TypeError, match="fn_kwargs.*dict"):
        sgd.ValidationTaskConfig(fn_kwargs=[1])
    with pytest.raises(TypeError, match=r"ValidationConfig\(fn=...\) takes a function"):
        sgd.ValidationConfig("validate")
    with pytest.raises(TypeError, match="task_config.*ValidationTaskConfig, got dict"):
        sgd.ValidationConfig(lambda c: {}, task_config={"timeout_s": 1})
    pickle.loads(pickle.dumps(sgd.ValidationTaskConfig({"k": 1}, 5)))


# --- bad input: each a clear error before anything runs -------------------------------------------


@pytest.mark.parametrize("kwargs, error, match", [
    ({"checkpoint_upload_mode": "LATER"}, ValueError, "checkpoint_upload_mode must be one of .*got 'LATER'"),
    ({"checkpoint_upload_mode": 3}, ValueError, "checkpoint_upload_mode must be one of"),
    ({"checkpoint_dir_name": "a/b"}, ValueError, "'a/b'.* is a path, not a folder name"),
    ({"checkpoint_dir_name": "..\\x"}, ValueError, "is a path"),
    ({"checkpoint_dir_name": ".."}, ValueError, "is not a folder name"),
    ({"checkpoint_dir_name": ".hidden"}, ValueError, "starts with a dot"),
    ({"checkpoint_dir_name": "checkpoint_000002"}, ValueError, "names sgd numbers its checkpoints with"),
    ({"checkpoint_dir_name": " "}, ValueError, "is empty"),
    ({"checkpoint_dir_name": 7}, TypeError, "folder name \\(str\\), got int"),
    ({"checkpoint_upload_fn": "upload"}, TypeError, "checkpoint_upload_fn=...\\) takes a function"),
    ({"delete_local_checkpoint_after_upload": "yes"}, TypeError, "True, False or None, got str"),
    ({"validation": "yes"}, TypeError, "validation=...\\) takes True, False or a sgd.ValidationTaskConfig"),
])
def test_bad_report_options_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        sgd.report({"loss": 1.0}, checkpoint=_ckpt(), **kwargs)


def test_validation_without_a_checkpoint_is_refused():
    with pytest.raises(ValueError, match="validates a checkpoint: pass checkpoint="):
        sgd.report({"loss": 1.0}, validation=True)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"consistency_mode": "EVENTUALLY"}, ValueError, "consistency_mode must be one of"),
    ({"timeout_s": -1}, ValueError, "timeout_s=...\\) must be None or seconds >= 0"),
])
def test_bad_get_all_reported_checkpoints_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        sgd.get_all_reported_checkpoints(**kwargs)


def test_get_all_reported_checkpoints_outside_a_training_function():
    with pytest.raises(RuntimeError, match="get_all_reported_checkpoints.*outside a training function"):
        sgd.get_all_reported_checkpoints()


def test_deleting_a_folder_that_holds_the_run_is_refused(tmp_path):
    target = CheckpointTarget(str(tmp_path / "run" / "checkpoints"), "pickle", "_timestamp")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ValueError, match="inside the reported checkpoint.*delete_local_checkpoint_after_upload=False"):
        check_deletable(sgd.Checkpoint.from_directory(tmp_path / "run"), target)
    (tmp_path / "ckpt").mkdir()
    check_deletable(sgd.Checkpoint.from_directory(tmp_path / "ckpt"), target)  # beside the run: fine


def test_a_good_name_passes():
    assert check_dir_name("epoch_3") == "epoch_3" and check_dir_name(None) is None
    assert check_dir_name("checkpoint_2026-11-29_06-00-00.000001") is not None  # Ray's default form


def test_the_upload_error_pickles():
    exc = pickle.loads(pickle.dumps(CheckpointUploadError("upload failed")))
    assert isinstance(exc, RuntimeError) and "upload failed" in str(exc)


# --- the driver: a name of the user's, numbered all the same ---------------------------------------


def test_a_checkpoint_is_committed_under_its_name_and_keeps_its_number(tmp_path):
    m = _manager(tmp_path)
    first = stage_state(_target(m), {"step": 1})
    assert m.register(Path(first.path), {}, 1, metrics={"step": 1}, name="epoch_1").name == "epoch_1"
    second = stage_state(_target(m), {"step": 2})
    assert m.register(Path(second.path), {}, 2, metrics={"step": 2}).name == "checkpoint_000002"
    meta = json.loads((m.checkpoint_dir / "epoch_1" / METADATA_FILE).read_text())
    assert meta["id"] == 1 and meta["metrics"] == {"step": 1}
    assert [(n, p.name) for n, p in checkpoint_dirs(m.checkpoint_dir)] == [(1, "epoch_1"), (2, "checkpoint_000002")]
    assert m.latest() == {"step": 2}
    # A resumed run finds both, and numbers on after them.
    again = _manager(tmp_path, start_id=2)
    assert again.kept_ids == [1, 2]
    third = stage_state(_target(again), {"step": 3})
    assert again.register(Path(third.path), {}, 3, name="epoch_3").name == "epoch_3" and again.latest_id == 3


def test_a_name_already_used_is_a_clear_error_and_nothing_is_lost(tmp_path):
    m = _manager(tmp_path)
    m.register(Path(stage_state(_target(m), {"step": 1}).path), {}, 1, name="best")
    clash = stage_state(_target(m), {"step": 2})
    with pytest.raises(ValueError, match="checkpoint_dir_name='best'.* checkpoint 1 of this run .*already kept"):
        m.register(Path(clash.path), {}, 2, name="best")
    assert not Path(clash.path).exists() and m.latest() == {"step": 1} and m.kept_ids == [1]
    # The same name at the same report again: an earlier attempt's, redone after a restart.
    redo = stage_state(_target(m), {"step": 1, "redone": True})
    assert m.register(Path(redo.path), {}, 1, name="best").name == "best"
    assert m.latest() == {"step": 1, "redone": True} and m.kept_ids == [2]


def test_the_index_lists_what_is_kept_with_metrics_and_status(tmp_path):
    m = _manager(tmp_path, num_to_keep=2, checkpoint_score_attribute="acc")
    m.set_validation_config(sgd.ValidationConfig(lambda c: {}))
    m.validations = _Submitted()
    for step, acc in [(1, 0.5), (2, 0.9), (3, 0.7)]:
        written = stage_state(_target(m), {"acc": acc})
        m.register(Path(written.path), {"acc": acc}, step, metrics={"acc": acc, "step": step},
                   name=f"epoch_{step}", validation=step == 3)
    entries = read_index(index_path(m.checkpoint_dir).read_bytes())
    # Ray's order: by score, worst first; the worst (epoch_1) was pruned.
    assert [(e["name"], e["status"]) for e in entries] == [("epoch_3", "PENDING_VALIDATION"), ("epoch_2", "COMMITTED")]
    assert entries[1]["metrics"] == {"acc": 0.9, "step": 2}
    assert not (m.checkpoint_dir / "epoch_1").exists()


def test_an_index_of_a_newer_sgd_is_refused():
    with pytest.raises(ValueError, match="newer sgd"):
        read_index(json.dumps({"version": 99, "checkpoints": []}).encode())
    assert read_index(None) == []


def test_a_directory_checkpoint_keeps_its_files_under_its_name(tmp_path):
    m = _manager(tmp_path)
    source = tmp_path / "model"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"\x00\x01")
    written = stage_directory(_target(m), str(source))
    final = m.register(Path(written.path), {}, 1, metrics={"loss": 0.1}, name="model_final")
    assert (final / "weights.bin").read_bytes() == b"\x00\x01" and final.name == "model_final"


# --- validations: the driver's bookkeeping --------------------------------------------------------


class _Submitted:
    """Stands in for the Ray tasks of :class:`sgd.storage.validations.Validations`: records what
    the manager hands over (the outcome is then given by the test, as the background thread would)."""

    def __init__(self):
        self.submitted = []

    def submit(self, kept, spec):
        self.submitted.append((kept, spec))


def test_a_validation_without_a_validation_config_is_refused_and_nothing_is_kept(tmp_path):
    m = _manager(tmp_path)
    written = stage_state(_target(m), {"step": 1})
    with pytest.raises(ValueError, match="the trainer has no validation_config: pass validation_config="):
        m.register(Path(written.path), {}, 1, validation=True)
    assert not Path(written.path).exists() and m.kept_ids == []


def test_a_validated_checkpoint_gets_its_metrics_merged_rescored_and_recorded(tmp_path):
    m = _manager(tmp_path, num_to_keep=1, checkpoint_score_attribute="val")
    m.set_validation_config(sgd.ValidationConfig(lambda c: {}))
    m.validations = submitted = _Submitted()
    spec = sgd.ValidationTaskConfig({"k": 1})
    m.register(Path(stage_state(_target(m), {"w": 1}).path), {"val": 0.0}, 1, metrics={"val": 0.0, "step": 1},
               name="a", validation=spec)
    m.register(Path(stage_state(_target(m), {"w": 2}).path), {"val": 0.5}, 2, metrics={"val": 0.5, "step": 2},
               name="b")
    # 'a' scores worse and num_to_keep=1, but its validation is pending: it is kept until it ends.
    assert m.kept_ids == [1, 2] and submitted.submitted[0][1] is spec
    kept_a = submitted.submitted[0][0]
    m.validated(kept_a, {"val": 0.9}, "VALIDATED")
    entries = {e["name"]: e for e in read_index(index_path(m.checkpoint_dir).read_bytes())}
    assert entries["a"]["status"] == "VALIDATED" and entries["a"]["metrics"] == {"val": 0.9, "step": 1}
    meta = json.loads((m.checkpoint_dir / "a" / METADATA_FILE).read_text())
    assert meta["validation_status"] == "VALIDATED" and meta["score"] == 0.9 and meta["metrics"]["val"] == 0.9
    # Re-scored above 'b': 'b' is the latest, so both stay; a third pushes out the worst.
    m.register(Path(stage_state(_target(m), {"w": 3}).path), {"val": 0.1}, 3, name="c")
    assert sorted(p.name for p in m.checkpoint_dir.iterdir() if not p.name.startswith(".")) == ["a", "c"]


def test_a_failed_validation_keeps_the_metrics_and_says_so(tmp_path):
    m = _manager(tmp_path)
    m.set_validation_config(sgd.ValidationConfig(lambda c: {}))
    m.validations = submitted = _Submitted()
    m.register(Path(stage_state(_target(m), {"w": 1}).path), {}, 1, metrics={"step": 1}, validation=True)
    m.validated(submitted.submitted[0][0], {}, "VALIDATION_FAILED")
    [entry] = read_index(index_path(m.checkpoint_dir).read_bytes())
    assert entry["status"] == "VALIDATION_FAILED" and entry["metrics"] == {"step": 1}


def test_rays_own_validation_configs_are_taken():
    from ray.train import ValidationConfig as RayConfig
    from ray.train import ValidationTaskConfig as RayTask

    def fn(checkpoint):
        return {}

    config = sgd.ValidationConfig.of(RayConfig(fn, task_config=RayTask(fn_kwargs={"a": 1}, timeout_s=3)))
    assert isinstance(config, sgd.ValidationConfig) and config.fn is fn
    assert config.task_config == sgd.ValidationTaskConfig({"a": 1}, 3)
    assert sgd.ValidationTaskConfig.of(RayTask(fn_kwargs={"b": 2})) == sgd.ValidationTaskConfig({"b": 2})
    with pytest.raises(TypeError, match="validation_config must be an sgd.ValidationConfig"):
        sgd.ValidationConfig.of("validate")


def test_no_upload_takes_a_checkpoint_written_into_the_run_in_place(tmp_path):
    from sgd._worker.uploads import ReportOptions, upload

    m = _manager(tmp_path)
    target = _target(m)
    mine = m.checkpoint_dir / "written_here"
    mine.mkdir(parents=True)
    (mine / "w").write_text("1")
    options = ReportOptions(mode=sgd.CheckpointUploadMode.NO_UPLOAD, dir_name="written_here")
    copies = []
    written = upload(sgd.Checkpoint.from_directory(mine), options, target, copies.append, shares_driver_disk=True)
    assert copies == [] and not mine.exists() and Path(written.path).name.startswith(".tmp_")
    final = m.register(Path(written.path), {}, 1, name=written.name)
    assert final == mine and (final / "w").read_text() == "1"


def test_the_index_says_when_a_commit_is_in_flight(tmp_path):
    from sgd.storage.reported import index_in_flight

    m = _manager(tmp_path)
    written = stage_state(_target(m), {"step": 1})
    m.registering(1)  # the driver says so before the report's results line
    assert index_in_flight(index_path(m.checkpoint_dir).read_bytes())
    m.register(Path(written.path), {}, 1)
    assert not index_in_flight(index_path(m.checkpoint_dir).read_bytes())
    assert [e["id"] for e in read_index(index_path(m.checkpoint_dir).read_bytes())] == [1]


def test_no_upload_without_a_name_keeps_the_folders_own(tmp_path):
    from sgd._worker.uploads import ReportOptions, upload

    m = _manager(tmp_path)
    mine = m.checkpoint_dir / "my_step_7"
    mine.mkdir(parents=True)
    (mine / "w").write_text("7")
    options = ReportOptions(mode=sgd.CheckpointUploadMode.NO_UPLOAD)
    written = upload(sgd.Checkpoint.from_directory(mine), options, _target(m), None, shares_driver_disk=True)
    assert written.name == "my_step_7"
    assert m.register(Path(written.path), {}, 1, name=written.name) == mine


def test_a_validation_an_earlier_attempt_did_not_finish_is_asked_again_on_resume(tmp_path, monkeypatch):
    m = _manager(tmp_path)
    m.set_validation_config(sgd.ValidationConfig(lambda c: {}))
    m.validations = _Submitted()
    spec = sgd.ValidationTaskConfig({"k": 2}, 7)
    m.register(Path(stage_state(_target(m), {"w": 1}).path), {}, 1, name="a", validation=spec)
    m.register(Path(stage_state(_target(m), {"w": 2}).path), {}, 2, name="b")
    # The driver died with 'a' pending: the next run over the same folder validates it again.
    again = _manager(tmp_path, start_id=2)
    calls = []

    class _Recording(_Submitted):
        def __init__(self, *args):
            super().__init__()
            calls.append(self)

    monkeypatch.setattr("sgd.storage.manager.Validations", _Recording)  # no Ray task in the unit tier
    again.set_validation_config(sgd.ValidationConfig(lambda c: {}))
    [(kept, resubmitted)] = calls[0].submitted
    assert kept.path.name == "a" and resubmitted == spec
