"""Ctrl-C: a real SIGINT in the driver ends the run within 5 s, also while a worker is blocked in
an all-reduce waiting for a peer that never comes, re-raises KeyboardInterrupt, keeps what was
reported, and leaves the trainer usable (``Trainer.run``, ``run_iterator`` and ``fit()``).

The signal is sent only once the blocking is certain: rank 0 is inside ``all_reduce`` (a marker
it writes just before) and the driver has delivered the rows reported before it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import sgd
from sgd_testing import wait_for

pytest.importorskip("torch")

#: What the issue asks: the run ends, and KeyboardInterrupt reaches the caller, within this.
LIMIT_S = 5.0


def _blocks_in_all_reduce(config):
    import torch
    import torch.distributed as dist

    sgd.report(step=1)
    sgd.report(step=2)
    if sgd.world_rank() == 0:
        Path(config["folder"], "in_all_reduce").touch()
        dist.all_reduce(torch.ones(1))  # rank 1 never joins
    else:
        wait_for(lambda: os.path.exists(os.path.join(config["folder"], "never")), timeout=600)


class _Rows(sgd.TrainingCallback):
    def __init__(self):
        self.steps = []

    def handle_result(self, results, **info):
        self.steps.append(results[0]["step"])


def _interrupt_when_blocked(folder: Path, rows: _Rows, sent: dict) -> threading.Thread:
    main = threading.main_thread().ident

    def interrupt():
        wait_for(lambda: (folder / "in_all_reduce").exists() and rows.steps == [1, 2], timeout=120)
        sent["at"] = time.monotonic()
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    return thread


@pytest.fixture(autouse=True)
def _python_sigint_handler():
    """Python's own SIGINT handler (KeyboardInterrupt), SIGINT not blocked, as a user's process
    has it: Ray Tune, run earlier in the same test process, leaves a handler of its own installed,
    and a suite started in the background by a non-interactive shell has SIGINT ignored
    (docs/debugging.md)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def torch_trainer(ray_cluster_module, tmp_path_factory):
    trainer = sgd.Trainer(backend="torch", num_workers=2, logdir=tmp_path_factory.mktemp("interrupt"))
    trainer.start()
    yield trainer
    trainer.shutdown()


@pytest.fixture(scope="module")
def ray_cluster_module():
    from sgd_testing.fixtures import _start_local_ray

    _start_local_ray()


def _check_interrupted(trainer, sent, started):
    latency = time.monotonic() - sent["at"]
    print(f"SIGINT -> KeyboardInterrupt in the caller: {latency:.2f} s")
    assert latency < LIMIT_S, f"KeyboardInterrupt reached the caller {latency:.1f} s after SIGINT"
    run_dir = trainer.latest_run_dir
    assert json.loads((run_dir / "status.json").read_text())["status"] == "INTERRUPTED"
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)[0]["step"] for line in lines] == [1, 2]  # kept
    return latency


@pytest.mark.parametrize("how", ["run", "run_iterator"])
def test_ctrl_c_inside_an_all_reduce_ends_the_run_and_the_trainer_runs_again(torch_trainer, tmp_path, how):
    rows, sent = _Rows(), {}
    _interrupt_when_blocked(tmp_path, rows, sent)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        if how == "run":
            torch_trainer.run(_blocks_in_all_reduce, config={"folder": str(tmp_path)}, callbacks=[rows])
        else:
            for results in torch_trainer.run_iterator(_blocks_in_all_reduce, config={"folder": str(tmp_path)}):
                rows.handle_result(results)
    _check_interrupted(torch_trainer, sent, started)
    # Usable again: the worker stuck in the all-reduce was replaced.
    assert torch_trainer.run(lambda: sgd.world_rank()) == [0, 1]


def test_ctrl_c_inside_an_all_reduce_ends_fit(ray_cluster_module, tmp_path):
    from sgd.air import RunConfig, ScalingConfig
    from sgd_torch import TorchTrainer

    rows, sent = _Rows(), {}
    folder = tmp_path / "markers"
    folder.mkdir()
    _interrupt_when_blocked(folder, rows, sent)
    trainer = TorchTrainer(_blocks_in_all_reduce, train_loop_config={"folder": str(folder)},
                           scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(storage_path=str(tmp_path / "results"), name="ctrl_c",
                                                callbacks=[rows]))
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    latency = time.monotonic() - sent["at"]
    print(f"SIGINT -> KeyboardInterrupt in the caller of fit(): {latency:.2f} s")
    assert latency < LIMIT_S, f"KeyboardInterrupt reached the caller {latency:.1f} s after SIGINT"
    run_dir = tmp_path / "results" / "ctrl_c"  # the AIR run folder is storage_path/name (Ray 2.60)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "INTERRUPTED"
    # And fit() runs again in the same process.
    again = TorchTrainer(lambda: sgd.report(ok=1), scaling_config=ScalingConfig(num_workers=2),
                         run_config=RunConfig(storage_path=str(tmp_path / "results"), name="again"))
    assert again.fit().metrics["ok"] == 1
