"""One failure policy at every phase of a run (the run controller).

A worker that dies while the group starts (in the ``initialization_hook`` too) is retried
up to ``max_retries`` and then ends in ``TrainingFailedError`` whose cause is the
``WorkerDiedError``, never a raw Ray exception; ``run_iterator`` always returns an iterator,
and a failure as the run starts comes out of ``next()``.
"""

import os
import sys
from dataclasses import dataclass

import pytest
import ray

import sgd
from sgd_testing import wait_for


def _free_cpus():
    return ray.available_resources().get("CPU", 0)


def _exit_zero():
    sys.exit(0)  # the reproduction of the issue: the actor exits inside the hook


def test_start_retries_a_death_in_the_initialization_hook_then_raises_training_failed(ray_cluster):
    free = _free_cpus()
    trainer = sgd.Trainer(backend="base", num_workers=2, max_retries=1)
    failed = r"after 2 attempts \(max_retries=1\).*starting the workers"
    with pytest.raises(sgd.TrainingFailedError, match=failed) as info:
        trainer.start(initialization_hook=_exit_zero)
    cause = info.value.__cause__
    assert isinstance(cause, sgd.WorkerDiedError), repr(cause)
    assert not isinstance(info.value, ray.exceptions.RayError)
    assert "died while setting the worker group up" in str(cause)
    # Nothing is left behind: the trainer is not started and every CPU comes back.
    with pytest.raises(RuntimeError, match="not started"):
        trainer.run(lambda: 1)
    wait_for(lambda: _free_cpus() >= free, timeout=30, message="the failed start kept its CPUs")
    trainer.shutdown()  # a no-op, and no error


def _dies_on_first_attempt(marker):
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)


def test_start_recovers_when_a_worker_dies_once_in_the_hook(ray_cluster, tmp_path):
    marker = str(tmp_path / "died")
    trainer = sgd.Trainer(backend="base", num_workers=2, max_retries=1)
    trainer.start(initialization_hook=lambda: _dies_on_first_attempt(marker))
    try:
        assert os.path.exists(marker)
        assert trainer.run(lambda: sgd.world_size()) == [2, 2]
    finally:
        trainer.shutdown()


def test_start_with_no_retries_raises_at_the_first_death(ray_cluster):
    trainer = sgd.Trainer(backend="base", num_workers=2, max_retries=0)
    with pytest.raises(sgd.TrainingFailedError, match=r"after 1 attempt \(max_retries=0\)") as info:
        trainer.start(initialization_hook=lambda: os._exit(3))
    assert isinstance(info.value.__cause__, sgd.WorkerDiedError)


def test_a_user_error_in_the_initialization_hook_is_not_retried(ray_cluster, tmp_path):
    calls = tmp_path / "calls"
    calls.mkdir()

    def hook():
        open(calls / str(os.getpid()), "w").close()
        raise ValueError("bad hook")

    trainer = sgd.Trainer(backend="base", num_workers=2, max_retries=3)
    with pytest.raises(ValueError, match="bad hook"):
        trainer.start(initialization_hook=hook)
    assert len(list(calls.iterdir())) == 2  # one attempt: each worker ran it once


def test_run_iterator_returns_an_iterator_when_the_workers_die_at_once(ray_cluster):
    trainer = sgd.Trainer(backend="base", num_workers=2, max_retries=2)
    trainer.start()
    try:
        it = trainer.run_iterator(lambda: os._exit(1))
        assert isinstance(it, sgd.TrainingIterator)
        assert not it.is_finished()
        with pytest.raises(sgd.TrainingFailedError, match=r"after 3 attempts \(max_retries=2\)") as info:
            next(it)
        assert isinstance(info.value.__cause__, sgd.WorkerDiedError)
        assert it.is_finished()
        with pytest.raises(StopIteration):
            next(it)
        # The trainer is still usable: its next run gets fresh workers.
        assert trainer.run(lambda: "ok") == ["ok", "ok"]
    finally:
        trainer.shutdown()


def test_run_raises_the_same_error_type(ray_cluster):
    trainer = sgd.Trainer(backend="base", num_workers=2, max_retries=0)
    trainer.start()
    try:
        with pytest.raises(sgd.TrainingFailedError) as info:
            trainer.run(lambda: os._exit(1))
        assert isinstance(info.value.__cause__, sgd.WorkerDiedError)
        assert info.value.__cause__.world_rank in (0, 1)
    finally:
        trainer.shutdown()


def test_to_worker_group_retries_a_death_at_start_too(ray_cluster, tmp_path):
    marker = str(tmp_path / "died")

    class Once:
        def __init__(self):
            pass

        def ping(self):
            return os.getpid()

    # A worker that dies inside the backend's setup: retried like one dying in the hook.
    trainer = sgd.Trainer(backend=_DyingSetupConfig(marker=marker), num_workers=2, max_retries=1)
    wg = trainer.to_worker_group(Once)
    try:
        assert os.path.exists(marker)
        assert len(set(ray.get([w.ping.remote() for w in wg]))) == 2
        assert isinstance(wg.backend, _DyingSetupBackend)
    finally:
        wg.shutdown()


class _DyingSetupBackend(sgd.Backend):
    """Kills rank 1 during its first setup."""

    def on_start(self, worker_group, backend_config):
        worker_group.execute_single(1, _dies_on_first_attempt, backend_config.marker)


@dataclass
class _DyingSetupConfig(sgd.BackendConfig):
    marker: str = ""

    @property
    def backend_cls(self):
        return _DyingSetupBackend


def test_max_retries_set_between_runs_applies_to_the_next_run(ray_cluster, tmp_path):
    # sgd_torch.v1 sets trainer.max_retries per call; a run reads it when it begins.
    trainer = sgd.Trainer(backend="base", num_workers=2, max_retries=0)
    trainer.start()
    try:
        trainer.max_retries = 1
        marker = str(tmp_path / "died")
        assert trainer.run(lambda: _dies_on_first_attempt(marker) or "ok") == ["ok", "ok"]
    finally:
        trainer.shutdown()
