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
