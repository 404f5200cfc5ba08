"""A real search: 2-worker torch regression over ``lr`` with ASHA, its trials on one reused actor;
checkpoints load back."""

from __future__ import annotations

import json
from pathlib import Path

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler

import sgd
from sgd_testing import wait_for

EPOCHS = 6


def train_regression(config):
    import torch

    from sgd_torch import prepare_model

    torch.manual_seed(0)
    x = torch.linspace(0, 1, 64).unsqueeze(1)
    y = 2 * x + 1
    rank, size = sgd.world_rank(), sgd.world_size()
    x, y = x[rank::size], y[rank::size]
    model = prepare_model(torch.nn.Linear(1, 1))
    state = sgd.load_checkpoint()
    start = 0
    if state is not None:
        getattr(model, "module", model).load_state_dict(state["model"])
        start = state["epoch"]
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for epoch in range(start, EPOCHS):
        for _ in range(5):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        ctx = sgd.get_context()
        sgd.report(epoch=epoch, loss=loss.item(), sgd_trial_id=ctx.get_trial_id(),
                   sgd_experiment=ctx.get_experiment_name(), sgd_run_dir=ctx.get_trial_dir())
        sgd.save_checkpoint(epoch=epoch + 1, model=getattr(model, "module", model).state_dict())


def test_asha_search_over_lr(ray_cluster, storage_path):
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainable = trainer.to_tune_trainable(train_regression)
    scheduler = ASHAScheduler(max_t=EPOCHS, grace_period=2, reduction_factor=2)
    tuner = tune.Tuner(
        trainable,
        # Best first, so that the later, worse trials meet ASHA's cut-off and stop early.
        param_space={"lr": tune.grid_search([0.5, 0.2, 0.02, 0.001])},
        # Trials on one reused actor (its started trainer): a stopped trial's run ends at reset_config.
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, max_concurrent_trials=1,
                                    reuse_actors=True),
        run_config=tune.RunConfig(storage_path=storage_path, name="asha", verbose=0),
    )
    results = tuner.fit()
    assert not results.errors
    assert len(results) == 4
    iterations = sorted(r.metrics["training_iteration"] for r in results)
    assert iterations[-1] == EPOCHS and iterations[0] < EPOCHS, iterations  # ASHA stopped some early

    best = results.get_best_result()
    assert best.config["lr"] in (0.5, 0.2)
    losses = list(best.metrics_dataframe["loss"])
    assert len(losses) == EPOCHS and losses[-1] < losses[0]
    # The workers know which Tune trial and experiment they run in.
    assert all(r.metrics["sgd_trial_id"] == r.metrics["trial_id"] for r in results)
    assert {r.metrics["sgd_experiment"] for r in results} == {"asha"}

    # Every result was followed by a checkpoint: each Tune checkpoint is an sgd checkpoint.
    assert len(best.best_checkpoints) == EPOCHS
    state = sgd.Trainer.load_checkpoint_from_path(best.checkpoint.path)
    assert state["epoch"] == EPOCHS and set(state["model"]) == {"weight", "bias"}
    for checkpoint, metrics in best.best_checkpoints:
        assert sgd.Trainer.load_checkpoint_from_path(checkpoint.path)["epoch"] == metrics["epoch"] + 1

    # A trial ASHA stopped ends its sgd run as STOPPED; one that ran to the end, FINISHED.
    for r in results:
        status = json.loads((Path(r.metrics["sgd_run_dir"]) / "status.json").read_text())["status"]
        assert status == ("FINISHED" if r.metrics["training_iteration"] == EPOCHS else "STOPPED"), r.metrics

    # The stopped trials' workers (and every trial's placement group) are gone.
    wait_for(lambda: ray.available_resources().get("CPU") == ray_cluster["CPU"], timeout=30,
             message=f"CPUs not released: {ray.available_resources()}")
