"""``Trainer(backend="torch", num_workers=0)``: sgd-torch's helpers in the driver's process, world size 1."""

from __future__ import annotations

import os

import pytest
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


def _on_gpu(config):
    model = sgd_torch.prepare_model(torch.nn.Linear(4, 1))
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    loader = sgd_torch.prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=8))
    x, y = next(iter(loader))
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    sgd.report(device=str(sgd_torch.get_device()), weights=next(model.parameters()).device.type,
               batch=x.device.type, loss=loss.item())
    sgd.save_checkpoint(model=model.state_dict())


@pytest.mark.gpu
def test_local_mode_with_use_gpu_trains_on_this_process_gpu(tmp_path):
    trainer = sgd.Trainer(backend="torch", num_workers=0, use_gpu=True, logdir=tmp_path)
    trainer.start()
    try:
        rows = [r[0] for r in trainer.run_iterator(_on_gpu)]
    finally:
        trainer.shutdown()
    assert (rows[0]["device"], rows[0]["weights"], rows[0]["batch"]) == ("cuda:0", "cuda", "cuda")
    assert trainer.latest_checkpoint["model"]["weight"].device.type == "cpu"  # as from any GPU worker


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine whose driver has no GPU")
def test_local_mode_with_use_gpu_and_no_gpu_says_why(tmp_path):
    trainer = sgd.Trainer(backend="torch", num_workers=0, use_gpu=True, logdir=tmp_path)
    trainer.start()
    try:
        with pytest.raises(RuntimeError, match=r"driver's process, which sees 0 CUDA GPU\(s\) and needs 1"):
            trainer.run(_on_gpu)
    finally:
        trainer.shutdown()
