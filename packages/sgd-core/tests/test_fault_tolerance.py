"""Worker processes that die mid-run: detection, restart from the latest checkpoint, retry limits."""

import os
import signal
import socket
import time
from pathlib import Path

import pytest

import sgd
from sgd_testing import KillWorker


def _deterministic(config):
    """w <- 3w+1 mod 1e9+7, one checkpoint and one report per step; returns the final w."""
    state = sgd.load_checkpoint() or {"step": 0, "w": 1}
    step, w = state["step"], state["w"]
    while step < config["steps"]:
        w = (3 * w + 1) % 1_000_000_007
        step += 1
        sgd.report(step=step, w=w, pid=os.getpid(), rank=sgd.world_rank())
        sgd.save_checkpoint(step=step, w=w)
    return w


@pytest.fixture
def trainer_factory(ray_cluster):
    made = []

    def make(**kwargs):
        trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, **kwargs)
        trainer.start()
        made.append(trainer)
        return trainer

    yield make
    for t in made:
        t.shutdown()


def test_restart_resumes_from_latest_checkpoint(trainer_factory):
    expected = trainer_factory().run(_deterministic, config={"steps": 8})
    failures = []

    class Watching(sgd.BackendConfig):
        @property
        def backend_cls(self):
            class Backend(sgd.Backend):
                def on_failure(self, worker_group, backend_config, error):
                    failures.append(type(error).__name__)

            return Backend

    trainer = sgd.Trainer(backend=Watching(), num_workers=2, max_retries=3)
    trainer.start()
    killer = KillWorker(at=[3, 6], key="step")
    start = time.monotonic()
    assert trainer.run(_deterministic, config={"steps": 8}, callbacks=[killer]) == expected
    assert len(killer.killed) == 2
    # Every step reached the callbacks exactly once, in order, with the iteration counter
    # continuing across restarts.
    assert list(zip(killer.values("step"), killer.values("_training_iteration"))) == [(s, s) for s in range(1, 9)]
    assert time.monotonic() - start < 60
    names = sorted(p.name for p in trainer.latest_checkpoint_dir.iterdir())
    assert names == [f"checkpoint_{i:06d}" for i in range(1, 9)]
    assert failures == ["WorkerDiedError", "WorkerDiedError"]  # the backend heard of each failure
    trainer.shutdown()


def test_gives_up_after_max_retries(trainer_factory):
    trainer = trainer_factory(max_retries=1)
    with pytest.raises(sgd.TrainingFailedError, match=r"after 2 attempts \(max_retries=1\)") as info:
        trainer.run(_deterministic, config={"steps": 10}, callbacks=[KillWorker(at=[2, 4], key="step")])
    assert isinstance(info.value.__cause__, sgd.WorkerDiedError)
    assert "worker rank 1 died" in str(info.value)
    # The trainer is usable again afterwards.
    assert trainer.run(lambda: sgd.world_rank()) == [0, 1]


def test_default_is_no_silent_loss_without_retries(trainer_factory):
    trainer = trainer_factory(max_retries=0)
    with pytest.raises(sgd.TrainingFailedError, match="after 1 attempt "):
        trainer.run(_deterministic, config={"steps": 5}, callbacks=[KillWorker(at=[2], key="step")])
    # The checkpoints that reached the driver are on disk: checkpoint 1 came before report 2
    # (whether checkpoint 2's round completed before the kill is a race).
    names = sorted(p.name for p in trainer.latest_checkpoint_dir.iterdir())
    assert names[0] == "checkpoint_000001" and names[-1] in ("checkpoint_000001", "checkpoint_000002")
    assert sgd.Trainer.load_checkpoint_from_path(trainer.latest_checkpoint_dir / names[-1])["step"] == len(names)


def _exits_once(config):
    marker = config["marker"]
    state = sgd.load_checkpoint()
    if sgd.world_rank() == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        sgd.save_checkpoint(stage="before-exit")
        raise SystemExit(3)
    if state is None:
        sgd.save_checkpoint(stage="before-exit")
    return state


def test_sys_exit_nonzero_is_a_worker_failure(trainer_factory, tmp_path):
    trainer = trainer_factory(max_retries=1)
    out = trainer.run(_exits_once, config={"marker": str(tmp_path / "exited")})
    assert out == [{"stage": "before-exit"}, {"stage": "before-exit"}]


def test_sys_exit_zero_ends_the_function(trainer_factory):
    def train_func():
        sgd.report(x=1)
        raise SystemExit(0)

    assert trainer_factory().run(train_func) == [None, None]


def _peer_lost(config):
    """Attempt 1: rank 1 fails like a collective whose peer died; rank 0 blocks (as if in
    that collective) until the test kills it. Attempt 2 (a restart): both finish."""
    import threading

    marker = config["marker"]
    if os.path.exists(marker + ".done"):
        return "second attempt"
    if sgd.world_rank() == 1:
        open(marker + ".raised", "w").close()
        if config.get("marked"):
            from sgd.errors import PeerFailureError

            class FrameworkPeerError(PeerFailureError):
                """A framework's own collective error, whose message sgd cannot recognise."""

            raise FrameworkPeerError("allreduce: rank 0 went away")
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500")
    # Mark attempt 1 as done only once rank 1 has looked for the mark (it raises after).
    while not os.path.exists(marker + ".raised"):
        threading.Event().wait(0.01)
    open(marker + ".done", "w").close()
    with open(marker + ".pid.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(marker + ".pid.tmp", marker + ".pid")
    threading.Event().wait()


@pytest.mark.parametrize("marked", [False, True], ids=["gloo-message", "PeerFailureError"])
def test_peer_failure_error_before_the_death_is_a_restart(trainer_factory, tmp_path, marked):
    """Read from the message (gloo's), or marked by its class (sgd.errors.PeerFailureError,
    what a framework package raises for a collective sgd does not know)."""
    import threading

    from sgd_testing import wait_for

    trainer = trainer_factory(max_retries=1)
    marker = str(tmp_path / "m")
    iterator = trainer.run_iterator(_peer_lost, config={"marker": marker, "marked": marked})
    outcome = {}

    def drive():
        try:
            outcome["results"] = iterator.get_final_results(force=True)
        except BaseException as exc:
            outcome["error"] = exc

    driver = threading.Thread(target=drive)
    driver.start()
    # The order under test: the driver holds rank 1's error before rank 0 dies.
    wait_for(lambda: iterator._run._group._rounds._error is not None, timeout=30,
             message="rank 1's error never arrived")
    pid = int(wait_for(lambda: os.path.exists(marker + ".pid") and open(marker + ".pid").read(), timeout=30))
    os.kill(pid, signal.SIGKILL)
    driver.join(timeout=60)
    assert not driver.is_alive()
    assert outcome.get("results") == ["second attempt"] * 2, outcome.get("error")


def test_peer_failure_error_without_a_death_is_raised(trainer_factory, tmp_path, monkeypatch):
    from sgd.group import rounds

    monkeypatch.setattr(rounds, "PEER_FAILURE_GRACE_S", 1.0)

    def fails():
        if sgd.world_rank() == 1:
            raise RuntimeError("Connection reset by peer")
        import threading

        threading.Event().wait()  # rank 0 stays alive (as if in a collective) and does not die

    trainer = trainer_factory(max_retries=1)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        trainer.run(fails)
    assert time.monotonic() - start >= 1.0  # held for the grace period, then raised as is


def _echo_first_then_cause(config):
    """Rank 1 fails like a collective whose peer closed its group; rank 0, the cause,
    raises a moment later (its run ends as its error is polled: both reach the driver
    together)."""
    if sgd.world_rank() == 1:
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    time.sleep(config["delay"])  # the ordering under test, not a wait for a condition
    raise ValueError("rank 0's own mistake")


@pytest.mark.parametrize("delay", [0.0, 0.2, 0.5])
def test_the_cause_is_raised_even_when_its_run_ends_before_its_poll_returns(trainer_factory, delay):
    """The echo arrives first and holds the error; rank 0's run then ends with the cause.
    The driver must take in rank 0's error before it raises, whatever order rank 0's end
    and its error reach it in (CI once raised the echo)."""
    trainer = trainer_factory()
    for _ in range(3):
        with pytest.raises(ValueError, match="rank 0's own mistake"):
            trainer.run(_echo_first_then_cause, config={"delay": delay})


# --- restarting only what died (issue 20) -----------------------------------------------------


def _pids_by_rank(rounds):
    """rank -> the pids it reported, in order, without repeats."""
    out = {}
    for results in rounds:
        for r in results:
            pids = out.setdefault(r["rank"], [])
            if not pids or pids[-1] != r["pid"]:
                pids.append(r["pid"])
    return out


class _Rounds(sgd.TrainingCallback):
    def __init__(self):
        self.rounds = []

    def handle_result(self, results, **info):
        self.rounds.append(results)


def test_a_restart_replaces_only_the_dead_worker(trainer_factory):
    """The base backend keeps the survivor: same process, same rank, one new process."""
    trainer = trainer_factory(max_retries=1)
    seen = _Rounds()
    killer = KillWorker(at=3, key="step", rank=1)
    expected = trainer_factory().run(_deterministic, config={"steps": 6})
    assert trainer.run(_deterministic, config={"steps": 6}, callbacks=[killer, seen]) == expected
    pids = _pids_by_rank(seen.rounds)
    assert len(pids[0]) == 1, pids  # rank 0 ran both attempts in its first process
    assert len(pids[1]) == 2 and pids[1][0] == killer.killed[0], pids
    assert [r[0]["step"] for r in seen.rounds] == list(range(1, 7))
    # The run's events say which process died where, and which processes went on from which checkpoint.
    events = sgd.runs.read_events(trainer.latest_run_dir).events
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["run_started", "attempt_started"] and kinds[-1] == "run_finished", kinds
    failed = next(e for e in events if e["event"] == "worker_failed")
    assert (failed["rank"], failed["pid"], failed["died"]) == (1, killer.killed[0], True)
    assert failed["host"] == socket.gethostname()
    restart = next(e for e in events if e["event"] == "restart")
    first, second = [e for e in events if e["event"] == "attempt_started"]
    assert [w["pid"] for w in first["workers"]] == [pids[0][0], pids[1][0]]
    assert [w["pid"] for w in second["workers"]] == [pids[0][0], pids[1][1]]
    assert second["checkpoint"] == restart["checkpoint"] and restart["checkpoint"].startswith("checkpoint_")
    assert (trainer.latest_run_dir / "checkpoints" / restart["checkpoint"]).is_dir()
    # The kept worker starts the next run too, with the same rank.
    assert trainer.run(lambda: (os.getpid(), sgd.world_rank())) == [(pids[0][0], 0), (pids[1][1], 1)]


def _stuck_after(config):
    """Reports ``steps`` steps; at step 2 rank 0 (only in the first attempt) waits forever
    between its report and its checkpoint, as code blocked outside sgd would. (Waiting after the
    checkpoint raced with the driver's acknowledgement of it: a rank 0 still inside
    ``save_checkpoint`` when its peer died was stopped there and kept, and then blocked forever
    in the next attempt.)"""
    import threading

    state = sgd.load_checkpoint() or {"step": 0}
    for step in range(state["step"] + 1, config["steps"] + 1):
        sgd.report(step=step, pid=os.getpid(), rank=sgd.world_rank())
        if step == 2 and sgd.world_rank() == 0 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            threading.Event().wait()
        sgd.save_checkpoint(step=step)
    return os.getpid()


def test_a_survivor_that_does_not_stop_is_replaced(trainer_factory, tmp_path, monkeypatch):
    from sgd.group import actors as backend_executor

    monkeypatch.setattr(backend_executor, "SURVIVOR_PATIENCE_S", 1.0)
    trainer = trainer_factory(max_retries=1)
    seen = _Rounds()
    killer = KillWorker(at=2, key="step", rank=1)
    marker = str(tmp_path / "stuck")
    final_pids = trainer.run(_stuck_after, config={"steps": 4, "marker": marker}, callbacks=[killer, seen])
    pids = _pids_by_rank(seen.rounds)
    # Rank 0 never ended its run when asked: it was replaced along with the dead rank 1.
    assert final_pids[0] != pids[0][0] and final_pids[1] != killer.killed[0]
    assert [r[0]["step"] for r in seen.rounds] == [1, 2, 3, 4]


def test_a_backend_that_does_not_keep_survivors_gets_all_new_workers(ray_cluster):
    class Fresh(sgd.BackendConfig):
        @property
        def backend_cls(self):
            return type("FreshBackend", (sgd.Backend,), {})  # a subclass: keeps_survivors is False

    trainer = sgd.Trainer(backend=Fresh(), num_workers=2, max_retries=1)
    trainer.start()
    try:
        seen = _Rounds()
        killer = KillWorker(at=3, key="step", rank=1)
        trainer.run(_deterministic, config={"steps": 5}, callbacks=[killer, seen])
        pids = _pids_by_rank(seen.rounds)
        assert len(pids[0]) == 2 and len(pids[1]) == 2, pids
    finally:
        trainer.shutdown()


# --- a backend's hook on a failed run (sgd.backend.on_worker_run_error) ------------------------


def _register_marker_hooks(folder):
    from sgd.backend import on_worker_run_error

    def mark():
        Path(folder, f"failed_{sgd.world_rank()}").touch()

    def broken():
        raise OSError("a hook that raises")

    for hook in (mark, mark, broken):  # the same hook twice runs once
        on_worker_run_error(hook)


def test_a_failed_run_runs_the_backends_hooks_on_its_worker_first(ray_cluster, tmp_path):
    """The hook runs on the worker whose function raised, before the driver sees the run end
    (its mark is there when the error arrives); one that raises does not hide the error."""
    folder = str(tmp_path)

    class Marking(sgd.BackendConfig):
        @property
        def backend_cls(self):
            def on_start(self, worker_group, backend_config):
                worker_group.execute(_register_marker_hooks, folder)

            return type("MarkingBackend", (sgd.Backend,), {"on_start": on_start})

    def fails_on_rank_1():
        if sgd.world_rank() == 1:
            raise KeyError("rank 1")
        return "fine"

    trainer = sgd.Trainer(backend=Marking(), num_workers=2)
    trainer.start()
    try:
        assert trainer.run(lambda: "fine") == ["fine", "fine"]
        assert not list(tmp_path.iterdir())  # nothing failed: no hook ran
        with pytest.raises(KeyError, match="rank 1"):
            trainer.run(fails_on_rank_1)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["failed_1"]
    finally:
        trainer.shutdown()


def test_a_run_goes_through_explicit_states_decided_by_the_policies(trainer_factory):
    """One death mid-run: STARTING -> RUNNING -> RESTARTING -> RUNNING -> FINISHED; the
    failure policy's second Retry is never asked for; a run whose retries run out ends ERRORED."""
    from sgd.run.controller import RunState

    trainer = trainer_factory(max_retries=1)
    iterator = trainer.run_iterator(_deterministic, config={"steps": 5})
    killer = KillWorker(at=[2], key="step")
    for results in iterator:
        killer.handle_result(results)
    run = iterator._run
    assert run.transitions == [RunState.STARTING, RunState.RUNNING, RunState.RESTARTING, RunState.RUNNING,
                               RunState.FINISHED]
    assert run._controller.attempt == 1  # the failure policy, the only retry counter

    iterator = trainer.run_iterator(_deterministic, config={"steps": 6})
    killer = KillWorker(at=[2, 4], key="step")
    with pytest.raises(sgd.TrainingFailedError, match=r"after 2 attempts \(max_retries=1\)"):
        for results in iterator:
            killer.handle_result(results)
    assert iterator._run.transitions[-4:] == [RunState.RESTARTING, RunState.RUNNING, RunState.FAILING,
                                              RunState.ERRORED]
    assert iterator.is_finished()
