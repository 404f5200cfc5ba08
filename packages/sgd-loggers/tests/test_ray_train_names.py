"""Ray Train 1.x names on the loggers (issue 18): ``log_path``, ``MLflowLoggerCallback(logdir=...)``."""

from __future__ import annotations

import json

import pytest

from sgd_loggers import CSVLoggerCallback, JsonLoggerCallback


def test_json_and_csv_log_path(tmp_path, rounds):
    json_cb, csv_cb = JsonLoggerCallback(), CSVLoggerCallback(filename="r.csv")
    assert json_cb.log_path is None and csv_cb.log_path is None
    for cb in (json_cb, csv_cb):
        cb.start_training(logdir=str(tmp_path), config={})
        for r in rounds:
            cb.handle_result(r)
        cb.finish_training()
    assert json_cb.log_path == json_cb.path == tmp_path / "results.json"
    assert len(json.loads(json_cb.log_path.read_text())) == len(rounds)
    assert csv_cb.log_path == tmp_path / "r.csv"
    assert len(csv_cb.log_path.read_text().splitlines()) == len(rounds) + 1


def test_mlflow_logdir(tmp_path, rounds):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from sgd_loggers import MLflowLoggerCallback

    run_dir = tmp_path / "train" / "run_001"
    for logdir, expected in (("mlflow_store", run_dir / "mlflow_store"), (tmp_path / "abs", tmp_path / "abs")):
        cb = MLflowLoggerCallback(logdir=logdir)
        cb.start_training(logdir=str(run_dir), config={"lr": 0.5})
        for r in rounds:
            cb.handle_result(r)
        cb.finish_training()
        assert cb.tracking_uri == f"sqlite:///{expected.resolve()}/mlflow.db"
        assert (expected / "mlflow.db").is_file()
        client = MlflowClient(tracking_uri=cb.tracking_uri)
        run = client.get_run(cb.run_id)
        assert run.data.params == {"lr": "0.5"}
        assert [m.value for m in client.get_metric_history(cb.run_id, "loss")] == [r[0]["loss"] for r in rounds]
    assert not (run_dir / "mlflow.db").exists()


def test_mlflow_logdir_of_wrong_type_is_a_clear_error():
    pytest.importorskip("mlflow")
    from sgd_loggers import MLflowLoggerCallback

    with pytest.raises(TypeError, match=r"logdir=.*takes a path, got int"):
        MLflowLoggerCallback(logdir=3)
