"""``sgd_horovod.RayExecutor``: Horovod's embedding API on sgd workers, real Horovod over Gloo."""

import os
import time

import pytest
import ray

from sgd_horovod import CollectiveInExecuteSingleError, RayExecutor, RayExecutorSettings, RayHostDiscovery

pytestmark = pytest.mark.usefixtures("requires_horovod")


class Trainer:
    """A stateful executable: hvd.init() in __init__ works, because RayExecutor creates it
    after the Horovod environment is set (as Horovod's own RayExecutor does)."""

    def __init__(self, lr, scale=1.0):
        import horovod.torch as hvd
        import torch

        hvd.init()
        self.rank = hvd.rank()
        self.tag = os.environ.get("MY_TAG")
        torch.manual_seed(10 + self.rank)  # different initial weights per worker...
        self.model = torch.nn.Linear(2, 1)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)  # ...made equal
        opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.opt = hvd.DistributedOptimizer(opt, named_parameters=self.model.named_parameters())
        gen = torch.Generator().manual_seed(self.rank)
        self.x = torch.randn(64, 2, generator=gen)
        self.y = scale * (self.x @ torch.tensor([[1.5], [-0.5]]))
        self.epochs = 0

    def train(self):
        import torch

        total = 0.0
        for xb, yb in zip(self.x.split(8), self.y.split(8)):
            self.opt.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(xb), yb)
            loss.backward()
            self.opt.step()
            total += loss.item()
        self.epochs += 1
        return total / 8

    def weights(self):
        return self.model.weight.detach().clone()


@pytest.fixture(scope="module")
def executor():
    from sgd_testing.fixtures import _start_local_ray

    _start_local_ray()
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=2, cpus_per_worker=1)
    executor.start(executable_cls=Trainer, executable_args=[0.05], executable_kwargs={"scale": 2.0},
                   extra_env_vars={"MY_TAG": "from-driver"})
    yield executor
    executor.shutdown()


def test_stateful_executable_trains_per_epoch(executor):
    import torch

    per_epoch = [executor.execute(lambda t: t.train()) for _ in range(4)]
    for rank in range(2):
        losses = [epoch[rank] for epoch in per_epoch]
        assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert executor.execute(lambda t: (t.rank, t.epochs, t.tag)) == [(0, 4, "from-driver"), (1, 4, "from-driver")]
    w0, w1 = executor.execute(lambda t: t.weights())
    assert torch.equal(w0, w1)


def test_run_and_run_remote_take_args(executor):
    def add(a, b=0):
        import horovod.torch as hvd

        return hvd.rank() * 100 + a + b

    assert executor.run(add, args=[1], kwargs={"b": 2}) == [3, 103]
    refs = executor.run_remote(add, args=[5])
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert ray.get(refs) == [5, 105]
    assert len(executor.workers) == 2
    # The handles have the methods of Horovod's BaseHorovodWorker.
    assert ray.get(executor.workers[1].execute.remote(lambda t: t.rank)) == 1
    assert ray.get(executor.workers[0].env_vars.remote())["HOROVOD_SIZE"] == "2"


def test_execute_single_runs_on_rank_0_only(executor):
    assert executor.execute_single(lambda t: (t.rank, os.environ["HOROVOD_RANK"])) == (0, "0")


@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "barrier", "optimizer_step"])
def test_collective_in_execute_single_is_refused_not_a_hang(executor, collective):
    def fn(trainer):
        import horovod.torch as hvd
        import torch

        if collective == "allreduce":
            hvd.allreduce(torch.ones(1))
        elif collective == "broadcast":
            hvd.broadcast_parameters(trainer.model.state_dict(), root_rank=0)
        elif collective == "barrier":
            hvd.barrier()
        else:
            trainer.train()  # DistributedOptimizer all-reduces the gradients

    start = time.monotonic()
    with pytest.raises(CollectiveInExecuteSingleError, match="execute_single.*rank 0 only.*RayExecutor.execute"):
        executor.execute_single(fn)
    assert time.monotonic() - start < 10  # refused at once, not after the 30 s Gloo timeout
    # The guard is gone afterwards and Horovod still works on every worker.
    assert executor.run(_allreduce_sum) == [3.0, 3.0]


def _allreduce_sum():
    import horovod.torch as hvd
    import torch

    return hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()


def test_init_in_execute_single_is_refused_until_initialised(ray_cluster):
    def init(_):
        import horovod.torch as hvd

        hvd.init()
        return hvd.rank()

    with RayExecutor(num_workers=2) as executor:
        executor.start()  # no executable: nothing initialised Horovod yet
        with pytest.raises(CollectiveInExecuteSingleError, match="'init'"):
            executor.execute_single(init)
        assert executor.execute(init) == [0, 1]  # on every worker it works...
        assert executor.execute_single(init) == 0  # ...and then init() is a no-op on rank 0 alone
    with pytest.raises(RuntimeError, match="not started"):
        executor.execute(init)


def test_one_worker_needs_no_guard(ray_cluster):
    executor = RayExecutor(num_workers=1)
    executor.start()
    try:
        assert executor.execute_single(lambda _: _init_and(_allreduce_sum)) == 1.0
    finally:
        executor.shutdown()


def _init_and(fn):
    import horovod.torch as hvd

    hvd.init()
    return fn()


def test_start_twice_and_restart_after_shutdown(ray_cluster):
    executor = RayExecutor(num_workers=2)
    executor.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            executor.start()
        assert executor.run(_init_and, args=[_allreduce_sum]) == [3.0, 3.0]
    finally:
        executor.shutdown()
    executor.shutdown()  # twice is fine
    executor.start()  # a new group and a new rendezvous
    try:
        assert executor.run(_init_and, args=[_allreduce_sum]) == [3.0, 3.0]
    finally:
        executor.shutdown()


def test_executable_error_surfaces_and_releases_the_workers(ray_cluster):
    class Broken:
        def __init__(self):
            raise ValueError("bad executable")

    executor = RayExecutor(num_workers=2)
    with pytest.raises(ValueError, match="bad executable"):
        executor.start(executable_cls=Broken)
    with pytest.raises(RuntimeError, match="not started"):
        executor.execute(lambda t: t)


def test_settings_and_bad_arguments():
    settings = RayExecutor.create_settings(timeout_s=12, nics={"lo"}, placement_group_timeout_s=5)
    assert isinstance(settings, RayExecutorSettings)
    assert (settings.timeout_s, settings.nics, settings.placement_group_timeout_s) == (12, {"lo"}, 5)
    assert RayExecutor(num_hosts=2, num_workers_per_host=3).num_workers == 6
    assert RayExecutor(num_workers=2, use_gpu=True).gpus_per_worker == 1
    with pytest.raises(ValueError, match="num_workers"):
        RayExecutor(num_workers=0)
    with pytest.raises(ValueError, match="needs num_workers"):
        RayExecutor()
    with pytest.raises(ValueError, match="either num_workers or num_hosts"):
        RayExecutor(num_workers=2, num_hosts=2)
    with pytest.raises(ValueError, match="use_gpu=False"):
        RayExecutor(num_workers=2, gpus_per_worker=1)
    with pytest.raises(ValueError, match="cpus_per_worker"):
        RayExecutor(num_workers=2, cpus_per_worker=-1)
    elastic = RayExecutor(min_workers=1, max_workers=2)  # Horovod's elastic mode (test_ray_elastic.py)
    assert elastic.settings.elastic and isinstance(elastic.settings.discovery, RayHostDiscovery)
    with pytest.raises(TypeError, match="create_settings"):
        RayExecutor(settings="fast", num_workers=2)
    with pytest.raises(TypeError, match="extra_env_vars"):
        RayExecutor(num_workers=1).start(extra_env_vars=["A=1"])
    with pytest.warns(UserWarning, match="callbacks"):
        from sgd_horovod.executor import _warn_callbacks

        _warn_callbacks([print])


def test_infeasible_placement_is_a_timeout_error_as_in_horovod(ray_cluster):
    """Horovod's RayExecutor raises TimeoutError when the placement group never becomes ready;
    sgd's ResourcesUnavailableError is one (and still a RuntimeError)."""
    import sgd

    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=2)
    executor = RayExecutor(settings, num_workers=2, cpus_per_worker=10_000)
    with pytest.raises(TimeoutError, match="could not place 2 workers") as info:
        executor.start()
    assert isinstance(info.value, sgd.ResourcesUnavailableError) and isinstance(info.value, RuntimeError)
    with pytest.raises(RuntimeError, match="not started"):
        executor.run(os.getpid)
