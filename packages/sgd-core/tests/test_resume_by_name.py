"""Resume by name (Ray 2.60): an AIR trainer run again with the same ``RunConfig(name,
storage_path)`` goes on in ``storage_path/name`` from that run's newest checkpoint that verifies,
says so in one log line, and continues its history; a second driver on a run that is still going
is refused, and nothing of the first is touched."""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import ray

import sgd
from sgd import DataParallelTrainer, RunConfig, ScalingConfig
from sgd_testing import sigkill_when, wait_for

LOOP = '''
import json, tempfile, threading
from pathlib import Path
import sgd

def resume_loop(config):
    step = 0
    checkpoint = sgd.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            step = json.loads(Path(d, "state.json").read_text())["step"]
    resumed_from = step
    while step < config["steps"]:
        if step == config.get("block_at"):
            threading.Event().wait()  # hangs here until its driver is killed
        step += 1
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if sgd.world_rank() == 0:
                Path(d, "state.json").write_text(json.dumps({"step": step}))
                checkpoint = sgd.Checkpoint.from_directory(d)
            sgd.report({"step": step, "resumed_from": resumed_from}, checkpoint=checkpoint)
'''
_namespace: dict = {}
exec(LOOP, _namespace)
resume_loop = _namespace["resume_loop"]


def _driver_script(storage, name, config):
    """A driver process that runs the trainer (fit()) against the test's cluster."""
    address = ray.get_runtime_context().gcs_address
    return LOOP + textwrap.dedent(f"""
        import ray
        ray.init(address={address!r})
        from sgd import DataParallelTrainer, RunConfig, ScalingConfig
        DataParallelTrainer(resume_loop, train_loop_config={config!r}, scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name={name!r}, storage_path={str(storage)!r})).fit()
    """)


def _trainer(storage, name, steps, **kwargs):
    return DataParallelTrainer(resume_loop, train_loop_config={"steps": steps},
                               scaling_config=ScalingConfig(num_workers=2),
                               run_config=RunConfig(name=name, storage_path=str(storage)), **kwargs)


def _resume_line(caplog):
    lines = [r.getMessage() for r in caplog.records if "resumes from" in r.getMessage()]
    assert len(lines) == 1, lines
    return lines[0]


def test_running_again_after_the_driver_was_killed_resumes_the_run(ray_cluster, tmp_path, caplog):
    run = tmp_path / "exp"
    sigkill_when(_driver_script(tmp_path, "exp", {"steps": 6, "block_at": 3}),
                 lambda: (run / "checkpoints" / "checkpoint_000003").is_dir(),
                 message="the first driver never wrote checkpoint 3")
    assert not (run / "run_001").exists()  # Ray 2.60's layout: the run is storage_path/name itself

    # The same code again, as after a crash (a resume_from_checkpoint given loses to the run's own).
    with caplog.at_level(logging.INFO, logger="sgd"):
        result = _trainer(tmp_path, "exp", 6, resume_from_checkpoint=sgd.Checkpoint.from_dict({"step": 0})).fit()
    assert result.error is None and Path(result.path) == run
    line = _resume_line(caplog)
    assert "attempt 2 resumes from checkpoint_000003 (iteration 3)" in line and "attempt 1 (driver pid" in line
    frame = result.metrics_dataframe
    # One continuous history: the first driver's three reports, then the resumed run's, none twice.
    assert list(frame["step"]) == [1, 2, 3, 4, 5, 6]
    assert list(frame["_training_iteration"]) == [1, 2, 3, 4, 5, 6]
    assert list(frame["resumed_from"]) == [0, 0, 0, 3, 3, 3]
    with result.checkpoint.as_directory() as d:
        assert json.loads(Path(d, "state.json").read_text()) == {"step": 6}
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "FINISHED" and status["attempt"] == 2 and status["pid"] == os.getpid()
    assert sgd.Result.from_path(run).metrics["step"] == 6
    assert DataParallelTrainer.can_restore(run)


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one_that_verifies(ray_cluster, tmp_path, caplog):
    first = _trainer(tmp_path, "exp", 3).fit()
    assert first.error is None and list(first.metrics_dataframe["step"]) == [1, 2, 3]
    latest = Path(first.path) / "checkpoints" / "checkpoint_000003" / "state.json"
    latest.write_text(json.dumps({"step": 30}))  # altered after it was written

    with caplog.at_level(logging.INFO, logger="sgd"):
        result = _trainer(tmp_path, "exp", 5).fit()
    assert result.error is None and result.path == first.path
    line = _resume_line(caplog)
    assert "resumes from checkpoint_000002 (iteration 2)" in line and "FINISHED" in line
    assert "passed over: checkpoint_000003:" in line and "state.json" in line
    frame = result.metrics_dataframe
    # Step 3, redone from checkpoint 2, is not reported twice.
    assert list(frame["step"]) == [1, 2, 3, 4, 5] and list(frame["resumed_from"]) == [0, 0, 0, 2, 2]
    with result.checkpoint.as_directory() as d:
        assert json.loads(Path(d, "state.json").read_text()) == {"step": 5}


def test_a_second_driver_on_a_running_run_is_refused_and_touches_nothing(ray_cluster, tmp_path):
    run = tmp_path / "busy"
    first = subprocess.Popen([sys.executable, "-c", _driver_script(tmp_path, "busy", {"steps": 3, "block_at": 1})])
    try:
        wait_for(lambda: (run / "checkpoints" / "checkpoint_000001").is_dir() or first.poll() is not None,
                 timeout=120, message="the first driver never wrote checkpoint 1")
        assert first.poll() is None, "the first driver ended early"
        before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}

        with pytest.raises(sgd.RunInUseError) as info:
            _trainer(tmp_path, "busy", 3).fit()
        message = str(info.value)
        assert f"pid {first.pid} on host" in message and str(run) in message
        assert "run again to resume" in message and "RunConfig(name=...)" in message
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
        assert json.loads((run / "status.json").read_text())["pid"] == first.pid
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)

    # The OS let the killed driver's lock go: the next run resumes, nothing blocks it.
    result = _trainer(tmp_path, "busy", 3).fit()
    assert result.error is None and list(result.metrics_dataframe["step"]) == [1, 2, 3]
    assert list(result.metrics_dataframe["resumed_from"]) == [0, 1, 1]
