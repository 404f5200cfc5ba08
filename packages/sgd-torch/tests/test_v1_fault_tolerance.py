"""v1's fault-tolerance protocol on sgd: a worker SIGKILLed in the middle of ``train()``.

With ``max_retries`` the workers are replaced, load the state the pass started from and redo
the pass: the call returns metrics, and the model is exactly the one a pass without the kill
gives. Without retries the call fails, and the trainer goes on from the state it had.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import sgd
from sgd_testing import wait_for
from sgd_torch.v1 import TorchTrainer, TrainingOperator, reduce_stats


class KillableOperator(TrainingOperator):
    """Linear regression with momentum; rank 1 parks in its 4th batch when ``info`` names a
    victim file that does not exist yet, after writing its pid there for the test to kill it."""

    def setup(self, config):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        self.register(models=model, optimizers=optimizer, criterion=torch.nn.MSELoss())
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 4, generator=g)
        y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
        self.register_data(train_loader=DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True))

    def train_batch(self, batch, batch_info):
        victim = batch_info.get("victim")
        if victim and self.world_rank == 1 and batch_info["batch_idx"] == 3 and not os.path.exists(victim):
            with open(f"{victim}.tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(f"{victim}.tmp", victim)
            threading.Event().wait(120)  # until the test kills this process
            raise RuntimeError("rank 1 was not killed within 120 s")
        return super().train_batch(batch, batch_info)

    def train_epoch(self, iterator, info=None):
        return dict(super().train_epoch(iterator, info), pid=os.getpid())


class Killer:
    """Waits in a thread for the victim's pid file, then SIGKILLs that process."""

    def __init__(self, victim_file):
        self.victim_file = victim_file
        self.pid = None
        self.error = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            self.pid = int(wait_for(lambda: os.path.exists(self.victim_file) and open(self.victim_file).read(),
                                    timeout=120, message="rank 1 never reached the kill point"))
            os.kill(self.pid, signal.SIGKILL)
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self):
        self._thread.join(timeout=130)
        if self.error is not None:
            raise self.error
        assert self.pid is not None


def test_worker_killed_during_train_is_replaced_and_the_pass_completes(ray_cluster, tmp_path):
    trainer = TorchTrainer(training_operator_cls=KillableOperator, num_workers=2)
    try:
        start = trainer.save(tmp_path / "start.pt")

        victim = str(tmp_path / "victim_1")
        killer = Killer(victim)
        per_worker = trainer.train(max_retries=2, reduce_results=False, info={"victim": victim})
        killer.join()
        assert len(per_worker) == 2
        assert killer.pid not in [w["pid"] for w in per_worker]  # rank 1 is a new process
        faulty = reduce_stats([{k: v for k, v in w.items() if k != "pid"} for w in per_worker])
        assert faulty["epoch"] == 1 and faulty["num_samples"] == 256 and faulty["batch_count"] == 8
        faulty_model = trainer.get_model()

        # The same pass without a kill, from the same starting state: the same model.
        trainer.restore(start)
        clean = trainer.train(info={"victim": victim})  # the file exists: nobody parks
        assert clean["epoch"] == 1
        assert clean["train_loss"] == faulty["train_loss"]
        clean_model = trainer.get_model()
        assert torch.equal(faulty_model.weight, clean_model.weight)
        assert torch.equal(faulty_model.bias, clean_model.bias)

        # Without retries the call fails (sgd.TrainingFailedError, a RuntimeError) ...
        victim2 = str(tmp_path / "victim_2")
        killer = Killer(victim2)
        with pytest.raises(sgd.TrainingFailedError, match="max_retries=0"):
            trainer.train(info={"victim": victim2})
        killer.join()
        # ... and the next call starts from the state before the failed pass.
        assert trainer.train()["epoch"] == 2
        assert trainer.state_dict()["epoch"] == 2
        with pytest.raises(RuntimeError, match="no validation data"):
            trainer.validate()  # told by the driver, without a run that would stop the workers
    finally:
        trainer.shutdown()
