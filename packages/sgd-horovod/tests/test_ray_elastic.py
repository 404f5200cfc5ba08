"""Horovod's elastic API on Ray: ``ElasticRayExecutor`` and ``RayExecutor(min_workers=...)``.

Part 1 is Horovod 0.28.1's own elastic Ray tests (``test/single/test_ray_elastic.py`` and
``test_ray_elastic_v2.py``, 24 tests), with ``horovod.ray`` renamed to ``sgd_horovod`` and nothing
else changed except where a comment says so. Part 2 is sgd's own: hosts really added and workers
really killed mid-training, ``hvd.elastic.run`` restoring committed state, and the errors.

Its own Ray cluster (module-scoped): Horovod's tests name hosts ``host-0`` ... ``host-9`` through
custom resources ``node:host-N`` and need 8 CPUs and 8 (logical) GPUs, which the session's shared
cluster does not declare.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from unittest import mock

import psutil
import pytest
import ray

from sgd_horovod import ElasticRayExecutor, RayExecutor, RayHostDiscovery  # was: horovod.ray.elastic
from sgd_horovod.elastic_v2 import RayHostDiscovery as RayHostDiscoveryV2  # was: horovod.ray.elastic_v2

pytestmark = pytest.mark.usefixtures("requires_horovod")


@pytest.fixture(scope="module")
def ray_8_cpus_gpus():
    """Horovod's ``ray_8_cpus_gpus`` (a superset of its ``ray_8_cpus``), once for the module."""
    if ray.is_initialized():
        ray.shutdown()  # the session's shared cluster; the next module's fixture starts it again
    ray.init(address="local", num_cpus=8, num_gpus=8, include_dashboard=False,
             resources={f"node:host-{i}": 1 for i in range(10)})
    yield
    ray.shutdown()


ray_8_cpus = ray_8_cpus_gpus


try:
    from horovod.runner.elastic.discovery import HostDiscovery
except ImportError:  # the tests are skipped (requires_horovod)
    HostDiscovery = object  # type: ignore[assignment,misc]


# --- Part 1: Horovod's tests --------------------------------------------------------------------

# Each discovery test runs twice: with horovod.ray.elastic's names (cpus_per_slot) and with
# horovod.ray.elastic_v2's (cpus_per_worker).
DISCOVERIES = [
    pytest.param(RayHostDiscovery, "slot", id="elastic"),
    pytest.param(RayHostDiscoveryV2, "worker", id="elastic_v2"),
]


def _kw(kind, **kwargs):
    return {k.replace("_per_slot", f"_per_{kind}"): v for k, v in kwargs.items()}


@pytest.mark.parametrize("cls, kind", DISCOVERIES)
class TestRayDiscoverySuite:
    # Horovod starts a cluster per test (ray.init(num_cpus=4, num_gpus=1 or 4)); here the module's
    # cluster has 8 CPUs and 8 GPUs, so the sizes per slot are doubled (or, for the GPU tests, set
    # so that GPUs are the limit) to give Horovod's expected counts.
    def test_cpu_discovery(self, ray_8_cpus_gpus, cls, kind):
        discovery = cls(**_kw(kind, cpus_per_slot=2))  # Horovod: 1 of 4 CPUs
        mapping = discovery.find_available_hosts_and_slots()
        assert len(mapping) == 1
        assert list(mapping.values()) == [4]

    def test_gpu_discovery(self, ray_8_cpus_gpus, cls, kind):
        discovery = cls(use_gpu=True, **_kw(kind, cpus_per_slot=1, gpus_per_slot=8))  # Horovod: 1 of 1 GPU
        mapping = discovery.find_available_hosts_and_slots()
        assert len(mapping) == 1
        assert list(mapping.values()) == [1]

    def test_gpu_slot_discovery(self, ray_8_cpus_gpus, cls, kind):
        discovery = cls(use_gpu=True, **_kw(kind, cpus_per_slot=1, gpus_per_slot=4))  # Horovod: 2 of 4 GPUs
        mapping = discovery.find_available_hosts_and_slots()
        assert len(mapping) == 1
        assert list(mapping.values()) == [2]

    # The three below replace ray.nodes() with a function returning made-up nodes, as Horovod's do.
    def test_multinode(self, monkeypatch, cls, kind):
        monkeypatch.setattr(ray, "nodes", _multi_node_mock({"GPU": 2, "CPU": 8}))
        discovery = cls(use_gpu=True, **_kw(kind, cpus_per_slot=1))
        mapping = discovery.find_available_hosts_and_slots()
        assert len(mapping) == 3
        assert list(mapping.values()) == [2, 2, 2]

    def test_multinode_gpus_per_slot(self, monkeypatch, cls, kind):
        monkeypatch.setattr(ray, "nodes", _multi_node_mock({"GPU": 2, "CPU": 8}))
        discovery = cls(use_gpu=True, **_kw(kind, gpus_per_slot=2))
        mapping = discovery.find_available_hosts_and_slots()
        assert len(mapping) == 3
        assert list(mapping.values()) == [1, 1, 1]

    def test_multinode_mismatch(self, monkeypatch, cls, kind):
        monkeypatch.setattr(ray, "nodes", _multi_node_mock({"CPU": 8}))
        discovery = cls(use_gpu=True, **_kw(kind, cpus_per_slot=1))
        mapping = discovery.find_available_hosts_and_slots()
        assert sum(mapping.values()) == 0


def _multi_node_mock(resources):
    def create_multi_node_mock():
        def create_node_entry(hostname):
            return {"NodeManagerAddress": hostname, "Resources": resources.copy(), "alive": True}

        return map(create_node_entry, ["host-1", "host-2", "host-3"])

    return create_multi_node_mock


class SimpleTestDiscovery(HostDiscovery):
    def __init__(self, schedule):
        self._schedule = schedule
        self._generator = self.host_generator()

    def host_generator(self):
        for iters, hosts in self._schedule:
            iters = iters or 500  # max
            for _ in range(iters):
                yield hosts

    def find_available_hosts_and_slots(self):
        hostlist = next(self._generator)
        hosts = {}
        for item in hostlist:
            host, slots = item.split(":")
            hosts[host] = int(slots)
        return hosts


class StatusCallback:
    def __init__(self):
        self._journal = []

    def __call__(self, info_dict):
        self._journal.append(info_dict)

    def fetch(self):
        return self._journal.copy()


def _create_training_function(iterations):
    def training_fn():
        import time

        import horovod.torch as hvd
        import torch

        from sgd_horovod import ray_logger  # was: from horovod.ray import ray_logger

        hvd.init()

        model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ray_logger.log({"started": True, "pid": os.getpid()})

        @hvd.elastic.run
        def train(state):
            for state.epoch in range(state.epoch, iterations):
                ray_logger.log({"training": True, "pid": os.getpid()})
                time.sleep(0.1)
                state.commit()  # triggers scale-up, scale-down
            ray_logger.log({"finished": True, "pid": os.getpid()})

        state = hvd.elastic.TorchState(model, optimizer, batch=0, epoch=0, commits=0, rendezvous=0)
        train(state)
        return True

    return training_fn


@contextmanager
def fault_tolerance_patches():
    # Horovod also patches horovod.runner.util.network.get_driver_ip, which nothing here calls.
    with mock.patch("horovod.runner.elastic.driver.DISCOVER_HOSTS_FREQUENCY_SECS", 0.1):
        yield


UPSTREAM_SKIP = ("skipped upstream too (https://github.com/horovod/horovod/issues/3197): the host schedule "
                 "counts discovery polls of 0.1 s, so how many workers start before a host leaves depends on how "
                 "fast they start; the hosts-added and worker-killed tests below cover the same with conditions")


def _executor(api, schedule, min_np, max_np=None, **kwargs):
    """Horovod's executor setup: ``elastic`` is ElasticRayExecutor (horovod.ray.elastic, sizes per
    slot, min_np/max_np in the settings), ``elastic_v2`` is RayExecutor(min_workers=...)."""
    nics = list(psutil.net_if_addrs().keys())[0]
    if api == "elastic":
        settings = ElasticRayExecutor.create_settings(min_np=min_np, max_np=max_np, nics={nics})
        settings.discovery = SimpleTestDiscovery(schedule)
        kwargs = {k.replace("_per_worker", "_per_slot"): v for k, v in kwargs.items()}
        return ElasticRayExecutor(settings, override_discovery=False, **kwargs)
    settings = RayExecutor.create_settings(nics={nics})
    settings.discovery = SimpleTestDiscovery(schedule)
    return RayExecutor(settings, min_workers=min_np, max_workers=max_np, override_discovery=False, **kwargs)


def _run_and_count(executor, iterations):
    training_fn = _create_training_function(iterations=iterations)
    executor.start()
    trace = StatusCallback()
    try:
        results = executor.run(training_fn, callbacks=[trace])
    finally:
        executor.shutdown()
    events = trace.fetch()
    return results, sum(int("started" in e) for e in events), sum(int("finished" in e) for e in events), events


APIS = pytest.mark.parametrize("api", ["elastic", "elastic_v2"])


@pytest.mark.skip(reason=UPSTREAM_SKIP)
@APIS
def test_fault_tolerance_hosts_added_and_removed(ray_8_cpus, api):
    with fault_tolerance_patches():
        schedule = [(10, ["host-1:2"]), (30, ["host-1:2", "host-2:1", "host-3:1"]), (None, ["host-2:1"])]
        results, started, finished, events = _run_and_count(_executor(api, schedule, 1, cpus_per_worker=1), 50)
        assert len(results) == 1
        assert started == 4, events
        assert finished == 1, events


@pytest.mark.skip(reason=UPSTREAM_SKIP)
@APIS
def test_fault_tolerance_hosts_remove_and_add(ray_8_cpus, api):
    with fault_tolerance_patches():
        schedule = [(10, ["host-1:2", "host-2:1", "host-3:2"]), (10, ["host-1:2"]),
                    (None, ["host-1:2", "host-4:1", "host-5:1"])]
        results, started, finished, events = _run_and_count(_executor(api, schedule, 1, cpus_per_worker=1), 30)
        assert len(results) == 4
        assert started == 7, events
        assert finished == 4, events


@pytest.mark.skip(reason=UPSTREAM_SKIP)
def test_fault_tolerance_hosts_remove_and_add_cooldown(ray_8_cpus):
    """elastic_v2 only."""
    with fault_tolerance_patches():
        schedule = [(10, ["host-1:2", "host-2:1", "host-3:2"]), (10, ["host-1:2"]),
                    (None, ["host-1:2", "host-2:1", "host-3:2"])]
        executor = _executor("elastic_v2", schedule, 1, cpus_per_worker=1, cooldown_range=[1, 1])
        results, started, finished, events = _run_and_count(executor, 30)
        assert len(results) == 5
        assert started == 5, events
        assert finished == 5, events


@APIS
def test_max_np(ray_8_cpus, api):
    """Horovod's test_max_np (elastic) and test_max_num_proc (elastic_v2)."""
    with fault_tolerance_patches():
        schedule = [(10, ["host-1:2"]), (None, ["host-1:2", "host-4:1", "host-5:1"])]
        results, started, finished, events = _run_and_count(_executor(api, schedule, 1, 2, cpus_per_worker=1), 20)
        assert len(results) == 2
        assert started == 2, events
        assert finished == 2, events


MIN_NP_SCHEDULE = [(10, ["host-1:1"]), (10, ["host-1:1", "host-4:1", "host-5:1"]),
                   (None, ["host-1:1", "host-4:1", "host-5:1", "host-6:1"])]


@APIS
def test_min_np(ray_8_cpus, api):
    """Horovod's test_min_np (elastic) and test_min_num_proc (elastic_v2)."""
    with fault_tolerance_patches():
        results, started, finished, events = _run_and_count(_executor(api, MIN_NP_SCHEDULE, 4, 4), 30)
        assert len(results) == 4
        assert started == 4, events
        assert finished == 4, events


@APIS
def test_gpu_e2e(ray_8_cpus_gpus, api):
    """Horovod's test_gpu_e2e, on logical GPUs (Ray assigns them; the training runs on the CPU)."""
    with fault_tolerance_patches():
        executor = _executor(api, MIN_NP_SCHEDULE, 4, 4, gpus_per_worker=1, use_gpu=True)
        results, started, finished, events = _run_and_count(executor, 30)
        assert len(results) == 4
        assert started == 4, events
        assert finished == 4, events


def test_both_num_workers_min_workers(ray_8_cpus):
    settings = RayExecutor.create_settings()
    with pytest.raises(ValueError, match=r"Both `min_workers` and `num_workers` provided."):
        RayExecutor(settings, min_workers=1, num_workers=1, cpus_per_worker=1)
