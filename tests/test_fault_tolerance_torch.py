"""Five SIGKILLs during one DDP run: it finishes with the same model as a run without faults."""

import os
import random
import signal

import pytest
import torch

import sgd


def _ddp_train(config):
    from sgd_torch import enable_reproducibility, prepare_model

    enable_reproducibility(0)
    model = prepare_model(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = sgd.load_checkpoint()
    start = 0
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    g = torch.Generator().manual_seed(1234)
    xs = torch.randn(config["steps"], 8, 3, generator=g)
    for step in range(start, config["steps"]):
        x = xs[step][sgd.world_rank() * 4:(sgd.world_rank() + 1) * 4]
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sgd.report(step=step + 1, loss=loss.item(), pid=os.getpid())
        sgd.save_checkpoint(step=step + 1, model=model.module.state_dict(), opt=opt.state_dict())
    return model


def test_five_kills_same_final_model(ray_cluster):
    steps = 12
    trainer = sgd.Trainer(backend="torch", num_workers=2, max_retries=-1)
    trainer.start()
    try:
        reference = trainer.run(_ddp_train, config={"steps": steps})[0]

        rng = random.Random(7)
        kill_at = {2, 4, 6, 8, 10}
        delivered = []

        class KillRandomWorker(sgd.TrainingCallback):
            def handle_result(self, results, **info):
                step = results[0]["step"]
                delivered.append(step)
                if step in kill_at:
                    kill_at.discard(step)
                    os.kill(rng.choice(results)["pid"], signal.SIGKILL)

        faulty = trainer.run(_ddp_train, config={"steps": steps}, callbacks=[KillRandomWorker()])[0]
    finally:
        trainer.shutdown()
    assert not kill_at  # all five kills happened
    assert delivered == list(range(1, steps + 1))
    assert torch.equal(faulty.weight, reference.weight) and torch.equal(faulty.bias, reference.bias)
    names = sorted(p.name for p in trainer.latest_checkpoint_dir.iterdir())
    assert names == [f"checkpoint_{i:06d}" for i in range(1, steps + 1)]
    state = sgd.Trainer.load_checkpoint_from_path(trainer.latest_checkpoint_dir / names[-1])
    assert torch.equal(state["model"]["weight"], reference.weight)


def _allreduce_steps(config):
    import torch.distributed as dist

    state = sgd.load_checkpoint() or {"step": 0}
    for step in range(state["step"] + 1, config["steps"] + 1):
        t = torch.tensor([float(sgd.world_rank() + 1)])
        dist.all_reduce(t)  # the survivor's collective fails when its peer dies
        sgd.report(step=step, total=t.item(), pid=os.getpid(), rank=sgd.world_rank())
        sgd.save_checkpoint(step=step)
    return os.getpid()


def test_gloo_keeps_the_survivor_and_rebuilds_the_process_group(ray_cluster):
    """After rank 1 is killed, rank 0's process is kept: its process group is destroyed and
    built again with the new rank 1, and collectives work across the two (issue 20)."""
    from sgd_testing import KillWorker

    trainer = sgd.Trainer(backend="torch", num_workers=2, max_retries=1)
    trainer.start()
    try:
        first = trainer.run(_allreduce_steps, config={"steps": 1})
        killer = KillWorker(at=2, key="step", rank=1)
        rounds = []

        class Keep(sgd.TrainingCallback):
            def handle_result(self, results, **info):
                rounds.append(results)

        final = trainer.run(_allreduce_steps, config={"steps": 5}, callbacks=[killer, Keep()])
    finally:
        trainer.shutdown()
    assert [r[0]["step"] for r in rounds] == [1, 2, 3, 4, 5]
    assert all(r[0]["total"] == r[1]["total"] == 3.0 for r in rounds)  # 1 + 2, before and after
    assert final[0] == first[0]  # rank 0: the same process from start to end
    assert final[1] not in (first[1], killer.killed[0])  # rank 1: a new one


def _step_loop(config):
    """Step like a training loop: an all_reduce every 10 ms, a report every 10 steps."""
    import time

    import torch.distributed as dist

    state = sgd.load_checkpoint() or {"step": 0}
    step = state["step"]
    while step < config["steps"]:
        step += 1
        dist.all_reduce(torch.ones(1))
        time.sleep(0.01)
        if step % 10 == 0:
            sgd.report(step=step, pid=os.getpid())
            sgd.save_checkpoint(step=step)
    return os.getpid()


def test_a_death_ends_every_survivors_collective_at_once(ray_cluster):
    """4 ranks in a ring: when rank 2 dies, ranks 1 and 3 (its neighbours) see it in their
    next all_reduce, rank 0 waits on rank 1 and 3 only. Each rank whose run fails closes its
    process group, so rank 0's collective fails too, within the survivors' patience: all three
    are kept and only rank 2 is new."""
    from sgd_testing import KillWorker

    trainer = sgd.Trainer(backend="torch", num_workers=4, max_retries=1, resources_per_worker={"CPU": 0.5})
    trainer.start()
    try:
        first = trainer.run(_step_loop, config={"steps": 10})
        killer = KillWorker(at=50, key="step", rank=2)
        final = trainer.run(_step_loop, config={"steps": 150}, callbacks=[killer])
    finally:
        trainer.shutdown()
    assert killer.killed == [first[2]]
    assert [final[r] for r in (0, 1, 3)] == [first[r] for r in (0, 1, 3)], "a survivor was replaced"
    assert final[2] != first[2]
    assert killer.values("step")[-1] == 150


def _fails_on_rank_0(config):
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))
    if sgd.world_rank() == 0:
        raise ValueError("rank 0's own mistake")
    dist.all_reduce(torch.ones(1))  # rank 0 never joins: fails once rank 0 closes its group


def test_the_error_that_caused_a_collective_failure_is_the_one_raised(ray_cluster):
    """Rank 0 raises; its process group closes, so rank 1's all_reduce fails at once with a
    gloo "connection closed". Whichever reaches the driver first, the user sees rank 0's
    ValueError, and the next run works."""
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainer.start()
    try:
        for _ in range(3):
            with pytest.raises(ValueError, match="rank 0's own mistake"):
                trainer.run(_fails_on_rank_0)
        assert trainer.run(_sum_of_ranks) == [3.0, 3.0]
    finally:
        trainer.shutdown()


def _destroys_the_group(config):
    import torch.distributed as dist

    dist.destroy_process_group()


def _sum_of_ranks(config):
    import torch.distributed as dist

    t = torch.tensor([float(sgd.world_rank() + 1)])
    dist.all_reduce(t)
    return t.item()


def test_a_run_that_destroyed_the_process_group_gets_a_new_one(ray_cluster):
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainer.start()
    try:
        trainer.run(_destroys_the_group)
        assert trainer.run(_sum_of_ranks) == [3.0, 3.0]
    finally:
        trainer.shutdown()
