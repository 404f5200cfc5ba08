"""Horovod's elastic API under sgd's run controller (issue 35): a training function written for
``hvd.elastic.run`` keeps its survivors' processes when a worker is lost, its ranks and size
follow the re-formed group, and nothing reported is lost or doubled. Real Ray, real Horovod
over Gloo; each fault is a SIGKILL sent from a driver callback when a chosen round arrives."""

import os
import signal
import time

import pytest

import sgd

pytestmark = pytest.mark.usefixtures("requires_horovod")

STEPS = 8


@pytest.fixture(autouse=True)
def _no_growing_back(monkeypatch):
    """An elastic group that lost a worker has room to grow back at once here: these tests look
    at the group it shrank to, except the growth test."""
    from sgd.run import controller

    monkeypatch.setattr(controller, "GROW_CHECK_INTERVAL_S", 1e9)


def _train(config):
    """Horovod's elastic pattern as its docs write it: TorchState, hvd.elastic.run, commit."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    resets = []
    xs = torch.randn(config["steps"], 12, 3, generator=torch.Generator().manual_seed(1234))

    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        while state.step < config["steps"]:
            n, r = hvd.size(), hvd.rank()
            x = xs[state.step][r * 12 // n:(r + 1) * 12 // n]
            loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            state.step += 1
            state.commit()
            sgd.report(step=state.step, pid=os.getpid(), size=n, rank=r, sgd_size=sgd.world_size(),
                       at=time.time())
            time.sleep(config.get("pace_s", 0))  # pace the steps (not a synchronisation)
        return {"weight": model.weight.detach().clone(), "resets": resets, "size": hvd.size()}

    return train(state)


class Kill(sgd.TrainingCallback):
    """SIGKILLs the worker of rank ``rank`` when the round of step ``at`` arrives (once)."""

    def __init__(self, at, rank):
        self.at, self.rank = at, rank
        self.rounds = []
        self.killed = None
        self.killed_at = None

    def handle_result(self, results, **info):
        self.rounds.append(results)
        if results[0]["step"] == self.at and self.killed is None:
            self.killed = results[self.rank]["pid"]
            self.killed_at = time.time()
            os.kill(self.killed, signal.SIGKILL)

    def steps(self):
        return [r[0]["step"] for r in self.rounds]

    def pids(self, index):
        return {r["pid"] for r in self.rounds[index]}


def _trainer(num_workers):
    import ray

    from sgd_testing import wait_for

    need = max(num_workers) if isinstance(num_workers, tuple) else num_workers
    wait_for(lambda: ray.available_resources().get("CPU", 0) >= need, timeout=30,
             message=f"the cluster never had room for {need} workers")
    trainer = sgd.Trainer(backend="horovod", num_workers=num_workers, max_retries=1)
    trainer.start()
    return trainer


def test_an_elastic_group_goes_on_with_its_survivors_in_their_processes(ray_cluster):
    trainer = _trainer((2, 3))
    try:
        kill = Kill(at=3, rank=2)
        out = trainer.run(_train, config={"steps": STEPS}, callbacks=[kill])
        controller = trainer._controller
    finally:
        trainer.shutdown()
    assert kill.steps() == list(range(1, STEPS + 1)), "every step reported once, none lost"
    sizes = [r[0]["size"] for r in kill.rounds]
    assert sizes[:3] == [3] * 3 and sizes[-1] == 2 and sizes == sorted(sizes, reverse=True), sizes
    assert all(r["size"] == r["sgd_size"] for rnd in kill.rounds for r in rnd), "hvd.size() == sgd.world_size()"
    assert [r["rank"] for r in kill.rounds[-1]] == [0, 1]
    assert kill.pids(-1) == kill.pids(0) - {kill.killed}, "no worker started: the survivors went on"
    assert [o["resets"] for o in out] == [[2], [2]], "one reset, after which Horovod's size is 2"
    assert [o["size"] for o in out] == [2, 2]
    assert all(o["weight"].equal(out[0]["weight"]) for o in out), "the survivors end in sync"
    assert controller.attempt == 1, "the in-place recovery counted once, by the controller"
    first_after = next(r for r in kill.rounds if r[0]["size"] == 2)
    print(f"\nkill -> first report of the re-formed group: {min(r['at'] for r in first_after) - kill.killed_at:.2f}s")


def test_a_fixed_size_group_replaces_the_lost_worker_and_ends_like_a_run_without_faults(ray_cluster):
    trainer = _trainer(3)
    try:
        # Horovod stays initialised after this run: the next run's hvd.init() is a no-op, and the
        # interrupt must still shut the connections of the context that run made.
        reference = trainer.run(_train, config={"steps": STEPS})
        kill = Kill(at=3, rank=1)
        out = trainer.run(_train, config={"steps": STEPS}, callbacks=[kill])
    finally:
        trainer.shutdown()
    assert kill.steps() == list(range(1, STEPS + 1))
    before, after = kill.pids(0), kill.pids(-1)
    survivors = before - {kill.killed}
    assert len(survivors) == 2 and survivors < after, "the survivors kept their processes"
    assert len(after - before) == 1, "one new worker took the lost one's place"
    assert [r[0]["size"] for r in kill.rounds] == [3] * STEPS
    for o in out:
        assert o["weight"].allclose(reference[0]["weight"]), "the same model as the run without faults"


def _until_grown(config):
    """Steps until Horovod's size has been 3 for three steps (after it was 2, with
    ``config["shrink_first"]``), or the deadline."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    state = hvd.elastic.TorchState(step=0, grown=0, total=0.0, shrunk=not config.get("shrink_first"))
    deadline = time.monotonic() + config["timeout_s"]

    @hvd.elastic.run
    def train(state):
        while state.grown < 3 and time.monotonic() < deadline:
            state.step += 1
            state.total += hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
            state.shrunk = state.shrunk or hvd.size() == 2
            if hvd.size() == 3 and state.shrunk:
                state.grown += 1
            state.commit()
            sgd.report(step=state.step, pid=os.getpid(), size=hvd.size(), total=state.total)
            time.sleep(0.02)  # pace the steps (not a synchronisation): a real step takes time
        return state.total

    return train(state)


def test_an_elastic_group_takes_in_new_workers_at_a_commit(ray_cluster, monkeypatch):
    from sgd.run import controller
    from sgd_testing import grow_during_run

    monkeypatch.setattr(controller, "GROW_CHECK_INTERVAL_S", 0.2)
    rounds, totals = grow_during_run("horovod", _until_grown, {"timeout_s": 90})  # 2 workers, a 3rd at step 3
    sizes = [r[0]["size"] for r in rounds]
    assert sizes[0] == 2 and sizes[-1] == 3 and sizes == sorted(sizes), sizes
    assert [r[0]["step"] for r in rounds] == list(range(1, len(rounds) + 1)), "no step lost or twice"
    first = {r["pid"] for r in rounds[0]}
    assert first < {r["pid"] for r in rounds[-1]}, "the two first workers kept their processes"
    # Every step's allreduce counted each worker of its group once: the new worker synced the total.
    assert totals == [sum(sizes)] * 3, (totals, sizes)


def test_a_group_that_lost_a_worker_grows_back_in_the_same_run(ray_cluster, monkeypatch):
    from sgd.run import controller

    monkeypatch.setattr(controller, "GROW_CHECK_INTERVAL_S", 0.2)
    trainer = _trainer((2, 3))
    try:
        kill = Kill(at=3, rank=2)
        totals = trainer.run(_until_grown, config={"timeout_s": 90, "shrink_first": True}, callbacks=[kill])
    finally:
        trainer.shutdown()
    sizes = [r[0]["size"] for r in kill.rounds]
    assert sizes[0] == 3 and 2 in sizes and sizes[-1] == 3, sizes
    assert kill.steps() == list(range(1, len(kill.rounds) + 1)), "no step lost or twice"
    survivors = kill.pids(0) - {kill.killed}
    assert survivors < kill.pids(-1) and len(kill.pids(-1) - survivors) == 1, "two kept, one new"
    assert totals == [sum(sizes)] * 3, (totals, sizes)


def _sgd_elastic_train(config):
    """sgd's own elastic API with Horovod collectives: the backend meets again at each reset."""
    import horovod.torch as hvd
    import torch

    from sgd import elastic

    hvd.init()
    state = elastic.ObjectState(step=0, total=0.0)

    @elastic.run
    def train(state):
        while state.step < config["steps"]:
            state.total += hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
            state.step += 1
            state.commit()
            sgd.report(step=state.step, pid=os.getpid(), size=hvd.size(), sgd_size=sgd.world_size())
        return state.total

    return train(state)


def test_sgd_elastic_run_with_horovod_collectives_re_forms_in_place(ray_cluster):
    trainer = _trainer((2, 3))
    try:
        kill = Kill(at=3, rank=2)
        totals = trainer.run(_sgd_elastic_train, config={"steps": STEPS}, callbacks=[kill])
    finally:
        trainer.shutdown()
    assert kill.steps() == list(range(1, STEPS + 1))
    sizes = [r[0]["size"] for r in kill.rounds]
    assert sizes[0] == 3 and sizes[-1] == 2 and all(r["size"] == r["sgd_size"] for rnd in kill.rounds for r in rnd)
    assert kill.pids(-1) == kill.pids(0) - {kill.killed}
    assert totals == [float(sum(sizes))] * 2, (totals, sizes)  # each step's allreduce counted once
