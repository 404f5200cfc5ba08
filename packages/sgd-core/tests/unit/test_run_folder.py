"""Where a run lives, without Ray: both layouts resolved (``storage_path/name`` and the older
``name/run_NNN``), a folder that holds no run and one a newer sgd wrote refused with a clear
error, the driver's lock on a run folder, attempts counted, and a resumed run's one log line
(the newest checkpoint that verifies, a corrupt newer one passed over)."""

import json
import logging
import os
import pickle
from pathlib import Path

import pyarrow.fs
import pytest

import sgd
from sgd import runs
from sgd._common.protocol import CheckpointTarget
from sgd.air.run_folder import run_folder
from sgd.storage.lock import LOCK_FILE, RunLock, check_free
from sgd.storage.run_dir import RunDirectory
from sgd.storage.staging import stage_state
from sgd.trainer.run_dirs import mirror_for, open_run, resume_state


def _write_run(path: Path, steps=(1, 2), **settings) -> Path:
    """A run folder as a driver leaves it: trainer.json, results, status."""
    run = RunDirectory.create(path)
    run.write_settings({"backend": "base", **settings})
    for step in steps:
        run.append_line(json.dumps([{"step": step, "_training_iteration": step}]))
    run.close(error=False)
    return path


# --- layouts -------------------------------------------------------------------------------


def test_a_named_run_folder_and_an_old_experiment_folder_both_resolve(tmp_path):
    named = _write_run(tmp_path / "exp")
    assert runs.find_run(named) == named.resolve()
    old = tmp_path / "old_exp"
    for n in (1, 2, 10):
        _write_run(old / f"run_{n:03d}", steps=range(1, n + 1))
    assert runs.find_run(old) == (old / "run_010").resolve()  # the latest, by number
    assert runs.find_run(old / "run_002") == (old / "run_002").resolve()
    result = sgd.Result.from_path(old)
    assert Path(result.path) == (old / "run_010").resolve() and result.metrics["step"] == 10
    assert sgd.Result.from_path(named).metrics["step"] == 2


@pytest.mark.parametrize("what", ["empty", "missing", "file", "other files"])
def test_a_folder_that_holds_no_run_is_a_clear_error_never_an_empty_result(tmp_path, what):
    path = tmp_path / "nothing"
    if what == "empty":
        path.mkdir()
    elif what == "file":
        path.write_text("x")
    elif what == "other files":
        (path / "run_001").mkdir(parents=True)  # a numbered folder with no run in it
        (path / "notes.txt").write_text("x")
    with pytest.raises(sgd.RunNotFoundError) as info:
        sgd.Result.from_path(path)
    message = str(info.value)
    assert str(path) in message and "trainer.json" in message and "checkpoints/" in message
    # Code written for Ray (RuntimeError) or for a plain missing path (FileNotFoundError) catches it.
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, FileNotFoundError)
    assert not sgd.DataParallelTrainer.can_restore(path)
    with pytest.raises(FileNotFoundError, match="not an sgd run"):
        sgd.DataParallelTrainer.restore(path)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is sgd.RunNotFoundError and str(again) == message


def test_a_run_written_by_a_newer_sgd_is_refused_by_every_reader(tmp_path):
    run = _write_run(tmp_path / "exp")
    settings = json.loads((run / "trainer.json").read_text())
    assert settings["format_version"] == runs.RUN_FORMAT_VERSION and settings["sgd_version"]
    settings.update(format_version=runs.RUN_FORMAT_VERSION + 1, sgd_version="9.0.0")
    (run / "trainer.json").write_text(json.dumps(settings))
    for read in (sgd.Result.from_path, sgd.DataParallelTrainer.restore, sgd.Trainer.restore,
                 lambda p: RunDirectory(p).take()):
        with pytest.raises(sgd.RunFormatError, match=r"newer sgd \(9\.0\.0, run format 2\).*up to 1.*pip install -U"):
            read(run)
    assert not sgd.DataParallelTrainer.can_restore(run)
    assert json.loads((run / "status.json").read_text())["status"] == "FINISHED"  # nothing written
    assert not (run / LOCK_FILE).exists() or check_free(run) is None  # the lock was let go


def test_a_run_without_a_format_version_is_format_1(tmp_path):
    run = _write_run(tmp_path / "exp")
    settings = json.loads((run / "trainer.json").read_text())
    del settings["format_version"], settings["layout"]
    (run / "trainer.json").write_text(json.dumps(settings))
    assert sgd.Result.from_path(run).metrics["step"] == 2


def test_result_from_path_takes_ray_s_storage_filesystem_argument(tmp_path):
    run = _write_run(tmp_path / "exp")
    local = pyarrow.fs.LocalFileSystem()
    assert sgd.Result.from_path(str(run), local).metrics["step"] == 2
    assert sgd.Result.from_path("exp", pyarrow.fs.SubTreeFileSystem(str(tmp_path), local)).metrics["step"] == 2
    assert sgd.Result.from_path(run.as_uri()).metrics["step"] == 2
    with pytest.raises(ValueError, match="mirrors only its checkpoints.*result.path"):
        sgd.Result.from_path("s3://bucket/exp")
    with pytest.raises(ValueError, match="not from _MockFileSystem"):
        sgd.Result.from_path("exp", pyarrow.fs._MockFileSystem())


# --- where an AIR trainer's run goes ---------------------------------------------------------


def test_the_air_run_folder_is_storage_path_slash_name(tmp_path, monkeypatch):
    monkeypatch.setenv("SGD_RESULTS_DIR", str(tmp_path / "results"))
    assert run_folder("T", sgd.RunConfig(name="exp", storage_path=str(tmp_path))) == (tmp_path / "exp", None)
    folder, mirror = run_folder("T", sgd.RunConfig(name="exp", storage_path="s3://bucket/prefix"))
    assert (folder, mirror) == (tmp_path / "results" / "exp", "s3://bucket/prefix")
    assert mirror_for(mirror, folder, named=True) == "s3://bucket/prefix/exp/checkpoints"
    assert mirror_for(mirror, folder / "run_002", named=False) == "s3://bucket/prefix/exp/run_002/checkpoints"
    # Numbered (sgd-tune's trials): the folder of the run_NNN, as it is.
    assert run_folder("T", sgd.RunConfig(name="sgd", storage_path=str(tmp_path)), numbered_runs=True)[0] == \
        tmp_path / "sgd"
    # An experiment of the older layout under the name: its latest run is continued in place.
    _write_run(tmp_path / "old" / "run_001")
    _write_run(tmp_path / "old" / "run_002")
    assert run_folder("T", sgd.RunConfig(name="old", storage_path=str(tmp_path)))[0] == tmp_path / "old" / "run_002"


def test_runs_without_a_name_never_share_a_folder(tmp_path):
    config = sgd.RunConfig(storage_path=str(tmp_path))
    folders = [run_folder("TorchTrainer", config)[0] for _ in range(3)]
    assert len(set(folders)) == 3 and all(f.is_dir() and f.name.startswith("TorchTrainer_") for f in folders)


def test_trainer_run_dir_goes_with_its_parent_as_logdir(tmp_path):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=0, run_dir=tmp_path / "exp")
    assert trainer.run_dir == (tmp_path / "exp").resolve() and trainer.logdir == tmp_path.resolve()
    with pytest.raises(ValueError, match="is not the parent of run_dir"):
        sgd.Trainer(backend=sgd.BackendConfig(), num_workers=0, run_dir=tmp_path / "exp", logdir=tmp_path / "x")


# --- the driver's lock ----------------------------------------------------------------------


def test_a_second_driver_on_a_held_run_is_refused_before_it_writes_anything(tmp_path):
    run = _write_run(tmp_path / "exp")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != LOCK_FILE}
    first = RunLock.acquire(run)
    try:
        # flock belongs to an open file: a second open in this same process is refused too.
        for second in (lambda: RunDirectory(run).take(), lambda: check_free(run), lambda: RunLock.acquire(run)):
            with pytest.raises(sgd.RunInUseError) as info:
                second()
            assert f"pid {os.getpid()}" in str(info.value) and str(run) in str(info.value)
            assert "RunConfig(name=...)" in str(info.value)
        after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != LOCK_FILE}
        assert after == before
        assert type(pickle.loads(pickle.dumps(info.value))) is sgd.RunInUseError
    finally:
        first.release()
    RunLock.acquire(run).release()  # free again once let go


def test_a_run_counts_its_attempts_and_keeps_what_the_previous_driver_left(tmp_path):
    path = _write_run(tmp_path / "exp")
    assert json.loads((path / "status.json").read_text())["attempt"] == 1
    run = RunDirectory.open(path)
    run.take()
    try:
        assert run.attempt == 2 and run.previous["status"] == "FINISHED" and run.previous["pid"] == os.getpid()
        with pytest.raises(sgd.RunInUseError):
            RunDirectory.create(path)
    finally:
        run.close(error=True)
    assert json.loads((path / "status.json").read_text())["attempt"] == 2
    RunLock.acquire(path).release()  # close() let it go


# --- a run resumed: which checkpoint, said once ---------------------------------------------


def _checkpoint(manager, state, iteration):
    target = CheckpointTarget(str(manager.checkpoint_dir), manager.codec, manager.strategy.checkpoint_score_attribute)
    return manager.register(Path(stage_state(target, state).path), {}, iteration)


def _open(path, **kw):
    return open_run(None, path.parent, kw.pop("storage", None), sgd.CheckpointStrategy(), "sgd", None,
                    named=path)


def test_a_named_run_resumes_from_its_newest_checkpoint_that_verifies_and_says_so(tmp_path, caplog):
    path = tmp_path / "exp"
    run, manager = _open(path, storage="s3://bucket/prefix")
    assert run.previous is None and run.named and manager.mirror == "s3://bucket/prefix/exp/checkpoints"
    manager.mirror = None  # nothing to copy to here
    run.write_settings({"backend": "base"})
    for step in (1, 2, 3):
        run.append_line(json.dumps([{"step": step, "_training_iteration": step}]))
        _checkpoint(manager, {"step": step}, step)
    run.close(error=True)
    # The newest checkpoint is damaged after the driver died.
    newest = path / "checkpoints" / "checkpoint_000003"
    state_file = next(p for p in newest.iterdir() if p.name != "metadata.json")
    state_file.write_bytes(state_file.read_bytes() + b"x")

    run, manager = _open(path, storage="s3://bucket/prefix")
    assert run.named and run.attempt == 2 and manager.mirror == "s3://bucket/prefix/exp/checkpoints"
    with caplog.at_level(logging.INFO, logger="sgd"):
        state = resume_state(run, manager)
    run.close(error=False)
    assert state == {"step": 2} and manager.latest_iteration == 2 and manager.latest_id == 3
    line = next(r.getMessage() for r in caplog.records if "resumes from" in r.getMessage())
    assert "attempt 2 resumes from checkpoint_000002 (iteration 2)" in line
    assert f"attempt 1 (driver pid {os.getpid()}" in line and "ERRORED" in line
    assert "passed over: checkpoint_000003:" in line


def test_a_named_run_with_no_checkpoint_starts_over_and_says_so(tmp_path, caplog):
    path = _write_run(tmp_path / "exp", steps=(1, 2))
    run, manager = _open(path)
    with caplog.at_level(logging.INFO, logger="sgd"):
        assert resume_state(run, manager) is None
    run.close(error=False)
    assert any("has no checkpoint" in r.getMessage() and "2 reports" in r.getMessage() for r in caplog.records)


def test_a_named_run_none_of_whose_checkpoints_verifies_says_how_to_start_over(tmp_path):
    path = tmp_path / "exp"
    run, manager = _open(path)
    run.write_settings({"backend": "base"})
    run.append_line(json.dumps([{"step": 1, "_training_iteration": 1}]))
    written = _checkpoint(manager, {"step": 1}, 1)
    run.close(error=False)
    state_file = next(p for p in written.iterdir() if p.name != "metadata.json")
    state_file.write_bytes(b"damaged")
    run, manager = _open(path)
    with pytest.raises(sgd.CheckpointIntegrityError, match=r"another folder \(RunConfig\(name=...\)\)"):
        resume_state(run, manager)
    run.close(error=True)
