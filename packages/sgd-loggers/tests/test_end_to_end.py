"""Every callback through a real ``sgd.Trainer`` run: 2 Ray workers, the no-op backend."""

from __future__ import annotations

import io
import json
import math
import uuid

import pytest

import sgd
from sgd_loggers import (
    CSVLoggerCallback,
    JsonLoggerCallback,
    MLflowLoggerCallback,
    PrintCallback,
    ProgressCallback,
    TBXLoggerCallback,
    WandbLoggerCallback,
)

CONFIG = {"lr": 0.5, "epochs": 3, "model": {"width": 8}}


def train_func(config):
    for epoch in range(config["epochs"]):
        sgd.report(loss=round(1.0 / (epoch + 1) + sgd.world_rank(), 6), extra={"acc": 0.25 * (epoch + 1)})
    if config.get("checkpoint"):
        sgd.save_checkpoint(weights=[1.0, 2.0])
    if config.get("fail"):
        raise ValueError("failing on purpose")
    return sgd.world_rank()


def losses(rank):
    return [round(1.0 / e + rank, 6) for e in (1, 2, 3)]


@pytest.fixture
def trainer(ray_cluster):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2)
    trainer.start()
    yield trainer
    trainer.shutdown()


def test_json_and_csv(trainer):
    json_cb, csv_cb = JsonLoggerCallback(workers_to_log=None), CSVLoggerCallback(worker_to_log=1)
    assert trainer.run(train_func, config=CONFIG, callbacks=[json_cb, csv_cb]) == [0, 1]
    run_dir = trainer.latest_run_dir
    data = json.loads((run_dir / "results.json").read_text())
    assert [[w["loss"] for w in r] for r in data] == [list(pair) for pair in zip(losses(0), losses(1))]
    assert [[w["_training_iteration"] for w in r] for r in data] == [[1, 1], [2, 2], [3, 3]]
    assert [r[0]["extra"] for r in data] == [{"acc": 0.25}, {"acc": 0.5}, {"acc": 0.75}]
    lines = (run_dir / "results.csv").read_text().splitlines()
    assert lines[0] == "loss,extra/acc,_timestamp,_time_this_iter_s,_training_iteration"
    assert [ln.split(",")[:2] + ln.split(",")[-1:] for ln in lines[1:]] == [
        [str(loss), str(acc), str(it)] for loss, acc, it in zip(losses(1), (0.25, 0.5, 0.75), (1, 2, 3))
    ]


class CrashAt(sgd.TrainingCallback):
    """Ends the run from the driver in the middle of training, at a known round."""

    def __init__(self, iteration):
        self.iteration = iteration

    def handle_result(self, results, **info):
        if results[0]["_training_iteration"] == self.iteration:
            raise KeyboardInterrupt("driver stopped mid-run")


def test_json_and_csv_files_survive_a_run_stopped_mid_way(trainer):
    json_cb, csv_cb = JsonLoggerCallback(), CSVLoggerCallback()
    with pytest.raises(KeyboardInterrupt):
        trainer.run(train_func, config=CONFIG, callbacks=[json_cb, csv_cb, CrashAt(2)])
    data = json.loads((trainer.latest_run_dir / "results.json").read_text())
    assert [r[0]["loss"] for r in data] == losses(0)[:2]
    assert len((trainer.latest_run_dir / "results.csv").read_text().splitlines()) == 1 + 2


def test_tensorboard(trainer):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    trainer.run(train_func, config=CONFIG, callbacks=[TBXLoggerCallback()])
    acc = ea.EventAccumulator(str(trainer.latest_run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, round(e.value, 5)) for e in acc.Scalars("sgd/loss")] == list(
        zip([1, 2, 3], [round(v, 5) for v in losses(0)])
    )
    assert [e.value for e in acc.Scalars("sgd/extra/acc")] == [0.25, 0.5, 0.75]


def test_mlflow_server_finished_with_checkpoint_then_failed(trainer, mlflow_server):
    from mlflow.tracking import MlflowClient

    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cb = MLflowLoggerCallback(tracking_uri=mlflow_server.url, experiment_name=name, save_artifact=True)
    trainer.run(train_func, config={**CONFIG, "checkpoint": True}, callbacks=[cb])
    client = MlflowClient(tracking_uri=mlflow_server.url)
    run = client.get_run(cb.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.5", "epochs": "3", "model/width": "8", "checkpoint": "True"}
    assert [(m.step, m.value) for m in client.get_metric_history(cb.run_id, "loss")] == list(zip([1, 2, 3], losses(0)))
    checkpoints = sorted(p.name for p in (trainer.latest_run_dir / "checkpoints").iterdir())
    assert checkpoints and [a.path for a in client.list_artifacts(cb.run_id, "checkpoints")] == [
        f"checkpoints/{c}" for c in checkpoints
    ]
    first_run = cb.run_id

    with pytest.raises(ValueError):
        trainer.run(train_func, config={**CONFIG, "fail": True}, callbacks=[cb])
    assert cb.run_id != first_run
    assert client.get_run(cb.run_id).info.status == "FAILED"


def test_mlflow_default_local_store(trainer):
    from mlflow.tracking import MlflowClient

    cb = MLflowLoggerCallback()
    trainer.run(train_func, config=CONFIG, callbacks=[cb])
    assert cb.tracking_uri == f"sqlite:///{trainer.latest_run_dir}/mlflow.db"
    client = MlflowClient(tracking_uri=cb.tracking_uri)
    assert client.get_run(cb.run_id).info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(cb.run_id, "extra/acc")] == [0.25, 0.5, 0.75]


def test_wandb_offline(trainer, read_wandb_offline):
    pytest.importorskip("wandb")
    cb = WandbLoggerCallback(project="sgd-e2e")
    trainer.run(train_func, config=CONFIG, callbacks=[cb])
    run = read_wandb_offline(trainer.latest_run_dir)
    assert run.config == CONFIG and run.exit_code == 0
    assert [(h["_step"], h["loss"]) for h in run.history] == list(zip([1, 2, 3], losses(0)))


def test_print_progress_and_plot(trainer, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("COLUMNS", "200")  # the width of a stream that is not a terminal
    from sgd_loggers.plot import load_rounds, make_figure

    progress_out = io.StringIO()
    progress = ProgressCallback(stream=progress_out, enabled=True, refresh_s=0)
    trainer.run(train_func, config=CONFIG, callbacks=[PrintCallback(), progress])
    printed = capsys.readouterr().out
    rounds = [json.loads(chunk + "]") for chunk in printed.split("\n]\n") if chunk.strip()]
    assert [[w["loss"] for w in r] for r in rounds] == [list(pair) for pair in zip(losses(0), losses(1))]
    drawn = progress_out.getvalue()
    assert drawn.count("\r") == 4 and drawn.endswith(" | done\x1b[K\n")
    assert drawn.startswith("\rsgd run_001 | iter 1 | 0:00:0")
    assert "| iter 3 |" in drawn and "loss=0.3333 extra/acc=0.75" in drawn

    # `sgd plot` reads the results.jsonl the core wrote for the same run.
    loaded, source = load_rounds(trainer.latest_run_dir)
    assert source.name == "results.jsonl"
    ax = make_figure(loaded, ["loss"]).get_axes()[0]
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()}
    assert lines == {"worker 0": losses(0), "worker 1": losses(1)}
    assert not any(math.isnan(v) for v in lines["worker 0"])
