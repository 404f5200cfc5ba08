"""The "horovod" backend on real workers: real Ray, real Horovod over Gloo.

Environment, ranks and collectives, repeated hvd.init()/hvd.shutdown(), a synchronised
DistributedOptimizer regression, a stateful class through to_worker_group, teardown,
a worker killed mid-run, and bad configuration.
"""

import os
import socket

import pytest
import ray

import sgd
from sgd_horovod import HorovodConfig
from sgd_horovod.config import rendezvous_service
from sgd_testing import KillWorker

pytestmark = pytest.mark.usefixtures("requires_horovod")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """One started 2-worker Horovod trainer for the module (starting one costs seconds)."""
    from sgd_testing.fixtures import _start_local_ray

    _start_local_ray()
    trainer = sgd.Trainer(backend="horovod", num_workers=2, logdir=tmp_path_factory.mktemp("horovod"))
    trainer.start()
    yield trainer
    trainer.shutdown()


_KEYS = [
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
    "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "HOROVOD_GLOO_IFACE", "HOROVOD_GLOO_TIMEOUT_SECONDS",
]


def test_every_worker_gets_the_horovod_environment(trainer):
    def read_env():
        return {k: os.environ.get(k) for k in _KEYS}, ray.get_runtime_context().get_node_id()

    (env0, node0), (env1, node1) = trainer.run(read_env)
    assert [env0["HOROVOD_RANK"], env1["HOROVOD_RANK"]] == ["0", "1"]
    assert [env0["HOROVOD_LOCAL_RANK"], env1["HOROVOD_LOCAL_RANK"]] == ["0", "1"]
    for env, node in ((env0, node0), (env1, node1)):
        assert env["HOROVOD_SIZE"] == env["HOROVOD_LOCAL_SIZE"] == "2"
        assert env["HOROVOD_CROSS_RANK"] == "0" and env["HOROVOD_CROSS_SIZE"] == "1"
        assert env["HOROVOD_HOSTNAME"] == node  # local ranks are grouped by Ray node
        assert env["HOROVOD_CONTROLLER"] == "gloo" and env["HOROVOD_CPU_OPERATIONS"] == "gloo"
        assert env["HOROVOD_GLOO_IFACE"] == "lo"  # one node: loopback, as horovodrun does
        assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "300"
    # The rendezvous server is the driver's, and it is listening.
    service = rendezvous_service(trainer._controller.worker_group)
    assert env0["HOROVOD_GLOO_RENDEZVOUS_PORT"] == env1["HOROVOD_GLOO_RENDEZVOUS_PORT"] == str(service.port)
    assert env0["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == ray.util.get_node_ip_address()


def _ranks_and_sum():
    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    gathered = hvd.allgather(torch.tensor([hvd.rank()])).tolist()
    return hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), total, gathered


def test_ranks_and_allreduce(trainer):
    results = trainer.run(_ranks_and_sum)
    assert [r[0] for r in results] == [0, 1]
    assert [r[1:4] for r in results] == [(2, 0, 2), (2, 1, 2)]
    assert [r[4] for r in results] == [3.0, 3.0]  # 1 + 2 on both workers
    assert [r[5] for r in results] == [[0, 1], [0, 1]]


def test_init_and_shutdown_repeat_within_and_across_runs(trainer):
    def cycles(config):
        import horovod.torch as hvd
        import torch

        sums = []
        for i in range(config["cycles"]):
            hvd.init()
            sums.append(hvd.allreduce(torch.tensor([float(i + hvd.rank())]), op=hvd.Sum).item())
            hvd.shutdown()
        return sums, hvd.is_initialized()

    for _ in range(2):
        results = trainer.run(cycles, config={"cycles": 2})
        assert results == [([1.0, 3.0], False)] * 2
    # And a run after those that leaves Horovod initialised, followed by one that just uses it.
    assert [r[4] for r in trainer.run(_ranks_and_sum)] == [3.0, 3.0]
    assert [r[4] for r in trainer.run(_ranks_and_sum)] == [3.0, 3.0]


def _pid_ranks_and_sum_leaving_state(config):
    """This process's pid, Horovod's ranks and an allreduce; and what an elastic job leaves set in
    a worker (``ray_logger``'s queue, the commit order), as it was when the run began."""
    import horovod.torch as hvd
    import torch

    from sgd_horovod import in_place, ray_logger

    before = (ray_logger._configured, in_place._KEEP_FIRST)
    ray_logger.configure(None)
    in_place.keep_before_host_check()
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    return os.getpid(), hvd.rank(), sgd.world_rank(), total, before


def test_a_kept_process_serves_the_next_horovod_group(ray_cluster):
    """sgd.keep_workers: a Horovod group's clean shutdown parks its processes (hvd.shutdown() ran
    there); the next Horovod trainer starts in them, Horovod meets again at the new group's
    rendezvous, and nothing the last run set is left."""
    from sgd.worker_group.keep import KEPT, end_kept_workers

    before = KEPT.max_idle()
    end_kept_workers()
    sgd.keep_workers(4)
    try:
        runs = []
        for _ in range(2):
            trainer = sgd.Trainer(backend="horovod", num_workers=2)
            trainer.start()
            try:
                runs.append(trainer.run(_pid_ranks_and_sum_leaving_state, config={}))
            finally:
                trainer.shutdown()
            assert sgd.kept_workers() == 2
        first, second = runs
        assert sorted(r[0] for r in second) == sorted(r[0] for r in first)  # the same processes
        for results in runs:
            assert [(r[1], r[2], r[3]) for r in results] == [(0, 0, 3.0), (1, 1, 3.0)]
            assert [r[4] for r in results] == [(False, False)] * 2  # forgotten at the last shutdown
    finally:
        end_kept_workers()
        KEPT.limit = before


def test_a_kept_process_reads_no_horovod_variable_only_the_last_group_had(monkeypatch):
    from sgd_horovod import config

    monkeypatch.setattr(config, "install_in_place", lambda: None)
    monkeypatch.setattr(config, "_ENV_SET", [])
    for name in ("HOROVOD_GLOO_IFACE", "HOROVOD_RANK"):
        monkeypatch.delenv(name, raising=False)
    config._set_env({"HOROVOD_RANK": "1", "HOROVOD_GLOO_IFACE": "eth0"})  # a group across hosts
    config._set_env({"HOROVOD_RANK": "0"})  # the next group chooses no interface
    assert os.environ["HOROVOD_RANK"] == "0"
    assert "HOROVOD_GLOO_IFACE" not in os.environ


def _regression(config):
    """Linear regression with hvd.DistributedOptimizer; each worker starts from different
    weights (broadcast_parameters makes them equal) and sees different data."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(100 + hvd.rank())
    model = torch.nn.Linear(4, 1)
    x = torch.randn(256, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.3
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    losses = []
    for epoch in range(config["epochs"]):
        total = 0.0
        for xb, yb in zip(x.split(32), y.split(32)):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item()
        losses.append(total / 8)
        sgd.report(epoch=epoch, loss=losses[-1])
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_distributed_optimizer_regression_stays_in_sync(trainer):
    import torch

    results = trainer.run(_regression, config={"epochs": 6})
    for losses, _ in results:
        assert losses[-1] < losses[0] / 10, losses
        assert all(b < a for a, b in zip(losses, losses[1:])), losses
    (_, state0), (_, state1) = results
    for name in state0:
        assert torch.equal(state0[name], state1[name]), name
    assert torch.allclose(state0["weight"], torch.tensor([[1.0, -2.0, 0.5, 3.0]]), atol=0.1)


class Regressor:
    """A stateful per-worker trainer, driven one epoch per call (the class-level API)."""

    def __init__(self, lr):
        self.lr = lr
        self.model = None

    def _setup(self):
        import horovod.torch as hvd
        import torch

        # hvd.init() here, not in __init__: to_worker_group creates the actor before the
        # backend has set the Horovod environment.
        hvd.init()
        torch.manual_seed(hvd.rank())
        self.model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        self.opt = hvd.DistributedOptimizer(opt, named_parameters=self.model.named_parameters())
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        gen = torch.Generator().manual_seed(7 + hvd.rank())
        self.x = torch.randn(128, 3, generator=gen)
        self.y = self.x @ torch.tensor([[2.0], [-1.0], [0.5]])

    def train(self, epoch):
        import torch

        if self.model is None:
            self._setup()
        total = 0.0
        for xb, yb in zip(self.x.split(16), self.y.split(16)):
            self.opt.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(xb), yb)
            loss.backward()
            self.opt.step()
            total += loss.item()
        return epoch, total / 8

    def weights(self):
        return self.model.weight.detach().clone()


def test_stateful_class_through_to_worker_group(ray_cluster):
    import torch

    wg = sgd.Trainer(backend="horovod", num_workers=2).to_worker_group(Regressor, lr=0.05)
    try:
        service = rendezvous_service(wg)
        assert service is not None and service.running
        per_epoch = [ray.get([w.train.remote(epoch) for w in wg]) for epoch in range(4)]
        for rank in range(2):
            assert [per_epoch[e][rank][0] for e in range(4)] == [0, 1, 2, 3]
            losses = [per_epoch[e][rank][1] for e in range(4)]
            assert all(b < a for a, b in zip(losses, losses[1:])), losses
        w0, w1 = ray.get([w.weights.remote() for w in wg])
        assert torch.equal(w0, w1)
        assert wg.execute(lambda: os.environ["HOROVOD_RANK"]) == ["0", "1"]
        port = service.port
    finally:
        wg.shutdown()
    # Teardown shut Horovod down and stopped the rendezvous server.
    assert rendezvous_service(wg) is None and not service.running
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def _resumable(config):
    import horovod.torch as hvd
    import torch

    hvd.init()
    state = sgd.load_checkpoint()
    start = state["epoch"] + 1 if state else 0
    value = state["value"] if state else 0.0
    for epoch in range(start, config["epochs"]):
        # Every epoch needs both workers: a dead peer leaves the other blocked in here.
        value += hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
        sgd.report(epoch=epoch, pid=os.getpid(), value=value)
        sgd.save_checkpoint(epoch=epoch, value=value)
    return start, value, hvd.size()


def test_worker_killed_mid_run_resumes_with_a_new_rendezvous(ray_cluster):
    killer = KillWorker(at=1)
    trainer = sgd.Trainer(backend="horovod", num_workers=2, max_retries=1)
    trainer.start()
    try:
        first = rendezvous_service(trainer._controller.worker_group)
        results = trainer.run(_resumable, config={"epochs": 5}, callbacks=[killer])
        second = rendezvous_service(trainer._controller.worker_group)
        # The restart set Horovod up again with a fresh rendezvous server; the old one is closed.
        assert second is not first and second.running and not first.running
    finally:
        trainer.shutdown()
    assert killer.killed
    assert killer.values("epoch") == [0, 1, 2, 3, 4]  # every epoch delivered once, in order
    starts = [r[0] for r in results]
    assert starts[0] == starts[1] >= 1  # resumed from a checkpoint, not from scratch
    assert [r[1] for r in results] == [10.0, 10.0]  # 2 per epoch, 5 epochs, nothing lost or doubled
    assert [r[2] for r in results] == [2, 2]
    assert not second.running  # and shutdown stopped that one


def test_config_validation():
    config = HorovodConfig(nics={"eth0"}, key="s3cret", timeout_s=12)
    assert config.nics == ("eth0",) and config.key == "s3cret" and config.name == "horovod"
    assert HorovodConfig(nics="eth0").nics == ("eth0",)
    assert HorovodConfig().key is None and HorovodConfig().timeout_s == 300 and HorovodConfig().verbose == 1
    # The key stays out of what sgd writes to trainer.json; the rest round-trips.
    import dataclasses

    fields = dataclasses.asdict(config)
    assert "key" not in fields and "s3cret" not in repr(config)
    assert HorovodConfig(**fields) == config
    with pytest.raises(ValueError, match="nics"):
        HorovodConfig(nics=[])
    with pytest.raises(ValueError, match="nics"):
        HorovodConfig(nics=["eth0", 3])
    with pytest.raises(ValueError, match="verbose"):
        HorovodConfig(verbose=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        HorovodConfig(timeout_s=0)
    with pytest.raises(TypeError, match="key"):
        HorovodConfig(key=123)


def test_unknown_interface_is_a_clear_error(ray_cluster):
    trainer = sgd.Trainer(backend=HorovodConfig(nics=["no-such-nic0"]), num_workers=2)
    with pytest.raises(ValueError, match=r"no-such-nic0.*worker rank 0.*it has \[.*'lo'"):
        trainer.start()
    trainer.shutdown()


def test_driver_without_horovod_says_how_to_install(ray_cluster, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "horovod.runner.http.http_server", None)
    trainer = sgd.Trainer(backend="horovod", num_workers=1)
    with pytest.raises(ImportError, match=r"on the driver.*scripts/build_horovod\.py"):
        trainer.start()
    trainer.shutdown()

