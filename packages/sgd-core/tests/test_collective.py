"""``sgd.collective`` (Ray Train 2.60's ``ray.train.collective``) on real Ray, 2 workers: a barrier
orders work across ranks, a 50 MB broadcast, and the faults: an object that does not pickle, a rank
that dies at the barrier, calls that differ across ranks, a timeout that names the missing rank,
local mode. (The rules themselves, stepped without Ray: tests/unit/test_rendezvous.py.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import sgd
import sgd.collective
from sgd.collective import CollectiveMismatchError, CollectiveTimeoutError


def _wait_for_file(path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.01)


def barrier_orders(config):
    folder = Path(config["folder"])
    rank = sgd.get_context().get_world_rank()
    if rank == 1:
        (folder / "rank1_at_barrier").touch()
    else:
        # Rank 0 does its work only once rank 1 stands at the barrier: without a barrier that
        # holds, rank 1 would be past it before the work is there.
        _wait_for_file(folder / "rank1_at_barrier")
        (folder / "prepared_by_rank0").write_text("ready")
    sgd.collective.barrier()
    return (folder / "prepared_by_rank0").exists()


def test_barrier_orders_work_across_ranks(base_trainer, tmp_path):
    assert base_trainer.run(barrier_orders, config={"folder": str(tmp_path)}) == [True, True]


def broadcast_big(config):
    rank = sgd.get_context().get_world_rank()
    data = np.arange(50 * 1024 * 1024 // 8, dtype=np.float64) if rank == 0 else "not rank 0's"
    got = sgd.collective.broadcast_from_rank_zero(data)
    small = sgd.collective.broadcast_from_rank_zero({"rank": rank, "seed": 1234} if rank == 0 else None)
    nothing = sgd.collective.broadcast_from_rank_zero(None if rank == 0 else "ignored")
    return got.nbytes, float(got[-1]), float(got.sum()), small, nothing


def _check_big(results):
    n = 50 * 1024 * 1024 // 8
    for nbytes, last, total, small, nothing in results:
        assert nbytes == 50 * 1024 * 1024 and last == n - 1 and total == n * (n - 1) / 2
        assert small == {"rank": 0, "seed": 1234}
        assert nothing is None


def test_broadcast_of_a_50mb_array_with_the_plain_backend(base_trainer):
    _check_big(base_trainer.run(broadcast_big))


def test_broadcast_and_barrier_with_the_torch_backend(tmp_path):
    pytest.importorskip("sgd_torch")
    from sgd_torch import TorchTrainer

    def loop(config):
        import torch.distributed as dist

        result = broadcast_big(config)
        sgd.collective.barrier()
        sgd.report({"ok": 1, "gloo": dist.is_initialized()})
        assert result[0] == 50 * 1024 * 1024
        return result

    trainer = TorchTrainer(loop, scaling_config=sgd.ScalingConfig(num_workers=2),
                           run_config=sgd.RunConfig(storage_path=str(tmp_path), name="collective_torch"))
    result = trainer.fit()
    assert result.metrics["ok"] == 1 and result.metrics["gloo"] is True


def broadcast_a_lock(config):
    import threading

    sgd.collective.barrier()
    data = {"lock": threading.Lock()} if sgd.get_context().get_world_rank() == 0 else None
    sgd.collective.broadcast_from_rank_zero(data)


def test_broadcast_of_an_object_that_does_not_pickle_fails_on_rank_zero_and_nobody_hangs(base_trainer):
    begun = time.monotonic()
    with pytest.raises(TypeError, match=r"rank 0's data, a builtins.dict, cannot be pickled.*lock") as info:
        base_trainer.run(broadcast_a_lock)
    assert info.value.__cause__.world_rank == 0  # rank 0's error, not a peer's echo
    assert time.monotonic() - begun < 60
    # the group is fine for the next run
    assert base_trainer.run(lambda: sgd.collective.broadcast_from_rank_zero(sgd.world_rank())) == [0, 0]


def dies_at_the_barrier(config):
    marker = Path(config["folder"]) / "died_once"
    rank = sgd.get_context().get_world_rank()
    if rank == 1 and not marker.exists():
        marker.touch()
        os._exit(1)  # rank 1 dies while rank 0 waits at the barrier
    sgd.collective.barrier()
    return sgd.collective.broadcast_from_rank_zero("after the restart")


def test_barrier_when_a_rank_dies_fails_over_and_the_group_restarts(ray_cluster, tmp_path):
    trainer = sgd.Trainer(backend="base", num_workers=2, logdir=tmp_path / "exp", max_retries=1)
    trainer.start()
    try:
        assert trainer.run(dies_at_the_barrier, config={"folder": str(tmp_path)}) == ["after the restart"] * 2
        assert (tmp_path / "died_once").exists()
    finally:
        trainer.shutdown()


def test_barrier_when_a_rank_dies_and_no_retry_is_left_fails_the_run(ray_cluster, tmp_path):
    trainer = sgd.Trainer(backend="base", num_workers=2, logdir=tmp_path / "exp", max_retries=0)
    trainer.start()
    try:
        with pytest.raises(sgd.TrainingFailedError, match="died"):
            trainer.run(dies_at_the_barrier, config={"folder": str(tmp_path)})
    finally:
        trainer.shutdown()


def counts_differ(config):
    sgd.collective.barrier()
    if sgd.get_context().get_world_rank() == 0:
        sgd.collective.barrier()  # rank 1 never makes this second call
    return "done"


def test_a_rank_waiting_in_a_call_another_rank_never_makes_fails_at_once(base_trainer):
    with pytest.raises(CollectiveMismatchError, match=r"training function of rank 1 returned after 1 collective "
                                                      r"call, while ranks \[0\] wait in call #2") as info:
        base_trainer.run(counts_differ)
    assert info.value.number == 2


def calls_differ(config):
    if sgd.get_context().get_world_rank() == 0:
        sgd.collective.barrier()
    else:
        sgd.collective.broadcast_from_rank_zero(None)


def test_different_calls_across_ranks_fail_naming_each_ranks_call(base_trainer):
    with pytest.raises(CollectiveMismatchError, match=r"collective call #1 differs across ranks: ranks \[0\] called "
                                                      r"sgd.collective.barrier; ranks \[1\] called "
                                                      r"sgd.collective.broadcast_from_rank_zero"):
        base_trainer.run(calls_differ)


def rank1_late(config):
    if sgd.get_context().get_world_rank() == 1:
        # busy far longer than the timeout; its reports let the driver stop it once the run failed
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not Path(config["folder"], "never").exists():
            sgd.report({"busy": 1})
            time.sleep(0.05)
    sgd.collective.barrier()


@pytest.mark.parametrize("variable", ["SGD_COLLECTIVE_TIMEOUT_S", "RAY_TRAIN_COLLECTIVE_TIMEOUT_S"])
def test_timeout_names_the_ranks_that_never_arrived(base_trainer, tmp_path, monkeypatch, variable):
    monkeypatch.delenv("SGD_COLLECTIVE_TIMEOUT_S", raising=False)
    monkeypatch.setenv(variable, "1.5")  # read by the driver when the run starts
    begun = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"sgd.collective.barrier \(collective call #1\) timed out "
                                                     r"after \d+\.\d s: rank \[1\] never arrived") as info:
        base_trainer.run(rank1_late, config={"folder": str(tmp_path)})
    assert info.value.missing_ranks == [1] and info.value.timeout_s == 1.5
    assert time.monotonic() - begun < 60


def test_a_waiting_call_logs_the_ranks_it_waits_for_in_the_rank_log(base_trainer, tmp_path, monkeypatch):
    from sgd_testing.fixtures import wait_for

    monkeypatch.setenv("SGD_COLLECTIVE_WARN_INTERVAL_S", "0.3")
    monkeypatch.setenv("SGD_COLLECTIVE_TIMEOUT_S", "2")
    with pytest.raises(CollectiveTimeoutError):
        base_trainer.run(rank1_late, config={"folder": str(tmp_path)})
    log = base_trainer.latest_run_dir / "logs" / "rank_0.log"
    wait_for(lambda: "for rank [1] (world size 2)" in log.read_text(), timeout=20,
             message=f"no warning in {log}")
    text = log.read_text()
    assert "sgd.collective.barrier (collective call #1) has waited" in text
    assert "SGD_COLLECTIVE_WARN_INTERVAL_S" in text


def test_local_mode_returns_at_once(tmp_path):
    data = {"a": [1, 2]}

    def func():
        sgd.collective.barrier()
        return sgd.collective.broadcast_from_rank_zero(data) is data, sgd.collective.barrier()

    local = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=0, logdir=tmp_path / "local")
    local.start()
    try:
        assert local.run(func) == [(True, None)]
    finally:
        local.shutdown()
