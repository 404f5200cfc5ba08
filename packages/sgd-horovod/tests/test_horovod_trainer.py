"""The AIR-style HorovodTrainer: same shape as TorchTrainer, hvd.init() just works in the loop."""

import json
import os
import tempfile

import pytest

import sgd
from sgd import Checkpoint, RunConfig, ScalingConfig


def loop(config):
    import horovod.torch as hvd
    import torch

    hvd.init()
    start = 0
    if (checkpoint := sgd.get_checkpoint()) is not None:
        with checkpoint.as_directory() as d:
            start = json.load(open(os.path.join(d, "state.json")))["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
        with tempfile.TemporaryDirectory() as d:
            saved = None
            if hvd.rank() == 0:
                json.dump({"epoch": epoch}, open(os.path.join(d, "state.json"), "w"))
                saved = Checkpoint.from_directory(d)
            sgd.report({"epoch": epoch, "sum": total, "rank": hvd.rank(), "lr": config["lr"]}, checkpoint=saved)


@pytest.mark.usefixtures("requires_horovod")
def test_horovod_trainer_fit(ray_cluster, tmp_path):
    from sgd_horovod import HorovodConfig, HorovodTrainer

    result = HorovodTrainer(loop, {"lr": 0.5, "epochs": 2}, ScalingConfig(num_workers=2),
                            horovod_config=HorovodConfig(timeout_s=60),
                            run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.error is None, result.error
    rows = [json.loads(x) for x in open(os.path.join(result.path, "results.jsonl"))]
    assert [[w["rank"] for w in row] for row in rows] == [[0, 1], [0, 1]]
    assert result.metrics["sum"] == 3.0 and result.metrics["epoch"] == 1 and result.metrics["lr"] == 0.5
    with result.checkpoint.as_directory() as d:
        assert json.load(open(os.path.join(d, "state.json"))) == {"epoch": 1}


def test_horovod_trainer_rejects_another_config():
    from sgd_horovod import HorovodTrainer

    with pytest.raises(TypeError, match="HorovodConfig"):
        HorovodTrainer(loop, horovod_config=sgd.BackendConfig())
