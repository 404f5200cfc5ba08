"""Horovod across two Ray nodes (a local two-node cluster), and an elastic restart after one
leaves. Its own module: the two-node fixture replaces the session's shared cluster, so no
module-scoped trainer on the shared cluster may be alive meanwhile."""

import os

import pytest

import sgd

pytestmark = pytest.mark.usefixtures("requires_horovod")


def _elastic(config):
    import horovod.torch as hvd
    import torch

    hvd.init()
    state = sgd.load_checkpoint() or {"step": 0}
    step = state["step"]
    while step < config["steps"]:
        step += 1
        total = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()  # needs every worker
        sgd.report(step=step, size=hvd.size(), total=total, local=(hvd.local_rank(), hvd.local_size()),
                   cross=(hvd.cross_rank(), hvd.cross_size()), pid=os.getpid())
        sgd.save_checkpoint(step=step)
    return hvd.size()


@pytest.mark.multinode
def test_two_nodes_then_elastic_shrink_after_node_loss(two_node_cluster):
    """4 workers on two Ray nodes: local and cross ranks follow the nodes. The second node
    leaves mid-run: the job restarts with the 2 workers that fit, over a new rendezvous."""
    second = [n for n in two_node_cluster.list_all_nodes() if not n.head][0]
    trainer = sgd.Trainer(backend="horovod", num_workers=(2, 4), max_retries=2)
    trainer.start()
    seen = []

    class RemoveNode(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            seen.append(results)
            if results[0]["step"] == 2:
                two_node_cluster.remove_node(second)  # its two workers die with it

    try:
        sizes = trainer.run(_elastic, config={"steps": 4}, callbacks=[RemoveNode()])
    finally:
        trainer.shutdown()
    assert [r[0]["step"] for r in seen] == [1, 2, 3, 4]
    before, after = seen[0], seen[-1]
    assert [r["size"] for r in before] == [4] * 4 and [r["total"] for r in before] == [4.0] * 4
    assert [tuple(r["local"]) for r in before] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [tuple(r["cross"]) for r in before] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert [r["size"] for r in after] == [2, 2] and [r["total"] for r in after] == [2.0, 2.0]
    assert [tuple(r["cross"]) for r in after] == [(0, 1), (0, 1)]
    assert sizes == [2, 2]
