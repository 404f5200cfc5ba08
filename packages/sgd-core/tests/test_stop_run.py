"""``TrainingIterator.stop()``: a run ended early on purpose is ``STOPPED`` and keeps its workers."""

from __future__ import annotations

import json
import os
import threading

import pytest

import sgd
from sgd import cli


def reports_forever(config):
    step = 0
    while True:
        step += 1
        try:
            sgd.report(step=step, pid=os.getpid())
        except Exception:  # the stop is not an Exception: user code cannot swallow it
            raise AssertionError("stop surfaced as an Exception") from None


def blocks_without_reporting(config):
    sgd.report(step=1, pid=os.getpid())
    threading.Event().wait()  # never reaches another report


def reports_pid(config):
    sgd.report(pid=os.getpid())


def _status(run_dir):
    return json.loads((run_dir / "status.json").read_text())["status"]


@pytest.fixture
def trainer(ray_cluster, tmp_path):
    trainer = sgd.Trainer(backend="base", num_workers=2, logdir=tmp_path / "exp", max_retries=0)
    trainer.start()
    yield trainer
    trainer.shutdown()


def test_stopped_run_keeps_its_workers(trainer, capsys):
    iterator = trainer.run_iterator(reports_forever)
    first = [next(iterator) for _ in range(3)]
    pids = sorted(r["pid"] for r in first[0])
    iterator.stop()
    assert iterator.is_finished()
    with pytest.raises(StopIteration):
        next(iterator)
    stopped_dir = trainer.latest_run_dir
    assert _status(stopped_dir) == "STOPPED"
    # The next run goes on the same worker processes.
    iterator = trainer.run_iterator(reports_pid)
    assert sorted(r["pid"] for r in next(iterator)) == pids
    assert iterator.get_final_results(force=True) == [None, None]
    assert _status(trainer.latest_run_dir) == "FINISHED"

    assert cli.main(["runs", "ls", str(trainer.logdir)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.split()[0].endswith(stopped_dir.name))
    assert line.split()[1] == "STOPPED"


def test_worker_that_does_not_stop_is_replaced(trainer):
    iterator = trainer.run_iterator(blocks_without_reporting)
    pids = sorted(r["pid"] for r in next(iterator))
    iterator.stop(patience_s=0.5)
    assert _status(trainer.latest_run_dir) == "STOPPED"
    iterator = trainer.run_iterator(reports_pid)
    new_pids = sorted(r["pid"] for r in next(iterator))
    assert iterator.get_final_results(force=True) == [None, None]
    assert set(new_pids).isdisjoint(pids)  # killed and started afresh


def test_stop_rejects_negative_patience(trainer):
    iterator = trainer.run_iterator(reports_pid)
    with pytest.raises(ValueError, match="patience_s must be >= 0"):
        iterator.stop(patience_s=-1)
    iterator.get_final_results(force=True)
