"""A driver killed with SIGKILL mid-run; Trainer.restore continues the run from its directory."""

import json
import textwrap

import pytest
import ray

import sgd
from sgd_testing import sigkill_when

TRAIN_FUNC = '''
import os, threading
import sgd

def deterministic(config):
    state = sgd.load_checkpoint() or {"step": 0, "w": 1}
    step, w = state["step"], state["w"]
    while step < config["steps"]:
        if step == config.get("block_at"):
            threading.Event().wait()  # the workload hangs here until its driver is killed
        w = (3 * w + 1) % 1_000_000_007
        step += 1
        if config.get("save_first"):  # Ray 1.x's order: the checkpoint goes with the report after it
            sgd.save_checkpoint(step=step, w=w)
            if step == config.get("block_after_save"):
                threading.Event().wait()  # killed with this step's checkpoint written, its report not
            sgd.report(step=step, w=w)
        else:
            sgd.report(step=step, w=w)
            sgd.save_checkpoint(step=step, w=w)
    return w
'''


@pytest.mark.parametrize("save_first", [False, True], ids=["report_then_save", "save_then_report"])
def test_restore_after_driver_sigkill(ray_cluster, tmp_path, save_first):
    """Killed with checkpoint 4 written: report then save resumes after step 4; save then
    report has not delivered step 4's report yet, so it resumes from checkpoint 3 and redoes
    step 4. Either way each step is reported once and the result equals a run never killed."""
    namespace: dict = {}
    exec(TRAIN_FUNC, namespace)
    deterministic = namespace["deterministic"]
    address = ray.get_runtime_context().gcs_address
    config = {"steps": 8, "save_first": True, "block_after_save": 4} if save_first else {"steps": 8, "block_at": 4}
    script = TRAIN_FUNC + textwrap.dedent(f"""
        import ray
        ray.init(address={address!r})
        trainer = sgd.Trainer(backend="base", num_workers=2, logdir={str(tmp_path / "exp")!r})
        trainer.start()
        trainer.run(deterministic, config={config!r})
    """)
    run_dir = tmp_path / "exp" / "run_001"
    sigkill_when(script, lambda: (run_dir / "checkpoints" / "checkpoint_000004").is_dir(),
                 message="the driver never wrote checkpoint 4")

    trainer = sgd.Trainer.restore(run_dir)
    assert trainer.num_workers == 2 and trainer.backend_config.name == "base"
    trainer.start()
    try:
        out = trainer.run(deterministic, config={"steps": 8, "save_first": save_first})
    finally:
        trainer.shutdown()

    fresh = sgd.Trainer(backend="base", num_workers=2)
    fresh.start()
    try:
        assert out == fresh.run(deterministic, config={"steps": 8, "save_first": save_first})
    finally:
        fresh.shutdown()
    fresh_lines = [json.loads(x) for x in (fresh.latest_run_dir / "results.jsonl").read_text().splitlines()]
    assert trainer.latest_run_dir == run_dir
    lines = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [line[0]["step"] for line in lines] == list(range(1, 9))
    assert [line[0]["_training_iteration"] for line in lines] == list(range(1, 9))
    assert [line[0]["w"] for line in lines] == [line[0]["w"] for line in fresh_lines]
    assert json.loads((run_dir / "status.json").read_text())["status"] == "FINISHED"
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    # Save then report: step 4, redone from checkpoint 3, wrote its checkpoint into a new folder.
    assert names == [f"checkpoint_{i:06d}" for i in range(1, 10 if save_first else 9)]
    last = sgd.Trainer.load_checkpoint_from_path(run_dir / "checkpoints" / names[-1])
    assert last == {"step": 8, "w": out[0]}


def test_restore_rejects_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an sgd run directory"):
        sgd.Trainer.restore(tmp_path)
