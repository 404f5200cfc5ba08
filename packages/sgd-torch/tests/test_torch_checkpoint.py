"""``TorchCheckpoint`` (Ray AIR's), the AMP wrapper that pickles, and a ``TorchTrainer``'s result (issue 37)."""

from __future__ import annotations

import io
import pickle
import sys

import pytest
import torch

import sgd
from sgd import CheckpointError, RunConfig, ScalingConfig, UntrustedCheckpointError
from sgd_torch import TorchCheckpoint, TorchTrainer


class CustomLinear(torch.nn.Linear):
    """Ray's test_torch_amp_with_custom_get_state: a model with its own ``__getstate__``."""

    def __getstate__(self):
        return self.__dict__.copy()


def _fit(loop, tmp_path, workers=2, **kwargs):
    return TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=workers),
                        run_config=RunConfig(storage_path=str(tmp_path)), **kwargs).fit()


def test_an_amp_model_pickles_saves_and_runs_after_loading(ray_cluster, tmp_path):
    def loop():
        import sgd_torch

        sgd_torch.accelerate(amp=True)
        model = sgd_torch.prepare_model(torch.nn.Linear(2, 1))  # one worker: no DDP around it
        x = torch.randn(4, 2)
        assert model(x).dtype == torch.bfloat16  # autocast on the CPU
        again = pickle.loads(pickle.dumps(model))
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        for m in (again, loaded):
            assert m(x).dtype == torch.bfloat16 and torch.equal(m.weight, model.weight)

        import ray.cloudpickle  # this test module is not importable on the worker: pickled by value

        custom = sgd_torch.prepare_model(CustomLinear(1, 1))
        ray.cloudpickle.loads(ray.cloudpickle.dumps(custom))
        sgd.report({"ok": 1}, checkpoint=TorchCheckpoint.from_model(model))

    result = _fit(loop, tmp_path, workers=1)
    assert result.error is None, result.error
    assert isinstance(result.checkpoint, TorchCheckpoint)


def test_from_model_and_from_state_dict_through_a_run(ray_cluster, tmp_path):
    def loop():
        import sgd_torch

        sgd_torch.accelerate(amp=True)
        torch.manual_seed(0)
        model = sgd_torch.prepare_model(torch.nn.Linear(3, 1))  # DDP on two workers
        sgd.report({"kind": 0}, checkpoint=TorchCheckpoint.from_model(model))
        sgd.report({"kind": 1}, checkpoint=TorchCheckpoint.from_state_dict(model.state_dict()))

    result = _fit(loop, tmp_path)
    assert result.error is None, result.error
    whole, state = [c for c, _ in result.best_checkpoints]
    assert isinstance(whole, TorchCheckpoint) and isinstance(state, TorchCheckpoint)

    with pytest.raises(UntrustedCheckpointError, match=r"get_model\(trusted=True\)"):
        whole.get_model()
    model = whole.get_model(trusted=True)
    assert type(model) is torch.nn.Linear  # unwrapped from DDP
    assert "forward" not in model.__dict__  # the autocast wrapper left out
    assert model(torch.randn(2, 3)).dtype == torch.float32

    with pytest.raises(ValueError, match="get_model\\(model=YourModel\\(\\)\\)"):
        state.get_model()
    loaded = state.get_model(model=torch.nn.Linear(3, 1))  # "module." prefixes of DDP removed
    assert torch.equal(loaded.weight, model.weight)
    assert TorchCheckpoint.from_directory(state.path).get_model(torch.nn.Linear(3, 1)) is not None


def test_in_memory_checkpoints_and_directories(tmp_path):
    model = torch.nn.Linear(2, 2)
    assert TorchCheckpoint.from_model(model).get_model() is model  # nothing read from disk
    path = TorchCheckpoint.from_state_dict(model.state_dict()).to_directory(tmp_path / "sd")
    assert torch.equal(TorchCheckpoint.from_directory(path).get_model(torch.nn.Linear(2, 2)).weight, model.weight)

    ray_layout = tmp_path / "ray"  # Ray 2.4+'s TorchCheckpoint directory: model.pt
    ray_layout.mkdir()
    torch.save(model.state_dict(), ray_layout / "model.pt")
    got = TorchCheckpoint.from_directory(ray_layout).get_model(torch.nn.Linear(2, 2))
    assert torch.equal(got.weight, model.weight)
    torch.save(model, ray_layout / "model.pt")
    with pytest.raises(UntrustedCheckpointError):
        TorchCheckpoint.from_directory(ray_layout).get_model()
    assert isinstance(TorchCheckpoint.from_directory(ray_layout, trusted=True).get_model(), torch.nn.Linear)

    with pytest.raises(TypeError, match="from_model"):
        TorchCheckpoint.from_state_dict(model)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        TorchCheckpoint.from_model(model.state_dict())
    with pytest.raises(CheckpointError, match="holds no 'model'"):
        TorchCheckpoint.from_checkpoint(sgd.Checkpoint.from_dict({"w": 1})).get_model()


def test_a_model_class_that_cannot_be_imported_is_a_clear_error(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "gone_model.py").write_text("import torch\nclass GoneNet(torch.nn.Linear):\n    pass\n")
    monkeypatch.syspath_prepend(str(package))
    import gone_model

    path = TorchCheckpoint.from_model(gone_model.GoneNet(1, 1)).to_directory(tmp_path / "ckpt")
    monkeypatch.delitem(sys.modules, "gone_model")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(package)])
    with pytest.raises(CheckpointError, match="cannot be imported here") as info:
        TorchCheckpoint.from_directory(path).get_model(trusted=True)
    assert "gone_model" in str(info.value)
    pickle.loads(pickle.dumps(info.value))


def test_a_torch_trainers_preprocessor_is_in_its_checkpoints(ray_cluster, tmp_path):
    import ray
    from ray.data.preprocessors import MinMaxScaler

    def loop():
        rows = sgd.get_dataset_shard("train").take_all()
        sgd.report({"max": max(r["x"] for r in rows)},
                   checkpoint=TorchCheckpoint.from_state_dict(torch.nn.Linear(1, 1).state_dict()))

    result = _fit(loop, tmp_path, workers=1, datasets={"train": ray.data.from_items([{"x": 2.0}, {"x": 4.0}])},
                  preprocessor=MinMaxScaler(columns=["x"]))
    assert result.error is None, result.error
    assert result.metrics["max"] == 1.0
    kept = result.checkpoint.get_preprocessor()
    assert type(kept) is MinMaxScaler and kept.stats_ == {"min(x)": 2.0, "max(x)": 4.0}
    assert result.checkpoint.get_model(torch.nn.Linear(1, 1)) is not None
