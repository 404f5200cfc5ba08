"""What a run costs on a started trainer whose workers sit on other hosts than the driver
(issue 35): what the trainer keeps is made once, and a run sends each worker one start call and
its polls, nothing else. Two nodes of a ``ray.cluster_utils`` cluster: the worker on the second
node counts as a host of its own (another node id), as on a real cluster."""

import os
import time
from pathlib import Path

import pytest
import ray

import sgd

pytestmark = pytest.mark.multinode


@pytest.fixture
def calls(actor_calls):
    """Every actor method call the driver makes, counted by method name."""
    return actor_calls


@pytest.fixture
def servers_started(monkeypatch):
    """How many times a file server for the driver's disk was started."""
    import sgd.group.inputs as inputs

    started = []
    start = inputs.start_server

    def counting(*args, **kwargs):
        started.append(args)
        return start(*args, **kwargs)

    monkeypatch.setattr(inputs, "start_server", counting)
    return started


def _spread_trainer(backend="base"):
    return sgd.Trainer(backend=backend, num_workers=2, placement_strategy="SPREAD")


def _where():
    sgd.report(node=ray.get_runtime_context().get_node_id())
    return sgd.world_rank()


def test_runs_on_a_started_trainer_keep_its_file_server_and_send_one_start_call_per_worker(
        two_node_cluster, calls, servers_started):
    trainer = _spread_trainer()
    trainer.start()
    try:
        # Started with the group (its process comes up while the backend is set up), serving
        # nothing until a run tells it of its folder.
        assert len(servers_started) == 1 and servers_started[0][1:] == ([], [])
        first = trainer.run_iterator(_where)
        nodes = {r["node"] for r in next(first)}
        assert first.get_final_results(force=True) == [0, 1]
        assert len(nodes) == 2  # one worker is on another host than the driver's
        assert len(servers_started) == 1
        for _ in range(2):
            calls.clear()
            assert trainer.run(_where) == [0, 1]
            assert calls["_sgd_start_training"] == 2
            assert calls["_sgd_watch"] == 0  # each worker's poll is its watch
            assert calls["_sgd_execute"] == 0  # the no-op backend has nothing to do per run
            assert calls["allow"] <= 1  # the server is told of the new run's folder, nothing more
            assert set(calls) <= {"_sgd_start_training", "_sgd_poll", "allow"}, calls
        assert len(servers_started) == 1  # the same server for every run of the group
    finally:
        trainer.shutdown()


def _talks(config):
    rank = sgd.world_rank()
    print(f"rank {rank} says hello")
    if config.get("wait_for_own_line"):
        # Without reporting: the line reaches the driver's disk with a poll reply of its own.
        log = Path(config["run_dir"], "logs", f"rank_{rank}.log")
        deadline = time.monotonic() + 30
        while f"rank {rank} says hello" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, f"{log} never got the line"
            time.sleep(0.05)
    print("x" * 100_000)  # more than one flush's worth
    sgd.report(pid=os.getpid())


def test_a_worker_elsewhere_sends_its_output_with_its_polls(two_node_cluster):
    trainer = _spread_trainer()
    trainer.start()
    try:
        trainer.run(_talks)
        logs = trainer.latest_run_dir / "logs"
        for rank in (0, 1):
            text = (logs / f"rank_{rank}.log").read_text()
            assert text.startswith(f"=== rank {rank}: pid ") and f"rank {rank} says hello\n" in text
            assert "x" * 100_000 + "\n" in text
        run_dir = trainer.latest_run_dir.parent / "run_002"
        trainer.run(_talks, config={"wait_for_own_line": True, "run_dir": str(run_dir)})
        assert trainer.latest_run_dir == run_dir
        assert all("says hello" in (run_dir / "logs" / f"rank_{r}.log").read_text() for r in (0, 1))
    finally:
        trainer.shutdown()
