"""MLflowLoggerCallback against a real ``mlflow server`` and the default local store."""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from sgd_loggers import MLflowLoggerCallback
from sgd_loggers.mlflow_logger import mlflow_key

CONFIG = {"lr": 0.1, "model": {"layers": 3, "act": "relu"}, "batch_size": 32, "note": None}
PARAMS = {"lr": "0.1", "model/layers": "3", "model/act": "relu", "batch_size": "32", "note": ""}


def history(client, run_id, key):
    return [(m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key)]


def log_run(cb, run_dir, rounds, config=CONFIG, error=False):
    cb.start_training(logdir=str(run_dir), config=config)
    for round_ in rounds:
        cb.handle_result(round_)
    cb.finish_training(error=error)
    return cb.run_id


def test_default_local_store_under_run_dir(tmp_path, rounds, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    run_dir = tmp_path / "train_x" / "run_001"
    cb = MLflowLoggerCallback()
    run_id = log_run(cb, run_dir, rounds)
    assert cb.tracking_uri == f"sqlite:///{run_dir.resolve()}/mlflow.db"
    client = MlflowClient(tracking_uri=cb.tracking_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "train_x/run_001"
    assert run.data.params == PARAMS
    assert history(client, run_id, "loss") == [(it, r[0]["loss"], (1_700_000_000 + it) * 1000)
                                               for it, r in enumerate(rounds, start=1)]
    assert [(s, v) for s, v, _ in history(client, run_id, "acc/top1")] == [(1, 0.1), (2, 0.2), (3, 0.3),
                                                                          (4, 0.4), (5, 0.5)]
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "Default"
    assert experiment.artifact_location == str(run_dir.resolve() / "mlartifacts" / "0")
    assert list(cwd.iterdir()) == []  # nothing lands in the working directory

    # A second run directory gets its own store, and a named experiment keeps its artifacts there too.
    other = tmp_path / "train_x" / "run_002"
    cb2 = MLflowLoggerCallback(experiment_name="exp one", save_artifact=True)
    (other / "checkpoints" / "checkpoint_000001").mkdir(parents=True)
    (other / "checkpoints" / "checkpoint_000001" / "state.bin").write_bytes(b"\x00weights")
    run_id2 = log_run(cb2, other, rounds[:1])
    client2 = MlflowClient(tracking_uri=cb2.tracking_uri)
    assert cb2.tracking_uri != cb.tracking_uri
    location = client2.get_experiment_by_name("exp one").artifact_location
    assert location == str(other.resolve() / "mlartifacts" / "exp_one")
    assert [a.path for a in client2.list_artifacts(run_id2, "checkpoints")] == ["checkpoints/checkpoint_000001"]
    stored = list((other / "mlartifacts" / "exp_one").rglob("state.bin"))
    assert [p.read_bytes() for p in stored] == [b"\x00weights"]


def test_env_tracking_uri_is_honoured(tmp_path, rounds, monkeypatch, mlflow_server):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", f"env-{uuid.uuid4().hex[:8]}")
    cb = MLflowLoggerCallback()
    run_id = log_run(cb, tmp_path, rounds[:2])
    assert cb.tracking_uri == mlflow_server.url and not (tmp_path / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=mlflow_server.url)
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).name.startswith("env-")


def test_server_params_metrics_steps_and_status(mlflow_server, tmp_path, rounds):
    name = f"sgd-{uuid.uuid4().hex[:8]}"
    cb = MLflowLoggerCallback(tracking_uri=mlflow_server.url, experiment_name=name, tags={"team": "ml"},
                              worker_to_log=1)
    run_id = log_run(cb, tmp_path / "run_001", rounds)
    client = MlflowClient(tracking_uri=mlflow_server.url)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == name
    assert run.data.params == PARAMS
    assert run.data.tags["team"] == "ml"
    assert run.data.tags["sgd.run_dir"] == str(tmp_path / "run_001")
    assert history(client, run_id, "loss") == [(it, r[1]["loss"], (1_700_000_000 + it) * 1000)
                                               for it, r in enumerate(rounds, start=1)]
    assert [(s, v) for s, v, _ in history(client, run_id, "_training_iteration")] == [(i, i) for i in range(1, 6)]
    assert set(run.data.metrics) == {"loss", "acc/top1", "_timestamp", "_time_this_iter_s", "_training_iteration"}


def test_server_failed_run_uploads_checkpoints(mlflow_server, tmp_path, rounds):
    run_dir = tmp_path / "run_001"
    ckpt = run_dir / "checkpoints" / "checkpoint_000002"
    ckpt.mkdir(parents=True)
    (ckpt / "model.pt").write_bytes(b"tensor-bytes")
    (ckpt / ".metadata.json").write_text('{"iteration": 2}')
    cb = MLflowLoggerCallback(tracking_uri=mlflow_server.url, experiment_name="sgd-failures", save_artifact=True)
    run_id = log_run(cb, run_dir, rounds[:2], error=True)
    client = MlflowClient(tracking_uri=mlflow_server.url)
    assert client.get_run(run_id).info.status == "FAILED"
    assert [(s, v) for s, v, _ in history(client, run_id, "loss")] == [(1, 1.0), (2, 0.5)]
    listed = sorted(a.path for a in client.list_artifacts(run_id, "checkpoints/checkpoint_000002"))
    assert listed == ["checkpoints/checkpoint_000002/.metadata.json", "checkpoints/checkpoint_000002/model.pt"]
    local = Path(client.download_artifacts(run_id, "checkpoints", str(tmp_path / "dl")))
    assert (local / "checkpoint_000002" / "model.pt").read_bytes() == b"tensor-bytes"


def test_save_artifact_without_checkpoints_finishes(mlflow_server, tmp_path, rounds, caplog):
    cb = MLflowLoggerCallback(tracking_uri=mlflow_server.url, experiment_name="sgd-failures", save_artifact=True)
    run_id = log_run(cb, tmp_path, rounds[:1])
    client = MlflowClient(tracking_uri=mlflow_server.url)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert client.list_artifacts(run_id) == []
    assert "holds no checkpoint" in caplog.text


def test_non_finite_non_numeric_and_odd_keys(mlflow_server, tmp_path):
    cb = MLflowLoggerCallback(tracking_uri=mlflow_server.url, experiment_name="sgd-odd")
    run_id = log_run(cb, tmp_path, [[{
        "_training_iteration": 1, "nan": float("nan"), "inf": float("inf"), "text": "abc", "flag": True,
        "list": [1, 2], "none": None, "odd key:é?": 2.5, "a//b": 1.0,
    }]], config={"weird:param!": "x", "long": "y" * 7000})
    client = MlflowClient(tracking_uri=mlflow_server.url)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert set(run.data.metrics) == {"_training_iteration", "nan", "inf", "flag", "odd key_é_", "a/b"}
    assert math.isnan(run.data.metrics["nan"])
    assert run.data.metrics["inf"] > 1e300  # SQL stores clamp +inf to the largest float
    assert run.data.metrics["flag"] == 1.0
    assert run.data.params == {"weird_param_": "x", "long": "y" * 6000}


def test_secrets_never_reach_mlflow(mlflow_server, tmp_path, secret, files_containing):
    config = {"lr": 0.1, "wandb_api_key": secret, "db": {"PASSWORD": secret, "host": "h"}}
    rounds = [[{"_training_iteration": 1, "loss": 0.5, "refresh_token": 42.0, "Secret": {"x": 1.0}}]]
    cb = MLflowLoggerCallback(tracking_uri=mlflow_server.url, experiment_name="sgd-secrets",
                              tags={"team": "ml", "github_token": secret})
    run_id = log_run(cb, tmp_path / "run", rounds, config=config)
    local = MLflowLoggerCallback()
    log_run(local, tmp_path / "local", rounds, config=config)
    run = MlflowClient(tracking_uri=mlflow_server.url).get_run(run_id)
    assert run.data.params == {"lr": "0.1", "db/host": "h"}
    assert set(run.data.metrics) == {"_training_iteration", "loss"}
    assert "github_token" not in run.data.tags and run.data.tags["team"] == "ml"
    assert files_containing(mlflow_server.root, secret) == []
    assert files_containing(tmp_path, secret) == []
    assert files_containing(tmp_path / "local", "db/host") != []  # the grep sees what was written


@pytest.mark.parametrize(
    "key, expected",
    [("loss", "loss"), ("a/b", "a/b"), ("a//b/", "a/b"), ("/x", "x"), ("./a/../b", "_/a/_/b"), ("é:k", "é_k"),
     ("", "_"), ("k" * 300, "k" * 250)],
)
def test_mlflow_key(key, expected):
    assert mlflow_key(key) == expected


def test_a_run_left_open_is_marked_failed(mlflow_server, tmp_path, rounds):
    cb = MLflowLoggerCallback(tracking_uri=mlflow_server.url, experiment_name="sgd-open")
    cb.start_training(logdir=str(tmp_path / "run_001"), config={})
    cb.handle_result(rounds[0])
    abandoned = cb.run_id  # the driver never called finish_training for it
    second = log_run(cb, tmp_path / "run_002", rounds[:1])
    client = MlflowClient(tracking_uri=mlflow_server.url)
    assert client.get_run(abandoned).info.status == "FAILED"
    assert client.get_run(second).info.status == "FINISHED"
