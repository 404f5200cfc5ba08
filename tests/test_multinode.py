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


# --- GPU sharing for any backend (Backend.share_cuda_visible_devices, issue 18) -----------


class SharingBackend(sgd.Backend):
    """A third-party backend that asks for Ray Train's per-node GPU sharing."""

    share_cuda_visible_devices = True


class SharingConfig(sgd.BackendConfig):
    @property
    def backend_cls(self):
        return SharingBackend


def _gpus():
    import os

    import ray

    return (ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()],
            os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("SGD_OWN_GPU_IDS"))


def _check_shared(results):
    by_node = {}
    for node, own, _, _ in results:
        by_node.setdefault(node, []).extend(own)
    assert len(by_node) == 2 and all(len(ids) == 2 for ids in by_node.values())
    for node, own, visible, own_env in results:
        assert len(own) == 1
        assert visible == ",".join(sorted(by_node[node]))  # every GPU of the node's workers
        assert own_env == own[0]  # and which one is its own


def _torch_gpus():
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return _gpus(), t.item()


@pytest.mark.multinode
def test_share_cuda_visible_devices_for_any_backend(two_node_gpu_cluster):
    from sgd_torch import TorchConfig

    trainer = sgd.Trainer(backend=SharingConfig(), num_workers=4, use_gpu=True)
    trainer.start()
    try:
        _check_shared(trainer.run(_gpus))
    finally:
        trainer.shutdown()

    # Without the switch each worker sees only the GPU Ray gave it.
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=4, use_gpu=True)
    trainer.start()
    try:
        for _, own, visible, own_env in trainer.run(_gpus):
            assert visible == own[0] and own_env is None
    finally:
        trainer.shutdown()

    # sgd-torch goes through the same mechanism (gloo: the GPUs are logical only).
    trainer = sgd.Trainer(backend=TorchConfig(backend="gloo"), num_workers=4, use_gpu=True)
    trainer.start()
    try:
        results = trainer.run(_torch_gpus)
        _check_shared([r[0] for r in results])
        assert all(r[1] == 4.0 for r in results)
    finally:
        trainer.shutdown()
