"""The example of the seed documents, run as written (with a storage_path under tmp_path)."""

from ray import tune

import sgd


def train_func(config):
    for _ in range(config["num_epochs"]):
        sgd.report(output=config["input"])


def test_seed_example_with_tune_run(ray_cluster, storage_path):
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainable = trainer.to_tune_trainable(train_func)
    analysis = tune.run(trainable, config={"num_epochs": 2, "input": tune.grid_search([1, 2, 3])},
                        storage_path=storage_path, verbose=0)
    assert analysis.get_best_config(metric="output", mode="max") == {"num_epochs": 2, "input": 3}
    for trial in analysis.trials:
        assert trial.last_result["training_iteration"] == 2
        assert trial.last_result["output"] == trial.config["input"]
