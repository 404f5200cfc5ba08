"""``sgd runs ls`` / ``sgd runs show`` on run directories that real trainers wrote."""

from __future__ import annotations

import json
import re
import shutil

import pytest

import sgd
from sgd import cli, runs


def _train(config):
    for step in range(1, 4):
        loss = config["losses"][step - 1]
        sgd.report(step=step, loss=loss, rank=sgd.world_rank())
        sgd.save_checkpoint(step=step, loss=loss)
    if config.get("fail"):
        raise RuntimeError("diverged")
    return "ok"


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """``exp/run_001`` finished (3 reports, checkpoints ranked by lowest loss), ``exp/run_002`` errored."""
    import sgd_testing.fixtures as f

    f._start_local_ray()
    logdir = tmp_path_factory.mktemp("runs") / "exp"
    trainer = sgd.Trainer(backend="base", num_workers=2, logdir=logdir, max_retries=0)
    trainer.start()
    try:
        trainer.run(_train, config={"losses": [0.5, 0.2, 0.9]},
                    checkpoint_strategy=sgd.CheckpointStrategy(num_to_keep=1, checkpoint_score_attribute="loss",
                                                               checkpoint_score_order="min"))
        with pytest.raises(RuntimeError, match="diverged"):
            trainer.run(_train, config={"losses": [1.0, 1.0, 1.0], "fail": True})
    finally:
        trainer.shutdown()
    return logdir


def test_ls_one_line_per_run(experiment, capsys):
    assert cli.main(["runs", "ls", str(experiment.parent)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"runs under {experiment.parent}:"
    assert lines[1].split() == ["run", "status", "iterations", "started", "latest", "checkpoint"]
    first, second = (line.split() for line in lines[2:])
    assert first[:3] == ["exp/run_001", "FINISHED", "3"] and first[-1] == "checkpoint_000003"
    assert second[:3] == ["exp/run_002", "ERRORED", "3"] and second[-1] == "checkpoint_000003"
    assert len(lines) == 4


def test_ls_json_and_default_root(experiment, results_dir, capsys):
    shutil.copytree(experiment, results_dir / "copied")
    assert cli.main(["runs", "ls", "--json"]) == 0  # the results root: SGD_RESULTS_DIR
    found = json.loads(capsys.readouterr().out)
    assert [r["path"] for r in found] == [str(results_dir / "copied" / f"run_00{i}") for i in (1, 2)]
    assert [r["status"] for r in found] == ["FINISHED", "ERRORED"]
    assert found[0]["iterations"] == 3 and found[0]["latest_checkpoint"] == "checkpoint_000003"
    assert isinstance(found[0]["started"], float)


def test_show_summarises_a_run(experiment, capsys):
    assert cli.main(["runs", "show", str(experiment / "run_001")]) == 0
    out = capsys.readouterr().out
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines()
                if not line.startswith(" ") and not line.startswith("final metrics"))
    assert rows["run"] == str(experiment / "run_001")
    assert rows["status"].startswith("FINISHED at ")
    assert rows["backend"] == "base"
    assert rows["workers"] == "2 (CPU 1, GPU 0 per worker)"
    assert rows["max retries"] == "0" and rows["iterations"] == "3"
    assert rows["checkpoints"] == "2"  # num_to_keep=1: the best (loss 0.2) and the latest
    assert rows["latest checkpoint"] == "checkpoint_000003 (after iteration 3)"
    assert rows["best checkpoint"] == "checkpoint_000002 (after iteration 2)"
    assert "final metrics (rank 0):" in out
    metrics = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("  ")}
    assert metrics["loss"] == "0.9" and metrics["step"] == "3" and metrics["_training_iteration"] == "3"


def test_show_json_and_a_logdir_means_its_latest_run(experiment, capsys):
    assert cli.main(["runs", "show", "--json", str(experiment)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["path"] == str(experiment / "run_002")
    assert summary["status"] == "ERRORED" and summary["backend"] == "base"
    assert summary["num_workers"] == [2, 2] and summary["iterations"] == 3
    assert summary["latest_checkpoint"]["name"] == "checkpoint_000003"
    assert [m["rank"] for m in summary["final_metrics_per_worker"]] == [0, 1]
    assert summary["final_metrics"]["loss"] == 1.0


def test_show_resolves_under_the_results_root(experiment, results_dir, capsys):
    shutil.copytree(experiment, results_dir / "exp")
    assert cli.main(["runs", "show", "--json", "exp/run_001"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == str((results_dir / "exp" / "run_001").resolve())


def test_a_line_cut_short_by_a_crash_is_skipped(experiment, tmp_path):
    run = tmp_path / "run_001"
    shutil.copytree(experiment / "run_001", run)
    with open(run / "results.jsonl", "a") as f:
        f.write('[{"step": 4, "_training_iter')
    assert runs.run_info(run).iterations == 3
    assert runs.run_summary(run)["final_metrics"]["step"] == 3


def test_the_last_line_is_found_past_a_long_one(tmp_path):
    run = tmp_path / "run_001"
    run.mkdir()
    (run / "status.json").write_text('{"status": "RUNNING", "time": 0}')
    big = [{"_training_iteration": 1, "blob": "x" * 300_000}]
    last = [{"_training_iteration": 2, "blob": "y" * 200_000}]
    (run / "results.jsonl").write_text(json.dumps(big) + "\n" + json.dumps(last) + "\n")
    assert runs.last_results(run) == last
    info = runs.run_info(run)
    assert (info.status, info.iterations, info.latest_checkpoint) == ("RUNNING", 2, None)


def test_errors_exit_2(tmp_path, capsys):
    assert cli.main(["runs", "ls", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert cli.main(["runs", "show", str(tmp_path)]) == 2
    assert "is not an sgd run directory" in capsys.readouterr().err


def test_empty_root(tmp_path, capsys):
    assert cli.main(["runs", "ls", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"no runs under {tmp_path}"


def test_running_run_whose_driver_is_gone_shows_driver_died(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(done.stdout)
    for name, pid, host, expected in [
        ("run_001", dead_pid, socket.gethostname(), "DRIVER_DIED"),
        ("run_002", os.getpid(), socket.gethostname(), "RUNNING"),  # this process: alive
        ("run_003", dead_pid, "another-host", "RUNNING"),  # cannot tell from here
    ]:
        run = tmp_path / name
        run.mkdir()
        (run / "status.json").write_text(json.dumps({"status": "RUNNING", "time": 0, "pid": pid, "host": host}))
        assert runs.run_info(run).status == expected, name


def test_a_status_write_cut_short_keeps_the_previous_status(tmp_path, monkeypatch):
    """A driver killed while it writes status.json (forced here: the rename never happens)
    leaves the previous status, not an unreadable file."""
    from sgd import runs
    from sgd.storage import run_dir

    run = run_dir.RunDirectory.create(tmp_path / "run_001")
    assert runs.run_status(run.path) == "RUNNING"

    def killed(*args):
        raise OSError("killed before the rename")

    import os

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(OSError, match="killed"):
        run.close(error=True)
    assert runs.run_status(run.path) == "RUNNING"  # this process is alive: not DRIVER_DIED
