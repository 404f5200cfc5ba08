"""Sharded checkpoints (torch.distributed.checkpoint): every worker writes its shard into the
run's checkpoint folder, the driver commits it atomically, a run restores it after a failure,
and it loads into another number of workers, with or without FSDP. Nothing in it runs code."""

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

import sgd
from sgd.checkpoint import METADATA_FILE
from sgd.checkpoint.integrity import file_digest


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x[:, :4] * 2


def _train(config):
    """Train ``steps`` steps, a sharded checkpoint after each; resume from the one the run
    starts from. Returns where it started and (rank 0) the whole final state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from sgd_torch import load_sharded_checkpoint, prepare_model, save_sharded_checkpoint

    if config.get("die_while_writing"):
        _die_while_writing(config["die_while_writing"], config["marker"])
    model = prepare_model(_mlp(), parallel_strategy=config.get("strategy", "fsdp"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loaded = load_sharded_checkpoint({"model": model, "opt": opt})
    start = loaded["step"] if loaded else 0
    rank = sgd.world_rank()
    for step in range(start + 1, config["steps"] + 1):
        die = config.get("die_once_at")
        if die == step and rank == 1 and not os.path.exists(config["marker"]):
            Path(config["marker"]).touch()
            os._exit(1)
        opt.zero_grad()
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sgd.report(step=step, loss=loss.item())
        save_sharded_checkpoint({"model": model, "opt": opt}, blocking=config.get("blocking", True),
                                step=step, loss=round(loss.item(), 6))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"start": start, "metadata": loaded, "full": full if rank == 0 else None}


def _die_while_writing(step, marker):
    """Rank 1 dies inside the background part of the asynchronous save of ``step`` (its shard
    written, not yet hashed or committed), once: the forced case of a worker lost mid-write."""
    import sgd_torch.sharded as sharded

    finish = sharded._finish

    def dying(local, tmp, rank, metadata, *rest):
        if rank == 1 and metadata["step"] == step and not os.path.exists(marker):
            Path(marker).touch()
            os._exit(1)
        return finish(local, tmp, rank, metadata, *rest)

    sharded._finish = dying


def _load_only(config):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from sgd_torch import load_sharded_checkpoint, prepare_model

    model = prepare_model(_mlp(), parallel_strategy=config.get("strategy"))
    metadata = load_sharded_checkpoint({"model": model})
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"metadata": metadata, "full": full if sgd.world_rank() == 0 else None}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 2-worker FSDP2 run of 3 steps keeping the 2 newest sharded checkpoints."""
    import sgd_testing.fixtures as f

    f._start_local_ray()
    trainer = sgd.Trainer(backend="torch", num_workers=2, logdir=tmp_path_factory.mktemp("sharded"))
    trainer.start()
    try:
        out = trainer.run(_train, config={"steps": 3}, checkpoint_strategy=sgd.CheckpointStrategy(num_to_keep=2))
        return trainer.latest_run_dir, trainer.latest_checkpoint, out[0]["full"]
    finally:
        trainer.shutdown()


def test_every_worker_writes_its_shard_and_the_driver_commits_it(saved):
    run_dir, latest, _ = saved
    assert latest["step"] == 3 and set(latest) == {"step", "loss"}  # the metadata, nothing else
    folder = run_dir / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint_000002", "checkpoint_000003"]  # top 2 kept
    newest = folder / "checkpoint_000003"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= {p.name for p in newest.iterdir()}
    meta = json.loads((newest / METADATA_FILE).read_text())
    assert meta["format"] == "sharded" and meta["metadata"]["step"] == 3
    assert set(meta["files"]) == {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    assert meta["files"]["__1_0.distcp"] == file_digest(newest / "__1_0.distcp")  # hashed by rank 1


@pytest.mark.parametrize("num_workers,strategy", [(1, None), (3, "fsdp")], ids=["1-plain", "3-fsdp"])
def test_loads_into_another_number_of_workers(saved, num_workers, strategy):
    run_dir, _, full = saved
    trainer = sgd.Trainer(backend="torch", num_workers=num_workers)
    trainer.start()
    try:
        out = trainer.run(_load_only, config={"strategy": strategy},
                          checkpoint=run_dir / "checkpoints" / "checkpoint_000003")
    finally:
        trainer.shutdown()
    assert out[0]["metadata"]["step"] == 3
    assert _same(out[0]["full"], full)


def test_a_failure_resumes_from_the_latest_committed_shards(ray_cluster, tmp_path, saved):
    _, _, expected = saved  # the same 3 steps without a failure
    trainer = sgd.Trainer(backend="torch", num_workers=2, max_retries=1, logdir=tmp_path / "runs")
    trainer.start()
    try:
        out = trainer.run(_train, config={"steps": 3, "die_once_at": 3, "marker": str(tmp_path / "died")})
    finally:
        trainer.shutdown()
    assert (tmp_path / "died").exists()
    assert out[0]["start"] == 2 and out[0]["metadata"]["step"] == 2  # restored from step 2's shards
    assert _same(out[0]["full"], expected)
    assert trainer.latest_checkpoint["step"] == 3
    assert not list((trainer.latest_run_dir / "checkpoints").glob(".tmp_*"))


def _wrong_shapes(config):
    from sgd_torch import load_sharded_checkpoint

    torch.manual_seed(0)
    load_sharded_checkpoint({"model": torch.nn.Sequential(torch.nn.Linear(8, 16))})


def _whole_state_loader(config):
    return sgd.load_checkpoint()


def _sharded_loader(config):
    from sgd_torch import load_sharded_checkpoint

    load_sharded_checkpoint({"model": _mlp()})


def _plain_values(config):
    from sgd_torch import save_sharded_checkpoint

    save_sharded_checkpoint({"model": _mlp(), "epoch": 3})


def test_bad_input_gets_errors_that_say_what_to_do(saved, ray_cluster):
    run_dir, _, _ = saved
    path = run_dir / "checkpoints" / "checkpoint_000003"
    trainer = sgd.Trainer(backend="torch", num_workers=1)
    trainer.start()
    try:
        with pytest.raises(ValueError, match=r"'model.0.weight' has shape \(32, 8\) in the checkpoint and \(16, 8\)"):
            trainer.run(_wrong_shapes, checkpoint=path)
        with pytest.raises(ValueError, match=r"sharded checkpoint.*sgd_torch.load_sharded_checkpoint"):
            trainer.run(_whole_state_loader, checkpoint=path)
        with pytest.raises(ValueError, match=r"whole-state checkpoint.*sgd.load_checkpoint\(\)"):
            trainer.run(_sharded_loader, checkpoint={"model": _mlp().state_dict()})
        with pytest.raises(TypeError, match=r"state\['epoch'\] is a int.*metadata"):
            trainer.run(_plain_values)
    finally:
        trainer.shutdown()


def test_a_missing_shard_is_never_restored(saved, tmp_path):
    run_dir, _, _ = saved
    copy = tmp_path / "checkpoint_000003"
    shutil.copytree(run_dir / "checkpoints" / "checkpoint_000003", copy)
    (copy / "__1_0.distcp").unlink()
    with pytest.raises(sgd.CheckpointIntegrityError, match=r"'__1_0.distcp' is missing"):
        sgd.Checkpoint.from_directory(copy).to_dict()


class _Payload:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_a_crafted_dcp_metadata_file_runs_no_code(saved, tmp_path):
    from sgd_torch.sharded import SafeFileSystemReader

    run_dir, _, _ = saved
    copy = tmp_path / "checkpoint_000003"
    shutil.copytree(run_dir / "checkpoints" / "checkpoint_000003", copy)
    pwned = tmp_path / "pwned"
    (copy / ".metadata").write_bytes(pickle.dumps(_Payload(pwned)))
    # Whoever crafted it also fixed sgd's digest: the unpickler is what stops it.
    meta = json.loads((copy / METADATA_FILE).read_text())
    meta["files"][".metadata"] = file_digest(copy / ".metadata")
    (copy / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(sgd.UntrustedCheckpointError, match=r"names posix.system"):
        SafeFileSystemReader(str(copy)).read_metadata()
    assert not pwned.exists()
    # The genuine file reads.
    assert SafeFileSystemReader(str(run_dir / "checkpoints" / "checkpoint_000003")).read_metadata().state_dict_metadata


def test_asynchronous_saves_commit_every_checkpoint_in_order(saved, ray_cluster, tmp_path):
    """blocking=False: the same training, every checkpoint committed by the end of the run,
    each as it would be written blocking."""
    _, _, expected = saved
    trainer = sgd.Trainer(backend="torch", num_workers=2, logdir=tmp_path / "runs")
    trainer.start()
    try:
        out = trainer.run(_train, config={"steps": 3, "blocking": False})
        folder = trainer.latest_run_dir / "checkpoints"
        assert sorted(p.name for p in folder.iterdir()) == [f"checkpoint_00000{i}" for i in (1, 2, 3)]
        assert trainer.latest_checkpoint["step"] == 3
        assert _same(out[0]["full"], expected)
        again = trainer.run(_load_only, config={"strategy": "fsdp"}, checkpoint=folder / "checkpoint_000003")
        assert again[0]["metadata"]["step"] == 3 and _same(again[0]["full"], expected)
    finally:
        trainer.shutdown()


def test_a_worker_lost_mid_write_leaves_the_previous_checkpoint_as_latest(saved, ray_cluster, tmp_path):
    _, _, expected = saved
    trainer = sgd.Trainer(backend="torch", num_workers=2, max_retries=1, logdir=tmp_path / "runs")
    trainer.start()
    try:
        out = trainer.run(_train, config={"steps": 3, "blocking": False, "die_while_writing": 2,
                                          "marker": str(tmp_path / "died")})
    finally:
        trainer.shutdown()
    assert (tmp_path / "died").exists()
    assert out[0]["start"] == 1  # step 2's checkpoint was never committed: resumed from step 1
    assert _same(out[0]["full"], expected)
    folder = trainer.latest_run_dir / "checkpoints"
    assert not list(folder.glob(".tmp_*"))
    assert trainer.latest_checkpoint["step"] == 3


def _gpu_fsdp(config):
    import torch.distributed as dist

    from sgd_torch import get_device, load_sharded_checkpoint, prepare_model, save_sharded_checkpoint

    model = prepare_model(_mlp(), parallel_strategy="fsdp")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loaded = load_sharded_checkpoint({"model": model, "opt": opt})
    x, y = (t.to(get_device()) for t in _batch(1, sgd.world_rank()))
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    save_sharded_checkpoint({"model": model, "opt": opt}, blocking=config["blocking"], step=1)
    return dist.get_backend(), next(model.parameters()).device.type, loaded


@pytest.mark.gpu
def test_fsdp2_over_nccl_saves_and_loads_sharded(ray_cluster, tmp_path):
    n = torch.cuda.device_count()
    trainer = sgd.Trainer(backend="torch", num_workers=min(2, n), use_gpu=True, logdir=tmp_path)
    trainer.start()
    try:
        first = trainer.run(_gpu_fsdp, config={"blocking": False})
        assert first[0][:2] == ("nccl", "cuda") and first[0][2] is None
        assert trainer.latest_checkpoint == {"step": 1}
        again = trainer.run(_gpu_fsdp, config={"blocking": True}, checkpoint=trainer.best_checkpoint_path)
        assert again[0][2] == {"step": 1}
    finally:
        trainer.shutdown()


def test_a_stager_that_closes_itself_after_staging_is_not_reused(monkeypatch):
    """torch 2.11's DefaultStager closes itself at the end of each staging (pytorch#183413):
    reused, the second asynchronous save failed with ``KeyError: <class 'type'>`` (seen on an
    H100). Such a torch is found out by a probe, and each save then stages afresh."""
    from torch.distributed.checkpoint.staging import DefaultStager

    from sgd_torch import sharded

    real_stage = DefaultStager.stage

    def stage_then_close(self, state_dict, **kwargs):  # what torch 2.11's _stage ends with
        staged = real_stage(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return staged

    monkeypatch.setattr(sharded, "_REUSABLE", [])
    monkeypatch.setattr(DefaultStager, "stage", stage_then_close)
    assert sharded._stager_reusable() is False

    class _Session:
        pass

    assert sharded._stager(_Session()) is None
