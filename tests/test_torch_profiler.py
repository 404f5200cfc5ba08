"""Ray Train 1.x's profiler pair (issue 18): ``sgd_torch.TorchWorkerProfiler`` takes real
``torch.profiler`` traces on two workers, they travel with ``sgd.report``, and
``sgd_loggers.TorchTensorboardProfilerCallback`` writes them where TensorBoard's PyTorch
Profiler plugin reads them; the files are read back here."""

from __future__ import annotations

import json
import re

import pytest

import sgd

pytest.importorskip("torch")

from sgd_loggers import TorchTensorboardProfilerCallback
from sgd_torch import TorchWorkerProfiler

#: The file names torch-tb-profiler loads: <worker>[.<span>].pt.trace.json[.gz]
PLUGIN_PATTERN = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(?:\.gz)?$")


def profiled_training(config):
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler = TorchWorkerProfiler()
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=1),
                 on_trace_ready=profiler.trace_handler) as p:
        for epoch in range(config["epochs"]):
            loss = model(torch.randn(16, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            p.step()
            sgd.report(epoch=epoch, **profiler.get_and_clear_profile_traces())
    sgd.report(epoch=config["epochs"], **profiler.get_and_clear_profile_traces())  # the block's end takes one
    return sorted(p.name for p in profiler.trace_dir.iterdir())  # sent files are removed


def test_traces_from_every_worker_reach_tensorboard_folder(ray_cluster):
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainer.start()
    callback = TorchTensorboardProfilerCallback()
    try:
        left_behind = trainer.run(profiled_training, config={"epochs": 2}, callbacks=[callback])
        run_dir = trainer.latest_run_dir
    finally:
        trainer.shutdown()
    assert left_behind == [[], []]
    assert callback.trace_dir == run_dir / "pytorch_profiler"
    names = sorted(p.name for p in callback.trace_dir.iterdir())
    assert names == [f"worker_{rank}.{n}.pt.trace.json" for rank in (0, 1) for n in (1, 2, 3)]
    assert sorted(p.name for p in callback.written) == names
    for name in names:
        match = PLUGIN_PATTERN.match(name)
        assert match and match.group(1) in ("worker_0", "worker_1")
        trace = json.loads((callback.trace_dir / name).read_text())
        ops = {e.get("name") for e in trace["traceEvents"]}
        if name.endswith(".3.pt.trace.json"):
            continue  # taken when the block ended: no training step in it
        assert "aten::addmm" in ops or "aten::linear" in ops, sorted(o for o in ops if o)[:20]
        assert any("Optimizer.step" in (o or "") for o in ops)


def test_traces_load_in_tensorboard_profiler_plugin(ray_cluster, tmp_path):
    """Through the plugin's own parser, when torch-tb-profiler is installed."""
    data = pytest.importorskip("torch_tb_profiler.profiler.data")
    trainer = sgd.Trainer(backend="torch", num_workers=1)
    trainer.start()
    callback = TorchTensorboardProfilerCallback(logdir=tmp_path / "tb", workers_to_log=0)
    try:
        trainer.run(profiled_training, config={"epochs": 1}, callbacks=[callback])
    finally:
        trainer.shutdown()
    path = callback.written[0]
    assert len(callback.written) == 2 and path.parent == tmp_path / "tb" / "pytorch_profiler"
    profile = data.RunProfileData.parse("worker_0", 1, str(path), str(tmp_path / "cache"))
    assert profile.worker == "worker_0" and profile.events


def test_callback_errors():
    with pytest.raises(ValueError, match="workers_to_log"):
        TorchTensorboardProfilerCallback(workers_to_log=-1)
    with pytest.raises(TypeError, match=r"logdir=.*takes a path"):
        TorchTensorboardProfilerCallback(logdir=1)
    with pytest.raises(RuntimeError, match="before start_training"):
        TorchTensorboardProfilerCallback().handle_result([{}])


def test_trace_names_cannot_leave_the_folder(tmp_path):
    cb = TorchTensorboardProfilerCallback()
    cb.start_training(logdir=str(tmp_path), config={})
    cb.handle_result([{"_pytorch_profiler_trace": [("../../evil.pt.trace.json", "{}")]}])
    assert [p.name for p in cb.written] == ["evil.pt.trace.json"]
    assert cb.written[0].parent == tmp_path / "pytorch_profiler"
    with pytest.raises(ValueError, match="is not a file name"):
        cb.handle_result([{"_pytorch_profiler_trace": [("..", "{}")]}])
