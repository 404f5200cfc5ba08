"""sgd-tune is discovered through its entry point and answers the tune-adaptation hook."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sgd
from sgd import plugins
from sgd_tune import SgdTrainable, trial_resources


def test_listed_by_sgd_plugins():
    out = subprocess.run([sys.executable, "-m", "sgd", "plugins", "--json"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    table = json.loads(out)
    (row,) = [r for r in table["plugins"] if r["name"] == "tune"]
    assert row["distribution"] == "sgd-tune" and row["version"] == "0.1.0"
    assert "sgd_tune_trainable" in row["hooks"]
    assert not [f for f in table["failed"] if f["name"] == "tune"]


def test_loading_plugins_does_not_import_tune():
    code = ("import sys, sgd; from sgd import plugins; plugins.get_plugin_manager(); "
            "print('ray.tune' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"


def _my_train(config):
    return config


def test_hook_answers_with_a_trainable_class():
    trainer = sgd.Trainer(backend="torch", num_workers=2, resources_per_worker={"CPU": 2, "accel": 0.5})
    trainable = plugins.get_plugin_manager().hook.sgd_tune_trainable(
        trainer=trainer, train_func=_my_train, dataset=None)
    assert issubclass(trainable, SgdTrainable)
    assert trainable.__name__ == "sgd_my_train"  # leading underscores dropped
    pgf = trainable.default_resource_request({})
    assert pgf.bundles == [{"CPU": 1}, {"CPU": 2, "accel": 0.5}, {"CPU": 2, "accel": 0.5}]
    assert trainer.resources_per_worker == {"CPU": 2, "GPU": 0, "accel": 0.5}  # unchanged


def test_trial_resources_drop_zero_entries_and_keep_gpus():
    pgf = trial_resources(3, {"CPU": 1, "GPU": 1, "custom": 0})
    assert pgf.bundles == [{"CPU": 1}] + [{"CPU": 1, "GPU": 1}] * 3
    assert pgf.required_resources == {"CPU": 4, "GPU": 3}


def test_elastic_trainer_reserves_its_maximum():
    trainer = sgd.Trainer(backend="torch", num_workers=(1, 3))
    pgf = trainer.to_tune_trainable(print).default_resource_request({})
    assert len(pgf.bundles) == 4


def test_started_trainer_is_refused(ray_cluster):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=1)
    trainer.start()
    try:
        with pytest.raises(RuntimeError, match="not started"):
            trainer.to_tune_trainable(print)
    finally:
        trainer.shutdown()


class _TrialPlugin:
    @sgd.hookimpl
    def sgd_backends(self):
        return [sgd.BackendSpec("trial-only", sgd.BackendConfig, provider="test")]


def test_each_trials_trainer_gets_the_trainers_own_plugins():
    """Trainer(plugins=[...]) reaches Tune: the trainable is asked for through the trainer's own
    plugin manager, and each trial's trainer is made with the same plugins."""
    mine = _TrialPlugin()
    trainer = sgd.Trainer(backend="trial-only", num_workers=1, plugins=[mine])
    trainable = trainer.to_tune_trainable(_my_train)
    assert trainable._sgd_trainer_kwargs["plugins"] == [mine]
    trial = sgd.Trainer(**trainable._sgd_trainer_kwargs, logdir="trial")  # what each trial does
    assert trial.plugin_manager.is_registered(mine)
    assert not plugins.get_plugin_manager().is_registered(mine)
