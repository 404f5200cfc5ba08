"""Ray 2.60's ``report`` options on a real run of two workers: checkpoints committed under their
own folder names, ``get_all_reported_checkpoints``, ``ASYNC`` uploads that really run while
training goes on (and fail the run when they fail, the previous checkpoint staying the latest),
``checkpoint_upload_fn``, and asynchronous validation."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import sgd
from sgd import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig

TWO = ScalingConfig(num_workers=2)
ASYNC = sgd.CheckpointUploadMode.ASYNC


def _fit(loop, tmp_path, **kwargs):
    """The run's ``Result`` and its error, whether ``fit()`` raises it (Ray 2.60) or sets it."""
    kwargs.setdefault("scaling_config", TWO)
    kwargs.setdefault("run_config", RunConfig(storage_path=str(tmp_path), name="run"))
    try:
        result = DataParallelTrainer(loop, **kwargs).fit()
    except Exception as exc:  # the error is what the test looks at
        return getattr(exc, "result", None), exc
    return result, result.error


def _chain(exc):
    text = []
    while exc is not None:
        text.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(text)


def _folder(**files):
    path = tempfile.mkdtemp(prefix="ckpt_")
    for name, content in files.items():
        Path(path, name).write_text(content)
    return path


def _checkpoints(result):
    return Path(result.path) / "checkpoints" if (Path(result.path) / "checkpoints").is_dir() else None


def test_named_checkpoints_and_all_reported_checkpoints(ray_cluster, tmp_path):
    def loop():
        rank = sgd.get_context().get_world_rank()
        sgd.report({"epoch": 0}, checkpoint=Checkpoint.from_directory(_folder(**{f"r{rank}": "0"})),
                   checkpoint_dir_name="epoch_0")
        # Only rank 0 passes one (Ray's usual pattern); the other ranks' reports carry none.
        sgd.report({"epoch": 1}, checkpoint=Checkpoint.from_directory(_folder(w="1")) if rank == 0 else None,
                   checkpoint_dir_name="epoch_1")
        if rank == 1:  # passed none in that round: still sees rank 0's, once the driver committed it
            seen = [Path(r.checkpoint.path).name for r in sgd.get_all_reported_checkpoints("COMMITTED")]
            assert seen == ["epoch_0", "epoch_1"], seen
        sgd.report({"epoch": 2}, checkpoint=Checkpoint.from_dict({"epoch": 2}))  # sgd's numbered name
        reported = sgd.get_all_reported_checkpoints(consistency_mode="COMMITTED")
        assert [Path(r.checkpoint.path).name for r in reported] == ["epoch_0", "epoch_1", "checkpoint_000003"], reported
        assert [r.metrics for r in reported] == [{"epoch": 0}, {"epoch": 1}, {"epoch": 2}]  # as reported (Ray 2.60)
        assert {r.status for r in reported} == {sgd.ReportedCheckpointStatus.COMMITTED}
        if rank == 0:  # every rank's files are merged into the one folder
            assert sorted(os.listdir(reported[0].checkpoint.path)) == [".sgd_checkpoint.json", "r0", "r1"]
        again = sgd.get_all_reported_checkpoints(timeout_s=0)  # nothing pending: at once
        assert [r.checkpoint.path for r in again] == [r.checkpoint.path for r in reported]

    result, error = _fit(loop, tmp_path)
    assert error is None, _chain(error)
    assert Path(result.checkpoint.path).name == "checkpoint_000003"
    assert sorted(p.name for p in _checkpoints(result).iterdir() if not p.name.startswith(".")) == [
        "checkpoint_000003", "epoch_0", "epoch_1"]
    assert [m for _, m in result.best_checkpoints] == [{"epoch": 0}, {"epoch": 1}, {"epoch": 2}]
    assert result.metrics == {"epoch": 2}


def test_a_checkpoint_dir_name_used_twice_fails_the_run_saying_so(ray_cluster, tmp_path):
    def loop():
        for epoch in range(2):
            sgd.report({"epoch": epoch}, checkpoint=Checkpoint.from_dict({"epoch": epoch}), checkpoint_dir_name="last")

    result, error = _fit(loop, tmp_path)
    assert error is not None and "checkpoint_dir_name='last'" in _chain(error), _chain(error)
    assert "give each checkpoint its own" in _chain(error)
    assert result is None or Path(result.checkpoint.path).name == "last"  # the first one is kept


def test_async_upload_runs_while_training_goes_on_in_order_and_lands_before_the_end(ray_cluster, tmp_path):
    def loop():
        events = []
        next_round = threading.Event()
        returned = threading.Event()

        def upload_after_the_next_round(checkpoint, name):
            # Blocks until the loop has reported the next round: a synchronous upload never returns.
            assert next_round.wait(60), "report(ASYNC) waited for its upload"
            events.append(f"uploaded {name}")
            return checkpoint

        def upload_after_the_function_returned(checkpoint, name):
            assert returned.wait(60)
            return checkpoint

        sgd.report({"step": 1}, checkpoint=Checkpoint.from_directory(_folder(w="1")), checkpoint_upload_mode=ASYNC,
                   checkpoint_upload_fn=upload_after_the_next_round, checkpoint_dir_name="step_1")
        sgd.report({"step": 2})
        events.append("reported 2")
        next_round.set()
        reported = sgd.get_all_reported_checkpoints()
        assert events == ["reported 2", "uploaded step_1"], events
        assert [(Path(r.checkpoint.path).name, r.metrics["step"]) for r in reported] == [("step_1", 1)]
        # The last one uploads after the function returned: the run waits for it.
        sgd.report({"step": 3}, checkpoint=Checkpoint.from_directory(_folder(w="3")), checkpoint_upload_mode=ASYNC,
                   checkpoint_upload_fn=upload_after_the_function_returned, checkpoint_dir_name="step_3")
        returned.set()

    result, error = _fit(loop, tmp_path)
    assert error is None, _chain(error)
    assert list(result.metrics_dataframe["step"]) == [1, 2, 3]  # the reports in order
    assert Path(result.checkpoint.path).name == "step_3" and (Path(result.checkpoint.path) / "w").read_text() == "3"
    assert not [p for p in _checkpoints(result).iterdir() if p.name.startswith(".tmp_")]


def test_an_async_upload_that_fails_half_way_fails_the_run_and_the_previous_checkpoint_stays(ray_cluster, tmp_path):
    def loop():
        sgd.report({"step": 1}, checkpoint=Checkpoint.from_directory(_folder(w="1")), checkpoint_dir_name="good")
        broken = _folder(a="written first")
        os.symlink("/nonexistent/file", os.path.join(broken, "b"))  # the copy fails on it, after 'a'
        sgd.report({"step": 2}, checkpoint=Checkpoint.from_directory(broken), checkpoint_upload_mode=ASYNC)
        # Training goes on; the failure ends the run without waiting for another sgd call (as Ray).
        threading.Event().wait(90)
        raise AssertionError("the failed upload did not end the run")

    result, error = _fit(loop, tmp_path)
    text = _chain(error)
    assert "CheckpointUploadError" in text and "asynchronous checkpoint upload failed" in text, text
    assert "did not end the run" not in text
    if result is not None:  # the exception carries the run's result (issue 53): the good one is latest
        assert Path(result.checkpoint.path).name == "good"
    folder = tmp_path / "run"
    names = [p.name for p in folder.rglob("*") if p.parent.name == "checkpoints" and p.is_dir()]
    assert names == ["good"], names


def test_upload_fn_that_writes_into_the_run_is_committed_in_place(ray_cluster, tmp_path):
    def loop():
        def upload(checkpoint, name):
            destination = os.path.join(sgd.session.get_session().checkpoint_dir, name)
            os.makedirs(destination)
            for f in os.listdir(checkpoint.path):
                os.link(os.path.join(checkpoint.path, f), os.path.join(destination, f))
            return Checkpoint.from_directory(destination)

        rank = sgd.get_context().get_world_rank()
        ckpt = Checkpoint.from_directory(_folder(w="1")) if rank == 0 else None
        sgd.report({"step": 1}, checkpoint=ckpt, checkpoint_dir_name="mine", checkpoint_upload_fn=upload,
                   delete_local_checkpoint_after_upload=True)
        if rank == 0:
            assert not os.path.exists(ckpt.path)  # deleted after the upload, as asked
            [reported] = sgd.get_all_reported_checkpoints()
            assert Path(reported.checkpoint.path).name == "mine"

    result, error = _fit(loop, tmp_path)
    assert error is None, _chain(error)
    assert (Path(result.checkpoint.path) / "w").read_text() == "1" and Path(result.checkpoint.path).name == "mine"


def test_upload_fn_returning_something_else_fails_the_run_saying_so(ray_cluster, tmp_path):
    def loop():
        sgd.report({"step": 1}, checkpoint=Checkpoint.from_dict({"w": 1}),
                   checkpoint_upload_fn=lambda checkpoint, name: checkpoint.to_dict())

    _, error = _fit(loop, tmp_path)
    assert "checkpoint_upload_fn must return an sgd.Checkpoint" in _chain(error) and "builtins.dict" in _chain(error)


# --- asynchronous validation (Ray 2.60's ValidationConfig) ----------------------------------------


def _validate(checkpoint, scale=1, wait_for=None, fail=False, hang=False):
    """The validation function: the checkpoint's ``w`` times ``scale``. ``wait_for``: a file the
    training loop creates after its report returned (a validation run inside report never sees it)."""
    import time

    if wait_for is not None:
        deadline = time.monotonic() + 60
        while not os.path.exists(wait_for):
            assert time.monotonic() < deadline, "the training loop did not go on while the validation ran"
            threading.Event().wait(0.05)
    if fail:
        raise RuntimeError("validation failed on purpose")
    if hang:
        threading.Event().wait(120)
    with checkpoint.as_directory() as d:
        return {"val": int(Path(d, "w").read_text()) * scale}


def test_checkpoints_are_validated_asynchronously_and_their_metrics_merged(ray_cluster, tmp_path):
    signal = str(tmp_path / "went_on")

    def loop():
        rank = sgd.get_context().get_world_rank()

        def report(step, validation=False):
            # Only rank 0 passes a checkpoint, and so asks for its validation (Ray refuses
            # validation= without a checkpoint).
            if rank == 0:
                sgd.report({"step": step}, checkpoint=Checkpoint.from_directory(_folder(w=str(step))),
                           checkpoint_dir_name=f"step_{step}", validation=validation)
            else:
                sgd.report({"step": step})

        report(1, validation=sgd.ValidationTaskConfig(fn_kwargs={"wait_for": signal}))
        if rank == 0:
            Path(signal).touch()  # the validation of step 1 waits for this: report did not wait for it
        report(2)  # no validation
        report(3, validation=sgd.ValidationTaskConfig(fn_kwargs={"scale": 10}))
        report(4, validation=sgd.ValidationTaskConfig(fn_kwargs={"fail": True}))
        report(5, validation=sgd.ValidationTaskConfig(fn_kwargs={"hang": True}, timeout_s=1))
        if rank == 0:  # the rank that reported the checkpoints: it waits for them
            reported = sgd.get_all_reported_checkpoints()  # VALIDATED: waits for every validation
            S = sgd.ReportedCheckpointStatus
            assert [(Path(r.checkpoint.path).name, r.status, r.metrics.get("val")) for r in reported] == [
                ("step_1", S.VALIDATED, 1), ("step_2", S.COMMITTED, None), ("step_3", S.VALIDATED, 30),
                ("step_4", S.VALIDATION_FAILED, None), ("step_5", S.VALIDATION_TIMEOUT, None)], reported
            assert reported[2].metrics["step"] == 3  # merged into the report's metrics
        report(6, validation=True)  # validated after the function returned: the run waits for it

    config = sgd.ValidationConfig(_validate, task_config=sgd.ValidationTaskConfig(fn_kwargs={"scale": 1}),
                                  ray_remote_kwargs={"num_cpus": 0})
    result, error = _fit(loop, tmp_path, validation_config=config)
    assert error is None, _chain(error)
    by_name = {Path(c.path).name: m for c, m in result.best_checkpoints}
    assert by_name["step_6"]["val"] == 6 and by_name["step_3"]["val"] == 30 and "val" not in by_name["step_2"]


def test_validation_without_a_validation_config_fails_the_run_saying_so(ray_cluster, tmp_path):
    def loop():
        sgd.report({"step": 1}, checkpoint=Checkpoint.from_dict({"w": 1}), validation=True)

    _, error = _fit(loop, tmp_path)
    assert "the trainer has no validation_config" in _chain(error), _chain(error)
