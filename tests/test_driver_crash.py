"""A driver killed with SIGKILL mid-run; Trainer.restore continues the run from its directory."""

import json
import textwrap

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
        sgd.report(step=step, w=w)
        sgd.save_checkpoint(step=step, w=w)
    return w
'''


def test_restore_after_driver_sigkill(ray_cluster, tmp_path):
    namespace: dict = {}
    exec(TRAIN_FUNC, namespace)
    deterministic = namespace["deterministic"]
    address = ray.get_runtime_context().gcs_address
    script = TRAIN_FUNC + textwrap.dedent(f"""
        import ray
        ray.init(address={address!r})
        trainer = sgd.Trainer(backend="base", num_workers=2, logdir={str(tmp_path / "exp")!r})
        trainer.start()
        trainer.run(deterministic, config={{"steps": 8, "block_at": 4}})
    """)
    run_dir = tmp_path / "exp" / "run_001"
    sigkill_when(script, lambda: (run_dir / "checkpoints" / "checkpoint_000004").is_dir(),
                 message="the driver never wrote checkpoint 4")

    trainer = sgd.Trainer.restore(run_dir)
    assert trainer.num_workers == 2 and trainer.backend_config.name == "base"
    trainer.start()
    try:
        out = trainer.run(deterministic, config={"steps": 8})
    finally:
        trainer.shutdown()

    fresh = sgd.Trainer(backend="base", num_workers=2)
    fresh.start()
    try:
        assert out == fresh.run(deterministic, config={"steps": 8})
    finally:
        fresh.shutdown()
    assert trainer.latest_run_dir == run_dir
    lines = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert [line[0]["step"] for line in lines] == list(range(1, 9))
    assert [line[0]["_training_iteration"] for line in lines] == list(range(1, 9))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"checkpoint_{i:06d}" for i in range(1, 9)]
    assert json.loads((run_dir / "status.json").read_text())["status"] == "FINISHED"


def test_restore_rejects_a_folder_that_is_not_a_run(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="not an sgd run directory"):
        sgd.Trainer.restore(tmp_path)
