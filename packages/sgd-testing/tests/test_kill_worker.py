import os

import pytest

import sgd
from sgd_testing import KillWorker


def train_func(config):
    state = sgd.load_checkpoint() or {"epoch": 0}
    for epoch in range(state["epoch"], 4):
        sgd.report(epoch=epoch, pid=os.getpid())
        sgd.save_checkpoint(epoch=epoch + 1)


def test_a_killed_worker_is_restarted(ray_cluster):
    killer = KillWorker(at=1)
    with sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, max_retries=1) as trainer:
        trainer.start()
        trainer.run(train_func, callbacks=[killer])
    assert len(killer.killed) == 1
    assert killer.values("epoch") == [0, 1, 2, 3]  # every round delivered once, in order


def test_each_value_kills_once_and_the_run_fails_without_retries(ray_cluster):
    killer = KillWorker(at=[0, 2], rank=0)
    with sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, max_retries=0) as trainer:
        trainer.start()
        with pytest.raises(sgd.TrainingFailedError):
            trainer.run(train_func, callbacks=[killer])
    assert len(killer.killed) == 1 and killer.values("epoch") == [0]
