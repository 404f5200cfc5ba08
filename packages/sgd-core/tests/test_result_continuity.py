"""Nothing reported is lost, nothing is delivered twice, across sgd's own retries (max_retries).

A property-based test (Hypothesis) kills one worker once, at every position of a run (each
step, before or after its first call), in each order a training function pairs its reports and
checkpoints (report then save, save then report, ``sgd.report(metrics, checkpoint=...)``), and
compares what the driver delivered with the run that did not fail: the same rows, the same
``_training_iteration`` 1..N, the same last checkpoint.

Where the failing worker's last call before it dies is a report (no synchronisation after it),
the other worker makes that same report only once the failing one is gone: the failure reaches
the driver before the row it would have completed. A user error (not retried) is forced the same
way: the rows every worker reported before it are delivered first.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import sgd
from sgd_testing import wait_for

STEPS = 4
ORDERS = ("report_then_save", "save_then_report", "explicit")


def _train(config):
    order, fail_step, phase, fail_rank = config["order"], config["step"], config["phase"], config["rank"]
    marker = config["marker"]
    rank = sgd.world_rank()
    if order == "explicit":
        ckpt = sgd.get_checkpoint()
        state = ckpt.to_dict() if ckpt else None
    else:
        state = sgd.load_checkpoint()
    start = state["step"] + 1 if state else 0
    failing = rank == fail_rank and not os.path.exists(marker)

    def fail_here(where):
        if failing and (fail_step, phase) == where:
            Path(marker).touch()
            if config.get("raise"):
                raise RuntimeError(f"injected failure at step {fail_step}, phase {phase}")
            os._exit(1)  # a death: sgd restarts the workers (max_retries)

    def report(step):
        # The race: the failing worker's last call was this report; the other one reports
        # only after it raised.
        racing = (order, phase) in (("save_then_report", 0), ("report_then_save", 1))
        target = fail_step - 1 if order == "save_then_report" else fail_step
        if racing and rank != fail_rank and step == target and not os.path.exists(marker + ".done"):
            wait_for(lambda: os.path.exists(marker), timeout=20, message=f"{marker} did not appear")
            Path(marker + ".done").touch()
        sgd.report(step=step, resumed_from=start)

    for step in range(start, STEPS):
        fail_here((step, 0))
        if order == "explicit":
            sgd.report({"step": step, "resumed_from": start}, checkpoint=sgd.Checkpoint.from_dict({"step": step}))
            continue
        if order == "report_then_save":
            report(step)
            fail_here((step, 1))
            sgd.save_checkpoint(step=step)
        else:
            sgd.save_checkpoint(step=step)
            fail_here((step, 1))
            report(step)
    return rank


@pytest.fixture(scope="module")
def retrying_trainer():
    from sgd_testing.fixtures import _start_local_ray

    _start_local_ray()
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, max_retries=3,
                          logdir=tempfile.mkdtemp(prefix="sgd_continuity_"))
    trainer.start()
    yield trainer
    trainer.shutdown()


class _Rows(sgd.TrainingCallback):
    def __init__(self):
        self.rows = []

    def handle_result(self, results, **info):
        self.rows.append(results)


def _run(trainer, config):
    rows = _Rows()
    trainer.run(_train, config=config, callbacks=[rows])
    return rows.rows


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.sampled_from(ORDERS), step=st.integers(0, STEPS - 1), phase=st.integers(0, 1), rank=st.integers(0, 1))
# The two forced races, and a failure right after the first checkpoint of each order, always.
@example(order="save_then_report", step=2, phase=0, rank=1)
@example(order="report_then_save", step=2, phase=1, rank=1)
@example(order="save_then_report", step=1, phase=1, rank=0)
@example(order="report_then_save", step=1, phase=0, rank=0)
@example(order="explicit", step=2, phase=0, rank=1)
def test_a_run_that_failed_and_recovered_delivers_what_a_run_that_did_not_would(retrying_trainer, order, step,
                                                                                 phase, rank):
    if order == "explicit" and phase == 1:
        phase = 0  # one call per step
    marker = tempfile.mktemp(prefix="sgd_failed_once_")
    config = {"order": order, "step": step, "phase": phase, "rank": rank, "marker": marker}
    rounds = _run(retrying_trainer, config)
    assert os.path.exists(marker), "the failure was injected"
    for r in rounds:
        assert len(r) == 2 and r[0]["step"] == r[1]["step"]
    assert [r[0]["step"] for r in rounds] == list(range(STEPS))  # none lost, none twice
    assert [r[0]["_training_iteration"] for r in rounds] == list(range(1, STEPS + 1))
    # The same rows in the run's results.jsonl, and its checkpoint the last step's.
    lines = (retrying_trainer.latest_run_dir / "results.jsonl").read_text().splitlines()
    assert [eval_step(line) for line in lines] == list(range(STEPS))
    assert retrying_trainer.latest_checkpoint == {"step": STEPS - 1}
    # The retry resumed from the newest checkpoint that went with a delivered report: only
    # steps after it were redone, and their rows were not delivered again.
    resumed = {r[0]["resumed_from"] for r in rounds}
    assert resumed <= {0, max(resumed)}


def test_rows_every_worker_reported_before_a_user_error_are_delivered_first(retrying_trainer):
    """A user error is not retried: it is raised, after the rows made before it. Rank 1 raises
    right after its report of step 2; rank 0 makes that report only once rank 1 has raised."""
    marker = tempfile.mktemp(prefix="sgd_failed_once_")
    config = {"order": "report_then_save", "step": 2, "phase": 1, "rank": 1, "marker": marker, "raise": True}
    rows = _Rows()
    with pytest.raises(RuntimeError, match="injected failure at step 2"):
        retrying_trainer.run(_train, config=config, callbacks=[rows])
    assert [r[0]["step"] for r in rows.rows] == [0, 1, 2]
    lines = (retrying_trainer.latest_run_dir / "results.jsonl").read_text().splitlines()
    assert [eval_step(line) for line in lines] == [0, 1, 2]
    assert retrying_trainer.latest_checkpoint == {"step": 1}


def eval_step(line):
    import json

    return json.loads(line)[0]["step"]


@pytest.mark.parametrize("order,step,phase", [("save_then_report", 1, 1), ("report_then_save", 2, 1),
                                              ("explicit", 2, 0)])
def test_fit_recovers_with_the_same_rows_as_a_run_that_did_not_fail(ray_cluster, tmp_path, order, step, phase):
    """The AIR path (``DataParallelTrainer(...).fit()`` with ``FailureConfig(max_failures=...)``)."""
    from sgd.air import DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig

    marker = str(tmp_path / "failed_once")
    result = DataParallelTrainer(
        _train, train_loop_config={"order": order, "step": step, "phase": phase, "rank": 1, "marker": marker},
        backend_config=sgd.BackendConfig(), scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path / "results"), failure_config=FailureConfig(max_failures=2)),
    ).fit()
    assert os.path.exists(marker)
    df = result.metrics_dataframe
    assert list(df["step"]) == list(range(STEPS))
    assert list(df["_training_iteration"]) == list(range(1, STEPS + 1))
