"""WandbLoggerCallback in offline mode, read back from the run's own transaction log."""

from __future__ import annotations

import math
import socket

import pytest

pytest.importorskip("wandb")

from sgd_loggers import WandbLoggerCallback

CONFIG = {"lr": 0.1, "model": {"layers": 3}}


def log_run(cb, run_dir, rounds, config=CONFIG, error=False):
    cb.start_training(logdir=str(run_dir), config=config)
    for round_ in rounds:
        cb.handle_result(round_)
    cb.finish_training(error=error)


def steps_of(history, key):
    return [(h["_step"], h[key]) for h in history if key in h]


def test_offline_run_config_history_summary(tmp_path, rounds, read_wandb_offline):
    run_dir = tmp_path / "train_x" / "run_001"
    cb = WandbLoggerCallback(project="sgd-tests", group="g1", tags=["unit"])
    log_run(cb, run_dir, rounds)
    run = read_wandb_offline(run_dir)
    assert run.path.parent == run_dir / "wandb"
    assert run.config == CONFIG
    assert steps_of(run.history, "loss") == [(it, r[0]["loss"]) for it, r in enumerate(rounds, start=1)]
    assert steps_of(run.history, "acc/top1") == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4), (5, 0.5)]
    assert steps_of(run.history, "_training_iteration") == [(i, i) for i in range(1, 6)]
    assert run.summary["loss"] == 0.2
    assert run.exit_code == 0


def test_failed_run_exit_code_worker_and_values(tmp_path, read_wandb_offline):
    cb = WandbLoggerCallback(mode="offline", worker_to_log=1)
    rounds = [
        [{"_training_iteration": it, "x": 0.0}, {"_training_iteration": it, "x": float(it), "grads": [1.0, 2.0, 3.0],
                                                  "nan": float("nan"), "inf": float("inf"), "name": "abc"}]
        for it in (1, 3)
    ]
    log_run(cb, tmp_path, rounds, config={}, error=True)
    run = read_wandb_offline(tmp_path)
    assert run.exit_code == 1
    assert steps_of(run.history, "x") == [(1, 1.0), (3, 3.0)]  # steps follow _training_iteration
    assert all(math.isnan(v) for _, v in steps_of(run.history, "nan"))
    assert [v for _, v in steps_of(run.history, "inf")] == [math.inf, math.inf]
    assert not any("name" in h for h in run.history)
    assert run.history[0]["grads._type"] == "histogram"
    counts, bins = run.history[0]["grads.values"], run.history[0]["grads.bins"]
    assert sum(counts) == 3 and (bins[0], bins[-1]) == (1.0, 3.0)


def test_secrets_and_api_key_never_written(tmp_path, secret, files_containing, read_wandb_offline):
    key = "k" * 40  # W&B checks the key's shape
    cb = WandbLoggerCallback(api_key=key, config={"session_token": secret, "extra": 1})
    assert key not in repr(cb)
    log_run(cb, tmp_path, [[{"_training_iteration": 1, "loss": 0.5, "my_password": 1.0}]],
            config={"lr": 0.1, "auth": {"API_KEY": secret, "user": "me"}})
    run = read_wandb_offline(tmp_path)
    assert run.config == {"lr": 0.1, "auth": {"user": "me"}, "extra": 1}
    assert "my_password" not in run.history[0] and run.history[0]["loss"] == 0.5
    assert files_containing(tmp_path, secret) == []
    assert files_containing(tmp_path, key) == []
    assert files_containing(tmp_path, '"user"') != []  # the grep sees what was written


def test_offline_touches_no_network(tmp_path, monkeypatch, read_wandb_offline):
    """Point W&B's server at a loopback socket we own: offline, nothing ever connects to it."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
        cb = WandbLoggerCallback(project="p", api_key="k" * 40)
        log_run(cb, tmp_path, [[{"_training_iteration": 1, "loss": 0.5}]])
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert steps_of(read_wandb_offline(tmp_path).history, "loss") == [(1, 0.5)]
