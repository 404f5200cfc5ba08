"""Seeing where workers are: ``Trainer.stacks()`` and the hang watchdog."""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
import threading
import time
from pathlib import Path

import pytest

import sgd
from sgd.run.health import stragglers_of
from sgd_testing import wait_for


def _park_on_rank_0(folder):
    Path(folder, "parked_0").touch()
    wait_for(lambda: os.path.exists(os.path.join(folder, "release")), timeout=120)


def _park_on_rank_1(folder):
    Path(folder, "parked_1").touch()
    wait_for(lambda: os.path.exists(os.path.join(folder, "release")), timeout=120)


def _parks(config):
    (_park_on_rank_0 if sgd.world_rank() == 0 else _park_on_rank_1)(config["folder"])
    sgd.report(done=True)


def test_stacks_show_where_each_worker_is_while_the_function_runs(base_trainer, tmp_path):
    folder = str(tmp_path)
    runner = threading.Thread(target=base_trainer.run, args=(_parks,), kwargs={"config": {"folder": folder}})
    runner.start()
    try:
        wait_for(lambda: all(os.path.exists(os.path.join(folder, f"parked_{r}")) for r in (0, 1)), timeout=60)
        stacks = base_trainer.stacks()
    finally:
        Path(folder, "release").touch()
        runner.join(timeout=60)
    assert len(stacks) == 2
    for rank, text in enumerate(stacks):
        assert text.startswith(f"=== rank {rank} (pid ")
        assert "--- thread 'sgd-train' ---" in text  # the training thread, first
        assert f"in _park_on_rank_{rank}" in text and f"in _park_on_rank_{1 - rank}" not in text
        assert "in wait_for" in text  # down to the innermost frame


def test_sgd_stacks_asks_a_running_job_from_another_process(base_trainer, tmp_path, capsys):
    import subprocess
    import sys

    folder = str(tmp_path)
    runner = threading.Thread(target=base_trainer.run, args=(_parks,), kwargs={"config": {"folder": folder}})
    runner.start()
    try:
        wait_for(lambda: all(os.path.exists(os.path.join(folder, f"parked_{r}")) for r in (0, 1)), timeout=60)
        run_dir = base_trainer.latest_run_dir
        # Another process, as from another terminal: it only needs to see the run directory.
        out = subprocess.run([sys.executable, "-m", "sgd", "stacks", str(run_dir), "--timeout", "30"],
                             capture_output=True, text=True, timeout=120)
    finally:
        Path(folder, "release").touch()
        runner.join(timeout=60)
    assert out.returncode == 0, out.stderr
    assert "=== rank 0 (pid " in out.stdout and "in _park_on_rank_0" in out.stdout
    assert "=== rank 1 (pid " in out.stdout and "in _park_on_rank_1" in out.stdout
    assert not (run_dir / "stacks.request").exists()
    # A run that has ended has no workers to ask: said, not waited for.
    from sgd import cli

    assert cli.main(["stacks", str(run_dir)]) == 2
    assert "is not running (its status is FINISHED)" in capsys.readouterr().err


def test_stacks_need_a_started_trainer():
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=1, logdir=tempfile.mkdtemp())
    with pytest.raises(RuntimeError, match=r"needs started workers: call trainer.start\(\) first"):
        trainer.stacks()


def _stuck_forever(marker):
    wait_for(lambda: os.path.exists(marker + ".never"), timeout=300)


def _one_rank_hangs_once(config):
    marker = config["marker"]
    for step in (1, 2):
        if step == 1 and sgd.world_rank() == 1 and not os.path.exists(marker):
            Path(marker).touch()
            _stuck_forever(marker)  # rank 0 waits for it at the checkpoint below
        sgd.report(step=step)
        sgd.save_checkpoint(step=step)
    return sgd.world_rank()


def test_a_hang_names_the_straggler_logs_every_stack_and_the_restart_recovers(ray_cluster, tmp_path, caplog):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, max_retries=1, logdir=tmp_path / "runs",
                          hang_timeout_s=5)
    trainer.start()
    rounds = []

    class Rounds(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            rounds.append(results[0]["step"])

    try:
        with caplog.at_level(logging.WARNING, logger="sgd"):
            assert trainer.run(_one_rank_hangs_once, config={"marker": str(tmp_path / "hung")},
                               callbacks=[Rounds()]) == [0, 1]
    finally:
        trainer.shutdown()
    logged = caplog.text
    assert "no worker sent a report, a checkpoint or its end for 5 s" in logged
    assert "Not where the others are: rank 1 (1 of 2 ranks sent fewer reports" in logged
    assert "in _stuck_forever" in logged and "=== rank 0 (pid" in logged  # every worker's stack
    assert "restarting the workers from the latest checkpoint (failure 1 of 1)" in logged
    assert rounds == [1, 2]  # the restart redid step 1, reported once


def test_without_retries_the_hang_error_carries_the_stacks_and_pickles(ray_cluster, tmp_path):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, max_retries=0, logdir=tmp_path / "runs",
                          hang_timeout_s=5)
    trainer.start()
    try:
        with pytest.raises(sgd.TrainingFailedError) as info:
            trainer.run(_one_rank_hangs_once, config={"marker": str(tmp_path / "hung")})
        assert trainer.run(_one_rank_hangs_once, config={"marker": str(tmp_path / "hung")}) == [0, 1]
    finally:
        trainer.shutdown()
    hang = info.value.__cause__
    assert isinstance(hang, sgd.TrainingHangError) and isinstance(hang, sgd.WorkerDiedError)
    assert hang.stragglers == [1] and "in _stuck_forever" in hang.stacks[1]
    again = pickle.loads(pickle.dumps(hang))
    assert type(again) is sgd.TrainingHangError and again.stragglers == [1] and again.stacks == hang.stacks


def test_stragglers_by_reports_then_by_place():
    def stack(rank, where):
        return f"=== rank {rank} (pid 1 on h) ===\n--- thread 'sgd-train' ---\n  File \"t.py\", line {where}, in f\n"

    assert stragglers_of([3, 2, 3], [])[0] == [1]
    ranks, where = stragglers_of([2, 2, 2], [stack(0, 10), stack(1, 10), stack(2, 20)])
    assert ranks == [2] and 'rank 2 at File "t.py", line 20, in f' in where and "line 10" in where
    assert stragglers_of([2, 2], [stack(0, 10), stack(1, 10)]) == ([], "")


@pytest.mark.parametrize("bad", [0, -1, "soon", True])
def test_hang_timeout_must_be_positive_seconds(bad):
    with pytest.raises(ValueError, match="hang_timeout_s must be a number of seconds > 0 or None"):
        sgd.Trainer(backend=sgd.BackendConfig(), hang_timeout_s=bad)
    from sgd.air import FailureConfig

    with pytest.raises(ValueError, match="hang_timeout_s must be a number of seconds > 0 or None"):
        FailureConfig(hang_timeout_s=bad)


def _three_checkpoints(config):
    state = sgd.load_checkpoint() or {"step": 0}
    for step in range(state["step"] + 1, 4):
        sgd.report(step=step)
        sgd.save_checkpoint(step=step)


def test_ctrl_c_while_a_checkpoint_is_written_leaves_the_previous_one_the_latest(base_trainer, monkeypatch):
    """Ctrl-C reaches the driver while it writes checkpoint 2 (forced: the write's first fsync
    raises KeyboardInterrupt): nothing of it stays, checkpoint 1 is the latest, the trainer goes on."""
    import json

    import sgd.storage.manager as manager

    real, calls = manager._fsync_dir, []

    def interrupted(path):
        calls.append(path)
        if len(calls) == 3:  # checkpoint 1: its folder, then the parent; checkpoint 2: its folder
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(manager, "_fsync_dir", interrupted)
    with pytest.raises(KeyboardInterrupt):
        base_trainer.run(_three_checkpoints)
    monkeypatch.setattr(manager, "_fsync_dir", real)
    run_dir = base_trainer.latest_run_dir
    assert base_trainer.latest_checkpoint == {"step": 1}
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint_000001"]
    assert json.loads((run_dir / "status.json").read_text())["status"] == "INTERRUPTED"
    assert base_trainer.run(lambda: sgd.world_rank()) == [0, 1]


_START_THEN_CTRL_C = '''
import signal, sys, time
# What a driver started from a terminal has: Python's SIGINT handler (KeyboardInterrupt), SIGINT
# not blocked. This process was started with SIGINT ignored (see the test), which Python keeps.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

import ray
import sgd
from sgd_testing import wait_for

ray.init(address=sys.argv[1])

def waiting():  # ids of this job's groups that are neither placed nor removed
    return {pid for pid, g in ray.util.placement_group_table().items()
            if g.get("state") not in ("CREATED", "REMOVED")}

before = waiting()
trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=1, logdir=sys.argv[2], placement_timeout_s=120,
                      resources_per_worker={"CPU": 1, "sgd_no_such_resource": 1})
try:
    trainer.start()
except KeyboardInterrupt:
    print("INTERRUPTED", time.monotonic(), flush=True)
wait_for(lambda: not waiting() - before, timeout=30, message="the reservation was not released")
print("RELEASED", flush=True)
try:
    trainer.stacks()
except RuntimeError as exc:
    print("STACKS:", exc, flush=True)
'''


def _sigint_state(pid: int) -> dict:
    """Whether process ``pid`` catches, ignores and blocks SIGINT (its main thread), from /proc."""
    import signal

    fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith(("SigCgt", "SigIgn", "SigBlk")))
    bit = 1 << (signal.SIGINT - 1)
    return {name: bool(int(fields[field], 16) & bit)
            for name, field in (("caught", "SigCgt"), ("ignored", "SigIgn"), ("blocked", "SigBlk"))}


def test_ctrl_c_while_the_workers_start_leaves_no_reservation_behind(ray_cluster, tmp_path):
    """Ctrl-C (SIGINT to a driver process of its own) while ``start()`` waits for its placement
    group (it asks for a resource no node has, so it is certainly waiting): KeyboardInterrupt
    within 5 s, and the reservation is released by sgd while that driver still lives (its
    job ending would remove it too, so the driver checks before it exits).

    The driver is started with SIGINT ignored, always, and installs Python's handler itself.
    A process started in the background by a non-interactive shell (``nox -s tests > log &``)
    has SIGINT ignored, an ignored signal stays ignored across fork and exec, and Python then
    installs no handler of its own: that is how this test's driver came to ignore the SIGINT
    in full-suite runs (started in the background) and not alone (in a terminal). Starting it
    that way every time makes its outcome the same wherever pytest runs (docs/debugging.md).
    """
    import signal
    import subprocess
    import sys

    import ray

    def waiting():
        return {pid for pid, g in ray.util.placement_group_table().items()
                if g.get("state") not in ("CREATED", "REMOVED")}

    before = waiting()
    ignoring = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]
    proc = subprocess.Popen([*ignoring, sys.executable, "-c", _START_THEN_CTRL_C,
                             ray.get_runtime_context().gcs_address, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: waiting() - before or proc.poll() is not None, timeout=60,
                 message="the driver's start() never asked for its placement group")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if sys.platform == "linux":
            assert _sigint_state(proc.pid) == {"caught": True, "ignored": False, "blocked": False}
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    interrupted = [line for line in out.splitlines() if line.startswith("INTERRUPTED")]
    assert interrupted and float(interrupted[0].split()[1]) - sent < 5, out
    assert "RELEASED" in out and "STACKS: " in out and "needs started workers" in out, out
