"""Ray Train 2.x's ``UserCallback`` in ``RunConfig(callbacks=[...])`` with real Ray (issue 53): called
on the driver after every report round and after a worker's failure, by ``fit()``; sgd's and Ray's own
``ray.train.UserCallback`` alike. The controller's side, without Ray: unit/test_user_callbacks.py."""

import json
import tempfile
from pathlib import Path

import pytest
from ray.train.v2.api.callback import UserCallback as RayUserCallback

import sgd
from sgd import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from sgd.errors import ControllerError


class Recorder(sgd.UserCallback):
    def __init__(self, fail_after_report=None):
        self.calls = []
        self.fail_after_report = fail_after_report

    def after_report(self, run_context, metrics, checkpoint):
        self.calls.append(("after_report", run_context, metrics, checkpoint))
        if len([c for c in self.calls if c[0] == "after_report"]) == self.fail_after_report:
            raise ValueError("the callback's own bug")

    def after_exception(self, run_context, worker_exceptions):
        self.calls.append(("after_exception", run_context, worker_exceptions))


class RayRecorder(RayUserCallback):
    """Written for Ray 2.60 against Ray's own base class, passed to sgd unchanged."""

    def __init__(self):
        self.reports = []

    def after_report(self, run_context, metrics, checkpoint):
        self.reports.append((metrics, checkpoint.path if checkpoint else None))


def three_reports(config):
    """Three rounds; rank 0 passes a checkpoint with the second. With ``fail_once``, rank 1 raises
    in round 2 of a run that did not resume from a checkpoint (so only the first attempt does)."""
    resumed = sgd.get_checkpoint()
    start = 1
    if resumed is not None:
        with resumed.as_directory() as d:
            start = json.loads(Path(d, "state.json").read_text())["round"] + 1
    for round_ in range(start, 4):
        if config.get("fail_once") and resumed is None and round_ == 2 and sgd.world_rank() == 1:
            raise ValueError("flaky read on rank 1")
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if sgd.world_rank() == 0 and round_ == config.get("checkpoint_round", 2):
                Path(d, "state.json").write_text(json.dumps({"round": round_}))
                checkpoint = sgd.Checkpoint.from_directory(d)
            sgd.report({"round": round_, "rank": sgd.world_rank()}, checkpoint=checkpoint)


def test_user_callbacks_get_every_round_and_its_persisted_checkpoint(ray_cluster, tmp_path):
    ours, rays = Recorder(), RayRecorder()
    run_config = RunConfig(name="cb", storage_path=str(tmp_path), callbacks=[ours, rays])
    trainer = DataParallelTrainer(three_reports, train_loop_config={"x": 1},
                                  scaling_config=ScalingConfig(num_workers=2), run_config=run_config)
    result = trainer.fit()
    assert [c[0] for c in ours.calls] == ["after_report"] * 3
    assert [c[2] for c in ours.calls] == [[{"round": r, "rank": 0}, {"round": r, "rank": 1}] for r in (1, 2, 3)]
    checkpoints = [c[3] for c in ours.calls]
    assert checkpoints[0] is None and checkpoints[2] is None
    assert checkpoints[1].path == result.checkpoint.path  # the persisted one, not the worker's temporary folder
    with checkpoints[1].as_directory() as d:
        assert json.loads(Path(d, "state.json").read_text()) == {"round": 2}
    context = ours.calls[0][1]
    assert context.run_config is run_config and context.train_loop_config == {"x": 1}
    assert context.scaling_config.num_workers == 2 and context.get_run_config() is run_config
    assert [r[1] for r in rays.reports] == [None, result.checkpoint.path, None]
    assert [m[0]["round"] for m, _ in rays.reports] == [1, 2, 3]


def test_after_exception_names_the_failed_rank_and_the_run_goes_on_when_retried(ray_cluster, tmp_path):
    ours = Recorder()
    trainer = DataParallelTrainer(
        three_reports, train_loop_config={"fail_once": True, "checkpoint_round": 1},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="exc", storage_path=str(tmp_path), callbacks=[ours],
                             failure_config=FailureConfig(max_failures=1)))
    trainer.fit()
    assert [c[0] for c in ours.calls] == ["after_report", "after_exception", "after_report", "after_report"]
    failed = ours.calls[1][2]
    assert list(failed) == [1]
    assert isinstance(failed[1], ValueError) and "flaky read on rank 1" in str(failed[1])
    assert isinstance(failed[1].__cause__, sgd.WorkerError) and failed[1].__cause__.world_rank == 1
    assert [c[2][0]["round"] for c in ours.calls if c[0] == "after_report"] == [1, 2, 3]


def test_a_callback_that_raises_fails_fit_with_a_controller_error(ray_cluster, tmp_path):
    ours = Recorder(fail_after_report=2)
    trainer = DataParallelTrainer(
        three_reports, scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="bug", storage_path=str(tmp_path), callbacks=[ours],
                             failure_config=FailureConfig(max_failures=2)))
    with pytest.raises(ControllerError) as info:
        trainer.fit()
    assert isinstance(info.value.controller_failure, ValueError)
    assert "the callback's own bug" in str(info.value)
    assert [c[0] for c in ours.calls] == ["after_report", "after_report"]  # not retried
