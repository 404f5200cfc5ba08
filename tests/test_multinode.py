"""Two Ray nodes on this machine: ranks are grouped per node and the process group forms."""

import pytest

import sgd


def _where():
    import os

    import ray
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return (sgd.world_rank(), sgd.local_rank(), sgd.node_rank(), sgd.local_world_size(),
            ray.get_runtime_context().get_node_id(), int(os.environ["LOCAL_RANK"]), t.item())


@pytest.mark.multinode
def test_local_and_node_ranks_on_two_nodes(two_node_cluster):
    trainer = sgd.Trainer(backend="torch", num_workers=4)
    trainer.start()
    try:
        results = trainer.run(_where)
    finally:
        trainer.shutdown()
    assert [r[0] for r in results] == [0, 1, 2, 3]
    assert [r[1] for r in results] == [0, 1, 0, 1]
    assert [r[2] for r in results] == [0, 0, 1, 1]
    assert all(r[3] == 2 for r in results)
    assert [r[5] for r in results] == [0, 1, 0, 1]
    nodes = [r[4] for r in results]
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
    assert all(r[6] == 4.0 for r in results)  # the all_reduce spans both nodes
