"""The class-level WorkerGroup API that embedding libraries use."""

import os

import pytest
import ray

import sgd
from sgd_testing import wait_for


class Executable:
    def __init__(self, base, scale=1):
        self.base = base
        self.scale = scale
        self.calls = 0

    def train(self, epoch):
        self.calls += 1
        return (self.base + epoch) * self.scale, sgd.world_rank(), sgd.world_size()

    def calls_so_far(self):
        return self.calls


def _pid():
    return os.getpid()


def _setenv(key, value):
    os.environ[key] = value


def _getenv(key):
    return os.environ.get(key)


def test_execute_variants(ray_cluster):
    wg = sgd.WorkerGroup(num_workers=2)
    try:
        pids = wg.execute(_pid)
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert ray.get(wg.execute_async(lambda a, b=0: a + b, 1, b=2)) == [3, 3]
        assert wg.execute_single(1, _pid) == pids[1]
        assert ray.get(wg.execute_single_async(0, _pid)) == pids[0]
        assert wg.execute(sgd.world_rank) == [0, 1]
        assert len(wg) == 2 and list(wg) == wg.workers and wg[0] is wg.workers[0]
        with pytest.raises(IndexError):
            wg.execute_single(2, _pid)
    finally:
        wg.shutdown()


def test_actor_cls_methods_and_plain_functions_share_the_process(ray_cluster):
    wg = sgd.WorkerGroup(num_workers=2, actor_cls=Executable, actor_cls_args=(10,), actor_cls_kwargs={"scale": 2})
    try:
        assert ray.get([w.train.remote(epoch=1) for w in wg]) == [(22, 0, 2), (22, 1, 2)]
        assert ray.get([w.calls_so_far.remote() for w in wg]) == [1, 1]
        pids = wg.execute(_pid)
        assert ray.get([w._sgd_execute.remote(_pid, (), {}) for w in wg]) == pids
    finally:
        wg.shutdown()


class _BrokenExecutable:
    def __init__(self, x):
        raise ValueError(f"x={x} is not allowed")


def test_actor_cls_that_raises_in_init_is_reraised_with_its_type(ray_cluster):
    total = ray.cluster_resources()["CPU"]
    with pytest.raises(ValueError, match="x=3 is not allowed"):
        sgd.WorkerGroup(num_workers=2, actor_cls=_BrokenExecutable, actor_cls_args=(3,))
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2)
    with pytest.raises(ValueError, match="x=4 is not allowed"):
        trainer.to_worker_group(_BrokenExecutable, 4)
    # Nothing stays reserved, and the trainer can still start.
    wait_for(lambda: ray.available_resources().get("CPU", 0) >= total, timeout=30)
    wg = trainer.to_worker_group(Executable, 1)
    try:
        assert ray.get([w.train.remote(epoch=0) for w in wg]) == [(1, 0, 2), (1, 1, 2)]
    finally:
        wg.shutdown()


def test_lifecycle_errors(ray_cluster):
    wg = sgd.WorkerGroup(num_workers=1)
    with pytest.raises(RuntimeError, match="already running"):
        wg.start()
    wg.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        wg.execute(_pid)
    with pytest.raises(RuntimeError, match="shut down"):
        wg.execute_single(0, _pid)
    wg.shutdown()  # twice is fine
    wg.start()
    try:
        assert len(wg.execute(_pid)) == 1
    finally:
        wg.shutdown()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_workers": 0}, "num_workers"),
        ({"num_workers": -2}, "num_workers"),
        ({"num_cpus_per_worker": -1}, ">= 0"),
        ({"num_gpus_per_worker": -1}, ">= 0"),
        ({"additional_resources_per_worker": {"x": -1}}, "x"),
        ({"actor_cls_args": (1,)}, "without actor_cls"),
        ({"actor_cls_kwargs": {"a": 1}}, "without actor_cls"),
    ],
)
def test_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sgd.WorkerGroup(**kwargs)


def test_resources_released_on_shutdown(ray_cluster):
    total = ray.cluster_resources()["CPU"]
    wait_for(lambda: ray.available_resources().get("CPU", 0) == total, timeout=30)
    wg = sgd.WorkerGroup(num_workers=2, num_cpus_per_worker=1.5)
    wait_for(lambda: ray.available_resources().get("CPU", 0) == total - 3, timeout=10)
    wg.shutdown()
    wait_for(lambda: ray.available_resources().get("CPU", 0) == total, timeout=20)


def test_trainer_to_worker_group_has_backend_set_up(ray_cluster):
    class RecordingBackend(sgd.Backend):
        def on_start(self, worker_group, backend_config):
            worker_group.execute(_setenv, "SGD_BACKEND_READY", "1")

    class RecordingConfig(sgd.BackendConfig):
        @property
        def backend_cls(self):
            return RecordingBackend

    trainer = sgd.Trainer(backend=RecordingConfig(), num_workers=2)
    wg = trainer.to_worker_group(Executable, 1)
    try:
        assert isinstance(wg, sgd.WorkerGroup)
        assert wg.execute(_getenv, "SGD_BACKEND_READY") == ["1", "1"]
        assert ray.get([w.train.remote(epoch=0) for w in wg]) == [(1, 0, 2), (1, 1, 2)]
    finally:
        wg.shutdown()


def _imported(name):
    import sys

    return name in sys.modules


def test_preload_modules_are_imported_in_the_background(ray_cluster):
    wg = sgd.WorkerGroup(num_workers=2, preload_modules=("json.tool", "no_such_module_sgd"))
    try:
        # The import runs in the background; a missing module is ignored (the real import reports it).
        wait_for(lambda: all(wg.execute(_imported, "json.tool")), timeout=20)
        assert wg.execute(sgd.world_rank) == [0, 1]
    finally:
        wg.shutdown()


def test_uses_an_enclosing_placement_group(ray_cluster):
    """Inside a reservation made for it (as a Ray Tune trial makes), the group takes the
    last bundles of that reservation instead of asking for a new one."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": 1}, {"CPU": 1}, {"CPU": 1}])
    ray.get(pg.ready())

    @ray.remote(num_cpus=1)
    def trial():
        import ray as r

        wg = sgd.WorkerGroup(num_workers=2)
        try:
            ranks = wg.execute(sgd.world_rank)
            current = r.util.get_current_placement_group()
            inside = r.get(wg.workers[0]._sgd_execute.remote(
                lambda: r.util.get_current_placement_group().id.hex(), (), {}))
            return ranks, inside == current.id.hex()
        finally:
            wg.shutdown()

    try:
        ranks, same_pg = ray.get(trial.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=True)).remote(), timeout=60)
        assert ranks == [0, 1] and same_pg
        # The enclosing reservation is not removed by the group's shutdown.
        assert ray.util.placement_group_table(pg)["state"] == "CREATED"
    finally:
        remove_placement_group(pg)


# --- Ray Train 1.x's WorkerGroup API (issue 18) --------------------------------------------


def test_bare_group_has_one_worker_as_in_ray(ray_cluster):
    wg = sgd.WorkerGroup()
    try:
        assert len(wg) == 1 and wg.num_workers == 1
        assert wg.execute(sgd.world_size) == [1]
    finally:
        wg.shutdown()


def test_in_a_placement_group_the_caller_made(ray_cluster):
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 2}], strategy="PACK")  # one bundle holding both workers
    try:
        wg = sgd.WorkerGroup(num_workers=2, placement_group=pg)
        try:
            assert wg.placement_group is pg
            ids = wg.execute(lambda: ray.util.get_current_placement_group().id.hex())
            assert ids == [pg.id.hex()] * 2
            assert wg.execute(sgd.world_rank) == [0, 1]
        finally:
            wg.shutdown()
        # The caller's reservation outlives the group.
        assert ray.util.placement_group_table(pg)["state"] == "CREATED"
    finally:
        remove_placement_group(pg)


def test_placement_group_of_wrong_type_is_a_clear_error():
    with pytest.raises(TypeError, match="placement_group must be a .*PlacementGroup.*got 'pack'"):
        sgd.WorkerGroup(placement_group="pack")


def test_add_and_remove_workers(ray_cluster):
    total = ray.cluster_resources()["CPU"]
    wait_for(lambda: ray.available_resources().get("CPU", 0) == total, timeout=30)
    wg = sgd.WorkerGroup(num_workers=1, actor_cls=Executable, actor_cls_args=(10,))
    try:
        first = wg.execute(_pid)
        wg.add_workers(2)
        assert len(wg) == wg.num_workers == 3
        pids = wg.execute(_pid)
        assert pids[0] == first[0] and len(set(pids)) == 3
        assert wg.execute(sgd.world_rank) == [0, 1, 2]
        assert wg.execute(sgd.world_size) == [3, 3, 3]
        assert ray.get([w.train.remote(epoch=1) for w in wg]) == [(11, 0, 3), (11, 1, 3), (11, 2, 3)]
        wait_for(lambda: ray.available_resources().get("CPU", 0) == total - 3, timeout=10)

        wg.remove_workers([0, 2])
        assert len(wg) == 1 and wg.execute(_pid) == [pids[1]]
        assert wg.execute(sgd.world_rank) == [0] and wg.execute(sgd.world_size) == [1]

        for bad, match in (([5], r"indexes \[5\] are not worker indexes"), ([0, 0], "repeated"),
                           ([0], "leave no worker")):
            with pytest.raises(ValueError, match=match):
                wg.remove_workers(bad)
        with pytest.raises(ValueError, match="num_workers must be a positive int"):
            wg.add_workers(0)
    finally:
        wg.shutdown()
    wait_for(lambda: ray.available_resources().get("CPU", 0) == total, timeout=20)
    with pytest.raises(RuntimeError, match="shut down"):
        wg.add_workers(1)


def test_replace_workers_keeps_the_others_and_the_ranks(ray_cluster):
    wg = sgd.WorkerGroup(num_workers=2, num_cpus_per_worker=0.5)
    try:
        before = wg.execute(_pid)
        wg.replace_workers([1])
        after = wg.execute(_pid)
        assert after[0] == before[0] and after[1] != before[1]
        assert wg.execute(sgd.world_rank) == [0, 1] and wg.execute(sgd.world_size) == [2, 2]
        with pytest.raises(ValueError, match=r"indexes \[2\] are not worker indexes of this group \(0..1\)"):
            wg.replace_workers([2])
        assert wg.execute(_pid) == after  # a refused call changes nothing
    finally:
        wg.shutdown()


def test_resizing_a_group_with_a_backend_is_refused(ray_cluster):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=1)
    wg = trainer.to_worker_group(Executable, 1)
    try:
        with pytest.raises(RuntimeError, match="add_workers: this group has a Backend set up for 1 workers"):
            wg.add_workers(1)
    finally:
        wg.shutdown()


def test_add_workers_on_a_node_and_removal_gives_the_reservation_back(ray_cluster):
    """``node_id=`` pins workers to a Ray node (what sgd_horovod's elastic executor places by
    discovered host); removing every worker of an ``add_workers`` call removes its placement
    group, so a group whose members come and go does not hold what it no longer uses."""
    total = ray.cluster_resources()["CPU"]
    wait_for(lambda: ray.available_resources().get("CPU", 0) == total, timeout=30)
    node = ray.get_runtime_context().get_node_id()
    wg = sgd.WorkerGroup(num_workers=1, num_cpus_per_worker=0.5, node_id=node)
    try:
        wg.add_workers(2, node_id=node)
        assert [m.node_id for m in wg.metadata] == [node] * 3
        wait_for(lambda: ray.available_resources().get("CPU", 0) == total - 1.5, timeout=10)
        wg.remove_workers([1])  # one of the two added: their placement group is still in use
        wait_for(lambda: ray.available_resources().get("CPU", 0) == total - 1.5, timeout=10)
        wg.remove_workers([1])  # the other one: its placement group goes
        wait_for(lambda: ray.available_resources().get("CPU", 0) == total - 0.5, timeout=10)
        assert wg.execute(sgd.world_size) == [1]
        with pytest.raises(ValueError, match="node_id='nope' is not an alive Ray node; alive nodes:"):
            wg.add_workers(1, node_id="nope")
        assert len(wg) == 1
    finally:
        wg.shutdown()
    wait_for(lambda: ray.available_resources().get("CPU", 0) == total, timeout=20)
