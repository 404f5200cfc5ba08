"""Five SIGKILLs during one DDP run: it finishes with the same model as a run without faults."""

import os
import random
import signal

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
