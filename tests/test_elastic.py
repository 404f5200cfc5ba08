"""Elastic worker counts on a two-node local cluster whose second node leaves and comes back."""

import os
import signal

import pytest

import sgd


def _train(config):
    state = sgd.load_checkpoint() or {"step": 0}
    step = state["step"]
    while step < config["steps"]:
        step += 1
        if config.get("save_first"):  # the checkpoint goes with the report after it
            sgd.save_checkpoint(step=step)
            sgd.report(step=step, world_size=sgd.world_size(), pid=os.getpid())
        else:
            sgd.report(step=step, world_size=sgd.world_size(), pid=os.getpid())
            sgd.save_checkpoint(step=step)
    return sgd.world_size()


@pytest.mark.multinode
@pytest.mark.parametrize("save_first", [False, True], ids=["report_then_save", "save_then_report"])
def test_shrinks_on_node_loss_and_grows_back(two_node_cluster, save_first):
    """Each resize restarts from the checkpoint that goes with the newest delivered report, in
    either order of report and checkpoint: every step is reported once, in order."""
    cluster = two_node_cluster
    second = [n for n in cluster.list_all_nodes() if not n.head][0]
    trainer = sgd.Trainer(backend="base", num_workers=(2, 4), max_retries=-1)
    trainer.start()
    assert len(trainer._controller.worker_group) == 4
    seen = []

    class Chaos(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            step, size = results[0]["step"], results[0]["world_size"]
            seen.append((step, size, len(results)))
            if step == 2:
                cluster.remove_node(second)  # its two workers die with it
            elif step == 4:
                cluster.add_node(num_cpus=2)
                cluster.wait_for_nodes()
                os.kill(results[-1]["pid"], signal.SIGKILL)  # a later restart may grow again

    try:
        sizes = trainer.run(_train, config={"steps": 6, "save_first": save_first}, callbacks=[Chaos()])
    finally:
        trainer.shutdown()
    assert [s for s, _, _ in seen] == [1, 2, 3, 4, 5, 6]
    by_step = {s: (size, n) for s, size, n in seen}
    assert by_step[1] == (4, 4) and by_step[2] == (4, 4)
    assert by_step[3] == (2, 2) and by_step[4] == (2, 2)  # restarted with what was left
    assert by_step[5] == (4, 4) and by_step[6] == (4, 4)  # grew back to max
    assert sizes == [4, 4, 4, 4]


@pytest.mark.multinode
def test_starts_with_what_fits(two_node_cluster):
    trainer = sgd.Trainer(backend="base", num_workers=(1, 8))
    trainer.start()
    try:
        assert trainer.run(lambda: sgd.world_size()) == [4, 4, 4, 4]
    finally:
        trainer.shutdown()
