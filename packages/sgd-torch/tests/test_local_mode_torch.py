"""``Trainer(backend="torch", num_workers=0)``: sgd-torch's helpers in the driver's process, world size 1."""

from __future__ import annotations

import os

import torch

import sgd
import sgd_torch


def _train(config):
    model = sgd_torch.prepare_model(torch.nn.Linear(4, 1))
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = sgd_torch.prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        sgd.report(epoch=epoch, loss=loss.item(), wrapped=type(model).__name__, pid=os.getpid(),
                   distributed=torch.distributed.is_initialized())
        sgd.save_checkpoint(epoch=epoch, model=model.state_dict())
    return len(loader)


def test_torch_helpers_work_in_local_mode(tmp_path):
    trainer = sgd.Trainer(backend="torch", num_workers=0, logdir=tmp_path)
    trainer.start()
    rows = []
    try:
        it = trainer.run_iterator(_train)
        rows = [r[0] for r in it]
        assert it.get_final_results() == [4]  # the whole dataset: no sampler splits it
    finally:
        trainer.shutdown()
    assert [r["epoch"] for r in rows] == [0, 1]
    assert rows[0]["wrapped"] == "Linear" and rows[0]["pid"] == os.getpid()  # no DDP, this process
    assert rows[0]["distributed"] is False  # no process group: the backend is not set up
    state = trainer.latest_checkpoint
    assert state["epoch"] == 1 and isinstance(state["model"]["weight"], torch.Tensor)
