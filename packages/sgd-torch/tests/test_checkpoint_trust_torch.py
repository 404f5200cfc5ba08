"""Torch checkpoints load with torch.load(weights_only=True): a crafted state.pt runs nothing
unless the caller trusts it (issue 17); a full disk under torch.save is "the disk is full"."""

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import sgd
from sgd.checkpoint import METADATA_FILE, UntrustedCheckpointError, write_dict_dir


class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def _plant(checkpoint: Path, marker: Path) -> None:
    from sgd.checkpoint.integrity import file_digest

    meta = json.loads((checkpoint / METADATA_FILE).read_text())
    state_file = checkpoint / meta["state_file"]
    torch.save({"w": torch.ones(2), "x": _Evil(marker)}, state_file)
    meta["files"][meta["state_file"]] = file_digest(state_file)
    (checkpoint / METADATA_FILE).write_text(json.dumps(meta))


def test_state_dicts_and_numpy_load_without_the_opt_in(tmp_path, monkeypatch):
    monkeypatch.delenv("SGD_TRUST_CHECKPOINTS", raising=False)
    model = torch.nn.Linear(3, 2)
    state = {"model": model.state_dict(), "opt": torch.optim.SGD(model.parameters(), lr=0.1).state_dict(),
             "epoch": 3, "rng": np.random.default_rng(0).random(4), "np_scalar": np.float32(1.5)}
    write_dict_dir(state, tmp_path / "c", "torch")
    meta = json.loads((tmp_path / "c" / METADATA_FILE).read_text())
    assert meta["codec"] == "torch" and "needs_trust" not in meta
    back = sgd.Trainer.load_checkpoint_from_path(tmp_path / "c")
    assert torch.equal(back["model"]["weight"], model.weight.detach())
    assert (back["rng"] == state["rng"]).all() and back["epoch"] == 3 and back["np_scalar"] == 1.5


def test_malicious_state_pt_runs_nothing_without_the_opt_in(tmp_path, monkeypatch, trainer):
    monkeypatch.delenv("SGD_TRUST_CHECKPOINTS", raising=False)
    marker = tmp_path / "pwned"
    checkpoint = tmp_path / "c"
    write_dict_dir({"w": torch.zeros(2)}, checkpoint, "torch")
    _plant(checkpoint, marker)
    with pytest.raises(UntrustedCheckpointError) as info:
        sgd.Trainer.load_checkpoint_from_path(checkpoint)
    assert str(checkpoint) in str(info.value) and "os.makedirs" in str(info.value)
    assert "trusted=True" in str(info.value)
    with pytest.raises(UntrustedCheckpointError):
        trainer.run(lambda: sgd.load_checkpoint(), checkpoint=checkpoint)
    with pytest.raises(UntrustedCheckpointError):
        trainer.run(lambda: sgd.load_checkpoint(), checkpoint=sgd.Checkpoint.from_directory(checkpoint))
    assert not marker.exists()
    sgd.Trainer.load_checkpoint_from_path(checkpoint, trusted=True)
    assert marker.is_dir()


def test_a_whole_module_needs_the_opt_in(tmp_path, monkeypatch):
    monkeypatch.delenv("SGD_TRUST_CHECKPOINTS", raising=False)
    write_dict_dir({"model": torch.nn.Linear(2, 2)}, tmp_path / "c", "torch")
    meta = json.loads((tmp_path / "c" / METADATA_FILE).read_text())
    assert meta["needs_trust"] == ["torch.nn.modules.linear.Linear"]
    with pytest.raises(UntrustedCheckpointError, match="torch.nn.modules.linear.Linear"):
        sgd.Trainer.load_checkpoint_from_path(tmp_path / "c")
    assert isinstance(sgd.Trainer.load_checkpoint_from_path(tmp_path / "c", trusted=True)["model"], torch.nn.Linear)


def test_v1_restore_refuses_a_malicious_file(tmp_path, monkeypatch):
    from sgd_torch import codec

    monkeypatch.delenv("SGD_TRUST_CHECKPOINTS", raising=False)
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save({"models": [{}], "x": _Evil(marker)}, buf)
    buf.seek(0)
    with pytest.raises(UntrustedCheckpointError, match="SGD_TRUST_CHECKPOINTS"):
        codec.load(buf, where="trainer.pt")
    assert not marker.exists()
    from sgd_torch.v1.trainer import _load_state_file

    (tmp_path / "trainer.pt").write_bytes(buf.getvalue())
    with pytest.raises(UntrustedCheckpointError, match="trainer.pt"):
        _load_state_file(tmp_path / "trainer.pt")
    assert not marker.exists()


def _big_checkpoints(config):
    sgd.save_checkpoint(w=torch.zeros(10))
    sgd.save_checkpoint(w=torch.zeros(4_000_000))  # 16 MB into 6 MiB
    return "unreachable"


def test_torch_save_on_a_full_disk_says_the_disk_is_full(trainer, small_disk):
    """torch.save reports a full disk as "unexpected pos N vs M"; rank 0 writes it directly."""
    small = sgd.Trainer(backend="torch", num_workers=1, logdir=small_disk / "runs", max_retries=0)
    small.start()
    try:
        with pytest.raises(OSError, match="the disk is full") as info:
            small.run(_big_checkpoints)
        assert str(small_disk) in str(info.value)
        checkpoints = small.latest_run_dir / "checkpoints"
        assert [p.name for p in checkpoints.iterdir() if not p.name.startswith(".")] == ["checkpoint_000001"]
        assert torch.equal(sgd.Trainer.load_checkpoint_from_path(checkpoints / "checkpoint_000001")["w"],
                           torch.zeros(10))
    finally:
        small.shutdown()
