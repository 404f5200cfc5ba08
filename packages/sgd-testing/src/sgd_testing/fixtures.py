"""Pytest plugin with the fixtures every sgd package's tests share.

Opt-in: installing sgd-testing adds nothing to a test suite (there is no ``pytest11`` entry
point). A suite loads it with one line in its top-level ``conftest.py``::

    pytest_plugins = ["sgd_testing.fixtures"]

(this repository's own ``conftest.py`` does). Then:

- ``ray_cluster``: one local Ray cluster per test session (4 logical CPUs),
  restarted only if a test shut it down (the multi-node fixture does).
- ``two_node_cluster``: its own two-node ``ray.cluster_utils.Cluster``, since a
  driver can be connected to one cluster at a time; ``two_node_gpu_cluster``: the same with
  2 logical GPUs per node.
- ``results_dir``: ``SGD_RESULTS_DIR`` pointed at a temporary folder.
- ``actor_calls``: the actor method calls the test makes, counted by name.
- ``sgd_keep_workers = N`` (an ini option; the ``SGD_KEEP_WORKERS`` environment variable wins):
  the session keeps up to N idle worker processes for the next trainer (:func:`sgd.keep_workers`),
  so a suite of many small trainers does not start and import a framework in new processes for
  each. A test marked ``fresh_workers`` gets new processes and leaves none kept.
- Test modules are pickled by value, so training functions defined in a test
  file run on workers that cannot import the test file by name.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator

import pytest

CLUSTER_CPUS = 4


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, message: str = "") -> Any:
    """Poll ``condition`` until it returns something truthy or ``timeout`` seconds pass.

    :returns: the truthy value.
    :raises AssertionError: the deadline passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message or f"condition not met within {timeout}s")
        time.sleep(interval)


#: How long kept worker processes get to exit before Ray goes down: under coverage a process
#: that measured many tests takes a while to write its data file, and a kill during the write
#: leaves it corrupt (the whole measurement of that process lost).
KEPT_EXIT_S = 30.0


def shutdown_ray() -> None:
    """``ray.shutdown()``, after the worker processes kept for later trainers
    (:func:`sgd.keep_workers`) exited on their own: killed with the cluster, they would lose
    what they measured (coverage's data file is written at exit)."""
    import ray

    if not ray.is_initialized():
        return
    from sgd.worker_group.keep import end_kept_workers

    try:
        end_kept_workers(patience_s=KEPT_EXIT_S)
    finally:
        ray.shutdown()


def _start_local_ray() -> None:
    import ray

    if not ray.is_initialized():
        # address="local": never join a cluster another program started on this machine.
        ray.init(address="local", num_cpus=CLUSTER_CPUS, include_dashboard=False, log_to_driver=True)


@pytest.fixture
def ray_cluster() -> Iterator[Dict[str, float]]:
    """A running local Ray cluster shared by the session; yields its total resources."""
    import ray

    _start_local_ray()
    yield ray.cluster_resources()


@pytest.fixture
def actor_calls(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every actor method call this process makes from now on, counted by method name (a
    ``collections.Counter``); the calls themselves go through unchanged."""
    import collections

    import ray

    counted: Any = collections.Counter()
    remote = ray.actor.ActorMethod._remote

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted[self._method_name] += 1
        return remote(self, *args, **kwargs)

    monkeypatch.setattr(ray.actor.ActorMethod, "_remote", counting)
    return counted


@pytest.fixture(scope="module")
def base_trainer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A started 2-worker trainer with the no-op backend, shared by one test module; its runs go
    to a temporary folder (the default, ``~/sgd_results/train_<second>``, is shared by every
    trainer made in the same second: another xdist worker's runs would be numbered among them)."""
    import sgd

    _start_local_ray()
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, logdir=tmp_path_factory.mktemp("base_trainer"))
    trainer.start()
    yield trainer
    trainer.shutdown()


@pytest.fixture
def two_node_cluster() -> Iterator[Any]:
    """A fresh two-node local cluster (2 CPUs per node); the shared cluster is shut down first."""
    yield from _two_nodes(num_gpus=0)


@pytest.fixture
def two_node_gpu_cluster() -> Iterator[Any]:
    """Like ``two_node_cluster``, each node also declaring 2 logical GPUs (Ray hands out GPU
    ids and sets ``CUDA_VISIBLE_DEVICES`` for them on any machine; there is no real device)."""
    yield from _two_nodes(num_gpus=2)


def _two_nodes(num_gpus: int) -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    shutdown_ray()
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 2, "num_gpus": num_gpus, "include_dashboard": False})
    cluster.add_node(num_cpus=2, num_gpus=num_gpus)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        shutdown_ray()
        cluster.shutdown()


@pytest.fixture(scope="module")
def host_cluster() -> Iterator[Any]:
    """A real three-host cluster for one test module (:class:`sgd_testing.hosts.HostCluster`):
    the head at 127.0.0.2 with 0 CPUs (this process is its driver), worker hosts at 127.0.0.3
    and 127.0.0.4 with 2 CPUs each and private ``/tmp``, ``/dev/shm`` and ``~/sgd_results``.
    Skipped, with the reason, where mount namespaces cannot be made (they need root)."""
    from sgd_testing.hosts import host_cluster_for_test, namespaces_unavailable

    why = namespaces_unavailable()
    if why:
        pytest.skip(why)
    with host_cluster_for_test(num_hosts=2, cpus_per_host=2) as cluster:
        yield cluster


@pytest.fixture
def hosts(host_cluster: Any) -> Iterator[Any]:
    """``host_cluster`` with every worker host up, not draining and with all its CPUs free
    when the test starts (a host an earlier test lost or drained is started afresh)."""
    host_cluster.heal()
    yield host_cluster


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs mounted for the test (to fill a real disk); the test is skipped, with
    the reason, where this process may not mount one (it needs root with CAP_SYS_ADMIN)."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip() or proc.returncode}); "
                    "the injected-ENOSPC tests in test_checkpoint_trust.py cover the same error")
    yield mount

    # A worker the test's trainer stopped may still be exiting with a file open there
    # (its rank log): unmount once nothing holds the disk, and say who does if it stays busy.
    def unmounted() -> bool:
        return subprocess.run(["umount", str(mount)], capture_output=True).returncode == 0

    try:
        wait_for(unmounted, timeout=30, interval=0.1)
    except AssertionError as busy:
        holders = sorted(
            fd.parent.parent.name
            for fd in Path("/proc").glob("[0-9]*/fd/*")
            if _points_into(fd, mount)
        )
        subprocess.run(["umount", "--lazy", str(mount)], check=False)
        raise AssertionError(f"{mount} stayed busy for 30 s after the test; "
                             f"processes with files open there: {holders}") from busy


def _points_into(fd: Path, mount: Path) -> bool:
    try:
        return str(fd.readlink()).startswith(str(mount))
    except OSError:
        return False


@pytest.fixture(autouse=True)
def results_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Point ``SGD_RESULTS_DIR`` at a per-test temporary folder."""
    path = tmp_path_factory.mktemp("sgd_results")
    monkeypatch.setenv("SGD_RESULTS_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def _fresh_workers(request: pytest.FixtureRequest) -> Iterator[None]:
    """For a test marked ``fresh_workers``: no kept worker process is given to it or kept after it."""
    if request.node.get_closest_marker("fresh_workers") is None:
        yield
        return
    from sgd.worker_group.keep import KEPT, keep_workers

    kept = KEPT.max_idle()
    if kept and "ray" in sys.modules and sys.modules["ray"].is_initialized():
        keep_workers(0)
    else:
        KEPT.limit = 0
    try:
        yield
    finally:
        KEPT.limit = kept


@pytest.fixture(autouse=True)
def _pickle_test_module_by_value(request: pytest.FixtureRequest) -> None:
    module = getattr(request, "module", None)
    if module is None or module.__name__ not in sys.modules:
        return
    import ray.cloudpickle as cloudpickle

    try:
        cloudpickle.register_pickle_by_value(module)
    except ValueError:
        pass


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "sgd_keep_workers",
        "idle worker processes the test session keeps for the next trainer (sgd.keep_workers); 0: none",
        default="0",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the lent device machine)")
    config.addinivalue_line("markers", "multinode: starts its own two-node Ray cluster")
    config.addinivalue_line(
        "markers", "fresh_workers: every worker the test starts is a new process (sgd.keep_workers off)"
    )
    config.addinivalue_line(
        "markers", "serial: runs alone on the machine (nox -s tests runs it after the parallel part): "
        "its timing breaks under load. Every test on the three-host fixture is serial.",
    )
    keep = int(os.environ.get("SGD_KEEP_WORKERS") or config.getini("sgd_keep_workers") or 0)
    if keep:
        import sgd

        sgd.keep_workers(keep)
    # Keep Ray quiet and quick in tests.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # No idle worker processes started ahead for each cluster's first driver: the suite starts
    # dozens of clusters, and most of those processes ended unused (about 2 CPU-seconds each).
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    os.environ.setdefault("SGD_INFEASIBLE_TIMEOUT_S", "3")


#: Fixtures that bind fixed loopback addresses (127.0.0.2-4): their tests share one xdist worker.
HOST_FIXTURES = frozenset({"host_cluster", "hosts"})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # The kept worker processes exit before pytest does (and Ray kills what is left).
    if "sgd.worker_group.keep" in sys.modules and "ray" in sys.modules and sys.modules["ray"].is_initialized():
        from sgd.worker_group.keep import end_kept_workers

        end_kept_workers(patience_s=KEPT_EXIT_S)


@pytest.hookimpl(tryfirst=True)  # the marks it adds must be there when `-m` selects
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:  # before -m selects: `-m serial` takes them, `-m "not serial"` leaves them
        if HOST_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.serial)
    if config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None):
        _group_for_xdist(items)
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _group_for_xdist(items: list) -> None:
    """Under ``pytest -n N --dist loadgroup --no-loadscope-reorder`` (``nox -s tests``): one
    test file runs on one worker, so a module-scoped fixture (a started trainer, its own Ray
    cluster) is made once; every test on the three-host fixture runs on the same worker, one at
    a time, since the hosts' addresses are fixed. xdist hands the groups out in the order
    collected: the three-host group first (the longest; started at once it never ends the run
    late, with its hosts' heartbeats competing with the whole machine's load), then the others
    with the most tests first. Each worker has its own local Ray cluster."""
    groups: Dict[str, list] = {}
    for item in items:
        if HOST_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            group = "hosts"
        else:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)
    order = sorted(groups, key=lambda g: (g != "hosts", -len(groups[g])))  # stable for ties
    items[:] = [item for group in order for item in groups[group]]
