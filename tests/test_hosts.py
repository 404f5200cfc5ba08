"""A real cluster: hosts with their own addresses and disks, lost without warning, drained.

Runs on ``sgd_testing``'s ``host_cluster``: a head at 127.0.0.2 with 0 CPUs (this process is its
driver) and two worker hosts at 127.0.0.3 and 127.0.0.4 (2 CPUs each) started with
``ray start --block``, each in its own mount namespace with a private ``/tmp``, ``/dev/shm`` and
``~/sgd_results``. Losing a host SIGKILLs every process on it at once.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

import sgd
from sgd_testing import wait_for

pytestmark = pytest.mark.multinode


def _steps(train_dir: Path) -> list:
    lines = (train_dir / "results.jsonl").read_text().splitlines()
    return [json.loads(line)[0]["step"] for line in lines if line.strip()]


def _where(config):

    import ray
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    sgd.report(step=1)
    sgd.save_checkpoint(step=1, rank0_ip=ray.util.get_node_ip_address())
    return (ray.util.get_node_ip_address(), sgd.node_rank(), sgd.local_rank(), os.environ["MASTER_ADDR"],
            os.path.exists(config["driver_file"]), t.item())


def test_workers_run_on_hosts_with_their_own_addresses_and_disks(hosts, tmp_path):
    driver_file = tmp_path / "only-on-the-driver"
    driver_file.write_text("x")
    trainer = sgd.Trainer(backend="torch", num_workers=4)
    trainer.start()
    try:
        results = trainer.run(_where, config={"driver_file": str(driver_file)})
    finally:
        trainer.shutdown()
    ips = [r[0] for r in results]
    assert sorted(set(ips)) == ["127.0.0.3", "127.0.0.4"]  # the head has no CPUs: no worker there
    assert ips[0] == ips[1] != ips[2] == ips[3]  # ranks grouped by host
    assert [r[1] for r in results] == [0, 0, 1, 1] and [r[2] for r in results] == [0, 1, 0, 1]
    assert {r[3] for r in results} == {ips[0]}  # MASTER_ADDR: rank 0's host, reachable from the other
    assert not any(r[4] for r in results)  # the driver's disk is not theirs
    assert all(r[5] == 4.0 for r in results)  # one process group across both hosts
    # Rank 0 wrote its checkpoint on a host with a private disk: it arrived on the driver's.
    assert trainer.latest_checkpoint == {"step": 1, "rank0_ip": ips[0]}
    assert trainer.best_checkpoint_path.is_dir() and _steps(trainer.latest_run_dir) == [1]


def _train(config):
    import time

    state = sgd.load_checkpoint() or {"step": 0}
    step = state["step"]
    while step < config["steps"]:
        step += 1
        time.sleep(config.get("sleep", 0.05))
        sgd.report(step=step, world_size=sgd.world_size(), resumed_from=state["step"], pid=os.getpid(),
                   notice=sgd.get_preemption_info() is not None)
        if step % config.get("every", 1) == 0 or sgd.get_preemption_info() is not None:
            sgd.save_checkpoint(step=step)
    return sgd.world_size()


class _OnStep(sgd.TrainingCallback):
    """Calls ``action(results)`` once, when rank 0 reports ``step``; keeps every round."""

    def __init__(self, step, action):
        self.step, self.action, self.rounds, self.done = step, action, [], False

    def handle_result(self, results, **info):
        self.rounds.append(results)
        if results[0]["step"] == self.step and not self.done:
            self.done = True
            self.action(results)


def _lose_at_step_3_and_bring_back(hosts, lost):
    """A callback that kills every process of host ``lost`` at once when step 3 arrives, and
    starts the host again once the group goes on with 2 workers; and the event set then."""
    came_back = threading.Event()

    def lose(results):
        lost.kill()

        def bring_back():  # after the group went on without it
            wait_for(lambda: any(r[0]["world_size"] == 2 for r in chaos.rounds), timeout=120)
            hosts.restart(lost)
            came_back.set()

        threading.Thread(target=bring_back, daemon=True).start()

    chaos = _OnStep(3, lose)
    return chaos, came_back


def test_elastic_goes_on_when_a_host_is_lost_and_grows_back(hosts):
    lost = hosts.hosts[1]
    chaos, came_back = _lose_at_step_3_and_bring_back(hosts, lost)
    trainer = sgd.Trainer(backend="base", num_workers=(2, 4), max_retries=1)
    trainer.start()
    try:
        # Enough steps to outlast the host's return; the run ends early once it has grown back.
        it = trainer.run_iterator(_train, config={"steps": 100000, "sleep": 0.05, "every": 2})
        for results in it:
            chaos.handle_result(results)
            if came_back.is_set() and results[0]["world_size"] == 4 and results[0]["resumed_from"] > 3:
                break
        else:
            pytest.fail("the run ended before the group grew back")
        it.stop()
    finally:
        trainer.shutdown()
    steps = [r[0]["step"] for r in chaos.rounds]
    assert steps == list(range(1, len(steps) + 1))  # nothing lost, nothing twice
    sizes = [(r[0]["world_size"], len(r)) for r in chaos.rounds]
    assert sizes[:3] == [(4, 4)] * 3
    after = sizes[3:]
    assert after[0] == (2, 2)  # restarted at once on the host that is left (min is 2)
    assert after[-1] == (4, 4)  # and grew back when the host returned
    # The restart after the loss resumed from the checkpoint of step 2; growing back resumed
    # from the checkpoint it was triggered by: no step was redone there.
    first_small = next(r[0] for r in chaos.rounds if r[0]["world_size"] == 2)
    assert first_small["resumed_from"] == 2 and first_small["step"] == 4
    first_big = next(r[0] for r in chaos.rounds[3:] if r[0]["world_size"] == 4)
    assert first_big["step"] == first_big["resumed_from"] + 1
    assert _steps(trainer.latest_run_dir) == steps


def _train_in_place(config):
    import time

    import ray
    import torch
    import torch.distributed as dist

    from sgd import elastic

    state = elastic.ObjectState(step=0)

    @elastic.run
    def train(state):
        while state.step < config["steps"]:
            dist.all_reduce(torch.ones(1))
            time.sleep(0.05)
            state.step += 1
            state.commit()
            sgd.report(step=state.step, world_size=sgd.world_size(), pid=os.getpid(),
                       ip=ray.util.get_node_ip_address())

    train(state)


def test_in_place_a_lost_host_leaves_the_survivors_running_and_the_group_grows_back_onto_it(hosts):
    # sgd.elastic.run (issue 36): the survivors keep their processes when a host is lost (found
    # by its raylet refusing connections, not when Ray fails the calls), and the group grows
    # back onto the host when it returns, into the reservation the lost workers left.
    lost = hosts.hosts[1]
    chaos, came_back = _lose_at_step_3_and_bring_back(hosts, lost)
    trainer = sgd.Trainer(backend="torch", num_workers=(2, 4), max_retries=1)
    trainer.start()
    try:
        it = trainer.run_iterator(_train_in_place, config={"steps": 100000})
        for results in it:
            chaos.handle_result(results)
            if came_back.is_set() and results[0]["world_size"] == 4:
                break
        else:
            pytest.fail("the run ended before the group grew back")
        it.stop()
    finally:
        trainer.shutdown()
    steps = [r[0]["step"] for r in chaos.rounds]
    assert steps == list(range(1, len(steps) + 1))  # nothing lost, nothing twice
    before = {(r["ip"], r["pid"]) for r in chaos.rounds[0]}
    survivors = {w for w in before if w[0] != lost.ip}
    small = [r for r in chaos.rounds if r[0]["world_size"] == 2]
    assert small and {(r["ip"], r["pid"]) for r in small[0]} == survivors, "the survivors kept their processes"
    grown = {(r["ip"], r["pid"]) for r in chaos.rounds[-1]}
    assert survivors < grown and {ip for ip, _ in grown - survivors} == {lost.ip}, "grew back onto the host"


def test_fixed_size_waits_for_room_then_says_what_is_missing_and_where(hosts):
    trainer = sgd.Trainer(backend="base", num_workers=4, max_retries=-1, placement_timeout_s=3)
    chaos = _OnStep(3, lambda results: hosts.hosts[0].kill())
    trainer.start()
    try:
        with pytest.raises(sgd.ResourcesUnavailableError) as info:
            trainer.run(_train, config={"steps": 50, "every": 1}, callbacks=[chaos])
    finally:
        trainer.shutdown()
    message = str(info.value)
    assert "could not place 4 workers" in message and "within 3s" in message
    assert "127.0.0.4: 2" in message  # what fits, and where
    assert "Trainer.restore" in message and str(trainer.latest_run_dir) in message
    # Nothing reported before the loss is lost, and the last committed checkpoint is the latest.
    assert _steps(trainer.latest_run_dir) == [1, 2, 3]
    assert trainer.latest_checkpoint["step"] >= 3 - 1


def test_fixed_size_goes_on_when_the_host_comes_back(hosts):
    lost = hosts.hosts[0]

    def lose(results):
        lost.kill()
        threading.Thread(target=hosts.restart, args=(lost,), daemon=True).start()

    chaos = _OnStep(3, lose)
    trainer = sgd.Trainer(backend="base", num_workers=4, max_retries=1, placement_timeout_s=120)
    trainer.start()
    try:
        sizes = trainer.run(_train, config={"steps": 8}, callbacks=[chaos])
    finally:
        trainer.shutdown()
    assert sizes == [4, 4, 4, 4]
    steps = [r[0]["step"] for r in chaos.rounds]
    assert steps == list(range(1, 9))
    assert all(len(r) == 4 for r in chaos.rounds)
    # The host is killed when report 3 arrives, while the workers go on to save checkpoint 3: the
    # group resumes from checkpoint 3 if it was committed before the kill, else from 2 (and step 3,
    # redone, is not delivered twice: the steps above). Either is the latest committed checkpoint.
    resumed = [r[0]["resumed_from"] for r in chaos.rounds if r[0]["resumed_from"] != 0]
    assert resumed and resumed[0] in (2, 3) and set(resumed) == {resumed[0]}


def test_a_draining_host_is_left_at_the_next_checkpoint_without_a_failure(hosts):
    drained = hosts.hosts[1]
    chaos = _OnStep(3, lambda results: drained.drain(deadline_s=300))
    # max_retries=0: leaving the drained host must not count as a failure.
    trainer = sgd.Trainer(backend="base", num_workers=(2, 4), max_retries=0)
    trainer.start()
    try:
        it = trainer.run_iterator(_train, config={"steps": 100000, "sleep": 0.05, "every": 1000})
        for results in it:
            chaos.handle_result(results)
            if results[0]["world_size"] == 2 and results[0]["step"] >= results[0]["resumed_from"] + 2:
                break
        it.stop()
    finally:
        trainer.shutdown()
    rounds = chaos.rounds
    steps = [r[0]["step"] for r in rounds]
    assert steps == list(range(1, len(steps) + 1))  # no step lost or redone
    assert all(len({w["notice"] for w in r}) == 1 for r in rounds)  # never seen by some ranks only
    moved = next(i for i, r in enumerate(rounds) if r[0]["world_size"] == 2)
    assert moved >= 3 and all(len(r) == 4 for r in rounds[:moved])
    # The only checkpoint was the one the notice led to (every=1000): every rank saw the notice
    # after the same report (else their save_checkpoint counts would differ and the run fail),
    # and the group resumed right after it, off the draining host.
    assert rounds[moved][0]["resumed_from"] == steps[moved - 1]
    assert {w["pid"] for w in rounds[moved]}.isdisjoint({w["pid"] for w in rounds[0]})


SHIPPED_SCRIPT = '''
import os
import sys
from pathlib import Path

import ray

import helper  # beside the script: shipped with it
import sgd

data = (Path(__file__).parent / "data" / "value.txt").read_text()
sgd.report(rank=sgd.world_rank(), helper=helper.VALUE, data=data, ip=ray.util.get_node_ip_address(),
           argv=sys.argv[1:], cwd_is_script_dir=os.getcwd() == str(Path(__file__).parent))
'''


def test_sgd_run_ships_a_script_that_exists_only_on_the_driver(hosts, tmp_path, monkeypatch, capsys):
    from sgd.launcher import launch

    project = tmp_path / "project"  # the driver's /tmp: the worker hosts do not see it
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text(SHIPPED_SCRIPT)
    (project / "helper.py").write_text("VALUE = 42\n")
    (project / "data" / "value.txt").write_text("from the driver")
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "junk.pyc").write_bytes(b"x" * 100)
    monkeypatch.chdir(project)
    result = launch("train.py", ["--epochs", "1"], backend="base", num_workers=4, max_retries=0)
    assert result.exit_code == 0, result.error
    by_rank = sorted(result.final_metrics, key=lambda r: r["rank"])
    assert [r["rank"] for r in by_rank] == [0, 1, 2, 3]
    assert {r["ip"] for r in by_rank} == {"127.0.0.3", "127.0.0.4"}
    assert all(r["helper"] == 42 and r["data"] == "from the driver" for r in by_rank)
    assert all(r["argv"] == ["--epochs", "1"] and r["cwd_is_script_dir"] for r in by_rank)


def test_shipped_bundles_refuse_paths_outside_their_folder(tmp_path):
    import io
    import zipfile

    from sgd.launcher.ship import Bundle, pack, unpack

    assert pack(str(tmp_path / "nothing")) is None  # nothing to ship
    for name in ("../evil.py", "/etc/evil.py", "a/../../evil.py"):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr(name, "print('pwned')")
        with pytest.raises(ValueError, match="not a path inside the bundle"):
            unpack(Bundle("/x", buffer.getvalue(), "0" * 64 + name.replace("/", "_")), into=str(tmp_path / "u"))
    assert not (tmp_path / "evil.py").exists()
    assert not list((tmp_path / "u").rglob("evil.py"))
    assert not list((tmp_path / "u").iterdir())  # nothing half-unpacked is left behind


# --- every backend and integration across hosts ---------------------------------------------


def _tf_allreduce():
    import json
    import os

    import ray
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(float(sgd.world_rank() + 1))), axis=None)
    return ray.util.get_node_ip_address(), json.loads(os.environ["TF_CONFIG"]), float(total)


def test_tensorflow_cluster_spec_names_the_hosts(hosts):
    pytest.importorskip("tensorflow")
    trainer = sgd.Trainer(backend="tensorflow", num_workers=2, placement_strategy="SPREAD")
    trainer.start()
    try:
        results = trainer.run(_tf_allreduce)
    finally:
        trainer.shutdown()
    ips = [r[0] for r in results]
    assert sorted(ips) == ["127.0.0.3", "127.0.0.4"]  # one worker per host
    workers = results[0][1]["cluster"]["worker"]
    assert [w.rsplit(":", 1)[0] for w in workers] == ips  # TF_CONFIG: each worker at its host's address
    assert [r[1]["task"]["index"] for r in results] == [0, 1]
    assert [r[2] for r in results] == [3.0, 3.0]  # the collective crossed the hosts


def _hvd_allreduce():
    import horovod.torch as hvd
    import ray
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    return ray.util.get_node_ip_address(), hvd.rank(), hvd.size(), hvd.local_size(), total


def test_horovod_rendezvous_is_reachable_from_the_hosts(hosts):
    from sgd_horovod import horovod_available

    if not horovod_available():
        pytest.skip("Horovod is not installed (scripts/build_horovod.py builds it; nox -s tests does)")
    trainer = sgd.Trainer(backend="horovod", num_workers=4)
    trainer.start()
    try:
        results = trainer.run(_hvd_allreduce)
    finally:
        trainer.shutdown()
    assert sorted({r[0] for r in results}) == ["127.0.0.3", "127.0.0.4"]
    assert [r[1] for r in results] == [0, 1, 2, 3] and all(r[2] == 4 and r[3] == 2 for r in results)
    assert all(r[4] == 10.0 for r in results)  # 1 + 2 + 3 + 4 through the driver's rendezvous


def _read_shard():
    import ray

    shard = sgd.get_dataset_shard("train")
    rows = [int(row["id"]) for batch in shard.iter_batches(batch_size=32, batch_format="numpy")
            for row in [{"id": i} for i in batch["id"]]]
    sgd.report(rows=len(rows))
    return ray.util.get_node_ip_address(), rows


def test_ray_data_shards_are_read_on_the_worker_hosts(hosts):
    import ray

    trainer = sgd.Trainer(backend="base", num_workers=2, placement_strategy="SPREAD")
    trainer.start()
    try:
        results = trainer.run(_read_shard, dataset={"train": ray.data.range(200)})
    finally:
        trainer.shutdown()
    assert sorted(r[0] for r in results) == ["127.0.0.3", "127.0.0.4"]
    seen = sorted(i for r in results for i in r[1])
    assert seen == list(range(200))  # every row once, read where the workers run


def _tune_train(config):
    import ray

    for epoch in range(2):
        sgd.report(epoch=epoch, score=config["x"] * (epoch + 1), ip=ray.util.get_node_ip_address())
        sgd.save_checkpoint(epoch=epoch, x=config["x"])


def test_tune_trials_run_on_the_worker_hosts(hosts):
    import tempfile

    from ray import tune

    # Tune's storage must be shared by the hosts (Ray Tune's rule for a multi-host cluster):
    # /var/tmp is, unlike the worker hosts' private /tmp.
    storage = tempfile.mkdtemp(prefix="sgd-tune-", dir="/var/tmp")
    try:
        trainer = sgd.Trainer(backend="base", num_workers=2)
        tuner = tune.Tuner(
            trainer.to_tune_trainable(_tune_train),
            param_space={"x": tune.grid_search([1, 2])},
            tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=1),
            run_config=tune.RunConfig(storage_path=storage, name="hosts", verbose=0),
        )
        results = tuner.fit()
        assert not results.errors
        assert sorted(r.metrics["score"] for r in results) == [2, 4]
        assert all(r.metrics["ip"] in ("127.0.0.3", "127.0.0.4") for r in results)
        best = results.get_best_result()
        assert best.checkpoint is not None and sgd.Trainer.load_checkpoint_from_path(best.checkpoint.path)["x"] == 2
    finally:
        import shutil

        shutil.rmtree(storage, ignore_errors=True)


def _profiled():
    import ray
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from sgd_torch import TorchWorkerProfiler

    profiler = TorchWorkerProfiler()  # writes its traces into the worker host's private /tmp
    model = torch.nn.Linear(4, 1)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=1),
                 on_trace_ready=profiler.trace_handler) as prof:
        for _ in range(2):
            model(torch.randn(8, 4)).sum().backward()
            prof.step()
    sgd.report(ip=ray.util.get_node_ip_address(), **profiler.get_and_clear_profile_traces())


def test_per_rank_profiler_traces_from_worker_hosts_reach_the_run_directory(hosts):
    pytest.importorskip("torch")
    from sgd_loggers import TorchTensorboardProfilerCallback

    trainer = sgd.Trainer(backend="torch", num_workers=2, placement_strategy="SPREAD")
    trainer.start()
    try:
        trainer.run(_profiled, callbacks=[TorchTensorboardProfilerCallback()])
    finally:
        trainer.shutdown()
    traces = sorted(p for p in trainer.latest_run_dir.rglob("*.pt.trace.json*"))
    assert len({p.name.split(".")[0] for p in traces}) == 2, traces  # one worker's traces each
    assert all(p.stat().st_size > 0 for p in traces)


def _sharded(config):
    import ray
    import torch

    import sgd_torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    model = sgd_torch.prepare_model(model, parallel_strategy="fsdp")
    loaded = sgd_torch.load_sharded_checkpoint({"model": model})
    start = loaded["step"] if loaded else 0
    with torch.no_grad():
        if loaded is None:
            for p in model.parameters():
                p.zero_()
        # Every element of every shard is the step it was saved at: the restore read them all.
        local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
        restored = all(bool(t.eq(float(start)).all()) for t in local)
    for step in range(start + 1, config["steps"] + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # a training step
        sgd.report(step=step, resumed_from=start, restored=restored, ip=ray.util.get_node_ip_address(),
                   world_size=sgd.world_size())
        # Two asynchronous saves, then blocking ones: the kill at step 4's report finds 3 committed.
        sgd_torch.save_sharded_checkpoint({"model": model}, blocking=step >= 3, step=step)
    return sgd.world_size()


def test_sharded_checkpoints_reach_the_driver_and_restore_after_a_host_loss(hosts):
    """Every worker host has a disk of its own: each rank's shard goes to the driver's disk, and
    the restart after a host is lost loads them from there (resharded onto what is left)."""
    pytest.importorskip("torch")

    def lose(results):
        next(h for h in hosts.hosts if h.ip == results[1]["ip"]).kill()

    chaos = _OnStep(4, lose)
    trainer = sgd.Trainer(backend="torch", num_workers=(1, 2), max_retries=1, placement_strategy="SPREAD")
    trainer.start()
    try:
        trainer.run(_sharded, config={"steps": 5}, callbacks=[chaos])
    finally:
        trainer.shutdown()
    firsts = [r[0] for r in chaos.rounds]
    assert [r["step"] for r in firsts] == [1, 2, 3, 4, 5]  # nothing lost, nothing twice
    assert len({firsts[0]["ip"], chaos.rounds[0][1]["ip"]}) == 2  # one rank per host: two private disks
    # The host died after checkpoint 3 was committed, and maybe 4 (saved after step 4's report):
    # the restart resumed from the newest one; a step redone after it is not reported twice.
    resumed = firsts[-1]["resumed_from"]
    assert resumed in (3, 4)
    assert [r["resumed_from"] for r in firsts[:4]] == [0, 0, 0, 0] and firsts[4]["resumed_from"] == resumed
    assert all(r["restored"] for rnd in chaos.rounds for r in rnd)  # restored shards hold the saved values
    assert firsts[4]["ip"] != chaos.rounds[3][1]["ip"]  # restarted on the host that is left
    assert trainer.latest_checkpoint == {"step": 5}
    checkpoints = trainer.latest_run_dir / "checkpoints"
    shards = sorted(p.name for p in sorted(checkpoints.glob("checkpoint_*"))[-1].iterdir())
    assert ".metadata" in shards and any(n.endswith(".distcp") for n in shards), shards
    assert not list(checkpoints.rglob("*.sgd-part")) and not list(checkpoints.glob(".tmp_*"))
    assert _steps(trainer.latest_run_dir) == [1, 2, 3, 4, 5]


def _prints(config):
    import ray

    print(f"rank {sgd.world_rank()} says hello from {ray.util.get_node_ip_address()}")
    sgd.report(x=1)


def test_per_rank_logs_of_hosts_with_their_own_disks_reach_the_driver(hosts):
    trainer = sgd.Trainer(backend="base", num_workers=2, placement_strategy="SPREAD")
    trainer.start()
    try:
        trainer.run(_prints)
    finally:
        trainer.shutdown()
    logs = trainer.latest_run_dir / "logs"
    said = {rank: (logs / f"rank_{rank}.log").read_text() for rank in (0, 1)}
    ips = set()
    for rank, text in said.items():
        line = next(x for x in text.splitlines() if x.startswith(f"rank {rank} says hello from "))
        ips.add(line.rsplit(" ", 1)[1])
    assert ips == {"127.0.0.3", "127.0.0.4"}  # written on two hosts with private disks
