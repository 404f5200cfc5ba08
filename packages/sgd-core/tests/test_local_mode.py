"""``num_workers=0``: the training function runs in the driver's process, with the session API."""

from __future__ import annotations

import json
import os
import threading

import pytest

import sgd


def _train(config):
    state = sgd.load_checkpoint() or {"step": 0}
    for step in range(state["step"] + 1, config["steps"] + 1):
        sgd.report(step=step, rank=sgd.world_rank(), size=sgd.world_size(), pid=os.getpid(),
                   thread=threading.current_thread().name)
        sgd.save_checkpoint(step=step)
    return "done"


def test_local_mode_runs_in_this_process_with_the_session_api(tmp_path):
    rows = []

    class Rows(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            rows.append(results)

    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=0, logdir=tmp_path)
    trainer.start()
    try:
        assert trainer.run(_train, config={"steps": 3}, callbacks=[Rows()]) == ["done"]
        assert [r[0]["step"] for r in rows] == [1, 2, 3] and all(len(r) == 1 for r in rows)
        first = rows[0][0]
        assert (first["rank"], first["size"], first["pid"]) == (0, 1, os.getpid())  # this process
        assert first["thread"] == "sgd-train" and first["_training_iteration"] == 1
        assert trainer.latest_checkpoint == {"step": 3}
        lines = (trainer.latest_run_dir / "results.jsonl").read_text().splitlines()
        assert [json.loads(line)[0]["step"] for line in lines] == [1, 2, 3]
        assert json.loads((trainer.latest_run_dir / "status.json").read_text())["status"] == "FINISHED"
        # Resumes from a checkpoint as any run does; the iterator form works too.
        it = trainer.run_iterator(_train, config={"steps": 5}, checkpoint=trainer.best_checkpoint_path)
        assert [r[0]["step"] for r in it] == [4, 5]
        # Ranks outside the run are this process's again (with the usual warning).
        with pytest.warns(RuntimeWarning, match="outside an sgd worker"):
            assert sgd.world_rank() == 0
        assert trainer.stacks()[0].startswith("=== rank 0 (pid ")
    finally:
        trainer.shutdown()
    assert sgd.session.get_session() is None


def _fails(config):
    sgd.report(step=1)
    raise ValueError("bad step")


def test_an_error_in_local_mode_is_raised_with_its_own_type_and_keeps_the_rows(tmp_path):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=0, logdir=tmp_path)
    trainer.start()
    try:
        with pytest.raises(ValueError, match="bad step"):
            trainer.run(_fails, config={})
        lines = (trainer.latest_run_dir / "results.jsonl").read_text().splitlines()
        assert [json.loads(line)[0]["step"] for line in lines] == [1]
        assert trainer.run(lambda: sgd.world_size()) == [1]  # usable again
    finally:
        trainer.shutdown()


def test_local_mode_bad_input():
    with pytest.raises(ValueError, match=r"num_workers must be a positive int \(or 0: local mode"):
        sgd.Trainer(backend=sgd.BackendConfig(), num_workers=-1)
    with pytest.raises(ValueError, match="0 < min <= max"):
        sgd.Trainer(backend=sgd.BackendConfig(), num_workers=(0, 2))


def test_local_mode_with_use_gpu_says_why_not_when_this_process_sees_no_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match="runs the function in this process, which sees no GPU"):
        sgd.Trainer(backend=sgd.BackendConfig(), num_workers=0, use_gpu=True)
