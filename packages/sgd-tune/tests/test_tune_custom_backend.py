"""Ray 1.12's ``test_tune.py::test_retry`` with its own custom backend (issue 37, item 8).

Ported from Ray 1.12 (``python/ray/train/tests/test_tune.py``): ``TestConfig`` / ``TestBackend``
and ``test_retry`` as they were written there, with ``ray.train`` renamed to ``sgd``. Edits are
marked ``# sgd:``.

Why rows went missing (found with this test, 3 of 3 runs when the machine is busy, 0 of 6 when it
is idle, with this backend or another): Ray Tune 2.60's driver writes ``progress.csv`` and
``result.json`` into a staging folder and copies that folder to the experiment's storage in the
background, at most once per experiment-checkpoint period (``TUNE_GLOBAL_CHECKPOINT_S``, "auto":
several seconds). Its logger callbacks create both files, empty, when the trial starts; when a
trial is restarted from a checkpoint (``max_failures``), they first copy the *storage* copy back
over the staging one (``LoggerCallback._restore_from_remote``). When the only copy made so far
caught the files empty (made after the trial started, before its first result) and the first
attempt fails before the next one, the restart replaces the first attempt's rows with that empty
file: the dataframe keeps the second attempt's rows only, while Tune's callbacks saw all four.
Which backend runs decides nothing but the timing (a torch process group takes longer to start,
so its first attempt usually outlives a copy period); the slowness is the machine's load. sgd's
trainable hands Tune every result (the callbacks show it); the loss is Tune's.
``TUNE_GLOBAL_CHECKPOINT_S=0`` in the driver makes Tune try a copy of the staging folder at every
step of its loop (measured: 3 of 3 busy runs keep all four rows). It narrows the race without
closing it (Tune's syncer skips a copy while the last one runs), so this test, which keeps Ray's
dataframe assertion, runs alone (``serial``); test_tune_mapping.py asserts on the rows Tune's
callbacks received.
"""

from __future__ import annotations

import pytest
import ray
from ray import tune

import sgd as train  # sgd: was ``from ray import train``

# sgd: were ray.train.backend (Backend, BackendConfig), ray.train (Trainer), ray.train.worker_group
from sgd import Backend, BackendConfig, Trainer, WorkerGroup


class TestConfig(BackendConfig):
    @property
    def backend_cls(self):
        return TestBackend


class TestBackend(Backend):
    def on_start(self, worker_group: WorkerGroup, backend_config: TestConfig):
        pass

    def on_shutdown(self, worker_group: WorkerGroup, backend_config: TestConfig):
        pass


@pytest.mark.serial  # failed under load in parallel runs (docs/contributing.md)
def test_retry(ray_cluster, storage_path, monkeypatch):  # sgd: the session's cluster; Tune writes under tmp_path
    # sgd: Tune copies its logs to storage before every restart (see the module docstring)
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "0")

    def train_func():
        ckpt = train.load_checkpoint()
        restored = bool(ckpt)
        itr = 0
        if ckpt:
            itr = ckpt["iter"] + 1

        for i in range(itr, 4):
            if i == 2 and not restored:
                raise Exception("try to fail me")
            train.save_checkpoint(iter=i)
            train.report(test=i, training_iteration=i)

    trainer = Trainer(TestConfig(), num_workers=1)
    TestTrainable = trainer.to_tune_trainable(train_func)

    # sgd: storage_path and verbose=0 added
    analysis = tune.run(TestTrainable, max_failures=3, storage_path=storage_path, verbose=0)

    # sgd: Ray 1.12 read the checkpoint file with torch.load; sgd's checkpoint is a directory
    checkpoint = Trainer.load_checkpoint_from_path(analysis.trials[0].checkpoint.path)
    assert checkpoint["iter"] == 3

    trial_dfs = list(analysis.trial_dataframes.values())
    assert len(trial_dfs[0]["training_iteration"]) == 4
    # sgd: beyond Ray's test, every row of both attempts, in order
    assert list(trial_dfs[0]["test"]) == [0, 1, 2, 3]
    assert list(trial_dfs[0]["training_iteration"]) == [1, 2, 3, 4]
    assert ray.is_initialized()
