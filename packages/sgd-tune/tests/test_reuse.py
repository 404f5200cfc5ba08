"""Actor reuse (``TuneConfig(reuse_actors=True)``): trials run one after another on the same
sgd workers, and nothing of one trial reaches the next.

The grid once hung after its first trial: ``reset_config`` returned False (Tune's default),
Tune failed the second trial without telling its search algorithm, and with
``max_concurrent_trials=1`` the search never asked for a third.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ray import tune

import sgd

#: Module state on the workers: the training function (and this module, pickled by value)
#: arrives afresh with every run, so each trial must see it at 0.
CALLS = 0


def train_probe(config):
    import torch

    import sgd_torch

    global CALLS
    CALLS += 1
    resumed = sgd.load_checkpoint() is not None
    if config["amp"]:
        sgd_torch.accelerate(amp=True)
    model = sgd_torch.prepare_model(torch.nn.Linear(2, 1))  # unseeded: torch's default generator
    first_weight = getattr(model, "module", model).weight.detach().clone().flatten().tolist()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.ones(4, 2)
    for step in range(2):
        optimizer.zero_grad()
        out = model(x)
        loss = out.float().pow(2).mean()
        loss.backward()
        optimizer.step()
        sgd.report(loss=loss.item(), dtype=str(out.dtype), calls=CALLS, resumed=resumed,
                   optimizer_steps=int(optimizer.state[next(iter(optimizer.state))]["step"]),
                   first_weight=first_weight, pid=os.getpid(), run_dir=sgd.get_context().get_trial_dir())
        sgd.save_checkpoint(step=step)


def test_reused_workers_run_every_trial_and_leak_nothing(ray_cluster, storage_path):
    trainer = sgd.Trainer(backend="torch", num_workers=2, resources_per_worker={"CPU": 0.5})
    grid = tune.Tuner(
        trainer.to_tune_trainable(train_probe),
        # The first and last trials have the same config: they must behave the same.
        param_space={"amp": tune.grid_search([False, True, False])},
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=storage_path, name="reuse", verbose=0),
    ).fit()
    assert not grid.errors
    assert len(grid) == 3  # the hang: only the first trial ever ran
    frames = [r.metrics_dataframe for r in sorted(grid, key=lambda r: r.metrics["trial_id"])]
    # One actor, one worker group: every trial ran in the same processes.
    assert len({pid for f in frames for pid in f["pid"]}) == 1
    for f in frames:
        assert list(f["_training_iteration"]) == [1, 2]  # sgd's count restarts per trial
        assert list(f["calls"]) == [1, 1] and not any(f["resumed"])  # no module state, no checkpoint
        assert list(f["optimizer_steps"]) == [1, 2]
    plain, amp, plain_again = frames
    assert set(amp["dtype"]) == {"torch.bfloat16"}  # accelerate(amp=True) on CPU: bfloat16 autocast
    assert set(plain_again["dtype"]) == {"torch.float32"}  # ... and only in its own trial
    # Same config, same results: the model starts from what fresh workers would give it.
    assert plain_again["first_weight"].tolist() == plain["first_weight"].tolist()
    assert plain_again["loss"].tolist() == plain["loss"].tolist()
    # Each trial has its own sgd run in its own trial directory, finished.
    run_dirs = [Path(f["run_dir"].iloc[-1]) for f in frames]
    assert len(set(run_dirs)) == 3
    for result, run_dir in zip(sorted(grid, key=lambda r: r.metrics["trial_id"]), run_dirs):
        assert run_dir.name == "run_001" and result.metrics["trial_id"] in str(run_dir)
        assert json.loads((run_dir / "status.json").read_text())["status"] == "FINISHED"
