"""The AIR-style layer: DataParallelTrainer(...).fit() -> Result, directory checkpoints, restore."""

import json
import os
import tempfile
import textwrap
from pathlib import Path

import pytest
import ray

import sgd
from sgd import CheckpointConfig, DataParallelTrainer, FailureConfig, RunConfig, ScalingConfig
from sgd_testing import KillWorker, sigkill_when


def counting_loop(config):
    """Reports epochs; rank 0 passes a directory checkpoint per epoch (every rank with
    ``all_ranks``, which makes every rank wait for the driver); resumes from get_checkpoint()."""
    start = 0
    checkpoint = sgd.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            start = json.loads(Path(d, "state.json").read_text())["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        loss = config.get("losses", {}).get(epoch, 10.0 - epoch)
        with tempfile.TemporaryDirectory() as d:  # deleted right after report: content must be taken
            ckpt = None
            if config.get("all_ranks"):
                Path(d, f"rank_{sgd.world_rank()}").write_text("x")
                ckpt = sgd.Checkpoint.from_directory(d)
            if sgd.world_rank() == 0:
                Path(d, "state.json").write_text(json.dumps({"epoch": epoch}))
                Path(d, "sub").mkdir()
                Path(d, "sub", "weights.bin").write_bytes(bytes([epoch]) * 1000)
                ckpt = sgd.Checkpoint.from_directory(d)
            sgd.report({"epoch": epoch, "loss": loss, "pid": os.getpid(), "start": start}, checkpoint=ckpt)
    return start


def test_fit_returns_result_with_directory_checkpoints(ray_cluster, tmp_path):
    trainer = DataParallelTrainer(
        counting_loop,
        train_loop_config={"epochs": 4, "losses": {0: 3.0, 1: 1.0, 2: 2.0, 3: 5.0}},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="exp", storage_path=str(tmp_path),
                             checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
                                                                checkpoint_score_order="min")),
    )
    result = trainer.fit()
    assert result.error is None
    assert Path(result.path) == tmp_path / "exp"  # Ray 2.60's layout: storage_path/name
    df = result.metrics_dataframe
    assert result.metrics["epoch"] == 3 and df["_training_iteration"].iloc[-1] == 4
    assert not {"_training_iteration", "training_iteration", "done", "config"} & set(result.metrics)
    assert list(df["epoch"]) == [0, 1, 2, 3]
    # Kept: the two lowest losses (epochs 1 and 2) and the latest (epoch 3), in Ray's order:
    # by score, the worst first (losses 5, 2, 1).
    kept = [m["epoch"] for _, m in result.best_checkpoints]
    assert kept == [3, 2, 1]
    with result.checkpoint.as_directory() as d:
        assert json.loads(Path(d, "state.json").read_text()) == {"epoch": 3}
        assert Path(d, "sub", "weights.bin").read_bytes() == bytes([3]) * 1000
    assert sorted(p.name for p in Path(result.path, "checkpoints").iterdir()) == [
        "checkpoint_000002", "checkpoint_000003", "checkpoint_000004"]
    # The reports reached results.jsonl without the checkpoint payload.
    assert all("_sgd_checkpoint" not in row for row in df.to_dict("records"))

    # resume_from_checkpoint: a new run's loop starts after the checkpoint's epoch.
    again = DataParallelTrainer(counting_loop, train_loop_config={"epochs": 6},
                                scaling_config=ScalingConfig(num_workers=2),
                                run_config=RunConfig(name="exp_2", storage_path=str(tmp_path)),
                                resume_from_checkpoint=result.checkpoint).fit()
    assert again.error is None
    assert list(again.metrics_dataframe["epoch"]) == [4, 5]
    assert Path(again.path) == tmp_path / "exp_2"


def test_context_experiment_name_is_the_run_configs(ray_cluster, tmp_path):
    def loop():
        ctx = sgd.get_context()
        sgd.report({"experiment": ctx.get_experiment_name(), "trial_dir": ctx.get_trial_dir()})

    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(name="my-exp", storage_path=str(tmp_path))).fit()
    assert result.metrics["experiment"] == "my-exp"
    assert result.metrics["trial_dir"] == str(result.path)


def test_dict_checkpoint_and_get_checkpoint_round_trip(ray_cluster, tmp_path):
    def loop():
        ckpt = sgd.get_checkpoint()
        n = ckpt.to_dict()["n"] if ckpt else 0
        sgd.report({"n": n + 1}, checkpoint=sgd.Checkpoint.from_dict({"n": n + 1}))
        assert sgd.get_checkpoint().to_dict() == {"n": n + 1}  # the one just reported

    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.error is None and result.metrics["n"] == 1
    assert result.checkpoint.to_dict() == {"n": 1}
    second = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(storage_path=str(tmp_path)),
                                 resume_from_checkpoint=result.checkpoint).fit()
    assert second.error is None and second.metrics["n"] == 2


def test_sharded_checkpoint_merges_every_rank(ray_cluster, tmp_path):
    def loop():
        with tempfile.TemporaryDirectory() as d:
            Path(d, f"shard_{sgd.world_rank()}.txt").write_text(str(sgd.world_rank()))
            sgd.report({"x": 1}, checkpoint=sgd.Checkpoint.from_directory(d))

    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert result.error is None
    with result.checkpoint.as_directory() as d:
        assert sorted(p.name for p in Path(d).iterdir() if not p.name.startswith(".")) == [
            "shard_0.txt", "shard_1.txt"]


class ValueBoom(ValueError):
    pass


def test_failing_loop_raises_with_the_result_attached(ray_cluster, tmp_path):
    def loop():
        sgd.report({"step": 1})
        if sgd.world_rank() == 1:
            raise ValueBoom("bad batch on rank 1")
        sgd.report({"step": 2})

    with pytest.raises(ValueBoom, match="bad batch on rank 1") as info:  # also a sgd.WorkerGroupError
        DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(storage_path=str(tmp_path))).fit()
    assert isinstance(info.value, sgd.WorkerGroupError)
    assert isinstance(info.value.worker_failures[1], ValueBoom)
    result = info.value.result
    assert result.error is info.value
    # Rank 0's last report exactly (Ray 2.60's Result.metrics); sgd's fields are in the dataframe.
    assert result.metrics == {"step": 1}
    assert result.metrics_dataframe.to_dict("records")[-1]["step"] == 1
    assert result.metrics["step"] == 1
    assert json.loads(Path(result.path, "status.json").read_text())["status"] == "ERRORED"


def test_worker_killed_with_max_failures_finishes_without_duplicate_rows(ray_cluster, tmp_path):
    killer = KillWorker(at=1)
    result = DataParallelTrainer(
        counting_loop, train_loop_config={"epochs": 5, "all_ranks": True},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), callbacks=[killer],
                             failure_config=FailureConfig(max_failures=1)),
    ).fit()
    assert killer.killed
    assert result.error is None, result.error
    df = result.metrics_dataframe
    assert list(df["epoch"]) == [0, 1, 2, 3, 4]
    assert list(df["_training_iteration"]) == [1, 2, 3, 4, 5]
    assert df["start"].iloc[-1] >= 1  # the restarted loop resumed from a checkpoint


def test_worker_killed_without_retries_is_an_error(ray_cluster, tmp_path):
    with pytest.raises(sgd.WorkerGroupError, match="max_retries=0") as info:
        DataParallelTrainer(
            counting_loop, train_loop_config={"epochs": 5, "all_ranks": True},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=str(tmp_path), callbacks=[KillWorker(at=1)]),
        ).fit()
    assert isinstance(info.value.worker_failures[1], sgd.WorkerDiedError)


def test_datasets_are_sharded(ray_cluster, tmp_path):
    def loop():
        rows = [r["id"] for r in sgd.get_dataset_shard("train").iter_rows()]
        sgd.report({"rows": rows})

    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(storage_path=str(tmp_path)),
                                 datasets={"train": ray.data.range(10)}).fit()
    assert result.error is None
    lines = [json.loads(x) for x in Path(result.path, "results.jsonl").read_text().splitlines()]
    assert sorted(lines[0][0]["rows"] + lines[0][1]["rows"]) == list(range(10))


RESTORE_LOOP = '''
import json, tempfile, threading
from pathlib import Path
import sgd

def restore_loop(config):
    step = 0
    ckpt = sgd.get_checkpoint()
    if ckpt is not None:
        step = ckpt.to_dict()["step"]
    while step < config["steps"]:
        if step == config.get("block_at"):
            threading.Event().wait()  # hangs here until the driver is killed
        step += 1
        sgd.report({"step": step}, checkpoint=sgd.Checkpoint.from_dict({"step": step}))
'''


def test_restore_continues_a_run_whose_driver_died(ray_cluster, tmp_path):
    address = ray.get_runtime_context().gcs_address
    script = RESTORE_LOOP + textwrap.dedent(f"""
        import ray
        ray.init(address={address!r})
        from sgd import DataParallelTrainer, RunConfig, ScalingConfig
        DataParallelTrainer(restore_loop, train_loop_config={{"steps": 6, "block_at": 3}},
                            scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name="exp", storage_path={str(tmp_path)!r})).fit()
    """)
    run_dir = tmp_path / "exp"
    sigkill_when(script, lambda: (run_dir / "checkpoints" / "checkpoint_000003").is_dir(),
                 message="the driver never wrote checkpoint 3")

    assert DataParallelTrainer.can_restore(run_dir)
    with pytest.raises(TypeError, match="unexpected argument 'bogus'"):
        DataParallelTrainer.restore(run_dir, bogus=1)
    # The training function is kept only pickled: reading it back needs the caller's word.
    with pytest.raises(sgd.UntrustedCheckpointError, match=r"train_loop_per_worker is kept only pickled.*"
                       r"restore\(path, train_loop_per_worker=\.\.\.\).*trusted=True"):
        DataParallelTrainer.restore(run_dir)
    # The saved train_loop_config would block again: replace it.
    result = DataParallelTrainer.restore(run_dir, train_loop_config={"steps": 6}, trusted=True).fit()
    assert result.error is None
    assert Path(result.path) == run_dir
    assert list(result.metrics_dataframe["step"]) == [1, 2, 3, 4, 5, 6]
    assert result.checkpoint.to_dict() == {"step": 6}


def _saved_run(tmp_path, **kwargs):
    """A finished two-step run of ``counting_loop`` whose trainer is saved for restore()."""
    result = DataParallelTrainer(counting_loop, train_loop_config={"epochs": 2},
                                 scaling_config=ScalingConfig(num_workers=1),
                                 run_config=RunConfig(name="saved", storage_path=str(tmp_path), **kwargs)).fit()
    assert result.error is None
    return Path(result.path)


class _Planted:
    """Unpickling it writes a file: the proof that a crafted pickle ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


def test_restore_reads_settings_from_json_and_never_a_planted_pickle(ray_cluster, tmp_path):
    import ray.cloudpickle as cloudpickle

    run_dir = _saved_run(tmp_path, failure_config=FailureConfig(max_failures=2))
    marker = tmp_path / "planted_ran"
    (run_dir / "air_trainer.pkl").write_bytes(cloudpickle.dumps({"train_loop_per_worker": cloudpickle.dumps(
        _Planted(marker))}))

    with pytest.raises(sgd.UntrustedCheckpointError, match="train_loop_per_worker"):
        DataParallelTrainer.restore(run_dir)
    restored = DataParallelTrainer.restore(run_dir, train_loop_per_worker=counting_loop,
                                           train_loop_config={"epochs": 3})
    assert not marker.exists()
    assert restored.scaling_config == ScalingConfig(num_workers=1)
    assert restored.run_config.failure_config == FailureConfig(max_failures=2)
    assert restored.run_config.name == "saved" and restored.run_config.storage_path == str(tmp_path)
    DataParallelTrainer.restore(run_dir, trusted=True)  # the caller's word: the file is read
    assert marker.read_text() == "ran"
    marker.unlink()

    result = restored.fit()
    assert result.error is None and list(result.metrics_dataframe["epoch"]) == [0, 1, 2]
    assert not marker.exists()


def test_restore_builds_only_the_config_types_sgd_writes(ray_cluster, tmp_path):
    run_dir = _saved_run(tmp_path)
    state_file = run_dir / "air_trainer.json"
    document = json.loads(state_file.read_text())
    document["state"]["scaling_config"]["type"] = "subprocess.Popen"
    state_file.write_text(json.dumps(document))
    with pytest.raises(ValueError, match="'subprocess.Popen' is not a config type sgd-core writes"):
        DataParallelTrainer.restore(run_dir, train_loop_per_worker=counting_loop)

    document["class"] = "os.system"
    state_file.write_text(json.dumps(document))
    with pytest.raises(TypeError, match="written by os.system"):
        DataParallelTrainer.restore(run_dir, train_loop_per_worker=counting_loop)


def test_restore_names_callbacks_kept_only_pickled(ray_cluster, tmp_path):
    run_dir = _saved_run(tmp_path, callbacks=[sgd.TrainingCallback()])
    with pytest.raises(sgd.UntrustedCheckpointError,
                       match=r"run_config\.callbacks\[0\], train_loop_per_worker are kept only pickled.*"
                       r"run_config=\.\.\., train_loop_per_worker=\.\.\."):
        DataParallelTrainer.restore(run_dir)
    restored = DataParallelTrainer.restore(run_dir, train_loop_per_worker=counting_loop,
                                           run_config=RunConfig(name="saved", storage_path=str(tmp_path)))
    assert restored.run_config.callbacks is None


def test_restore_rejects_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an sgd run directory"):
        DataParallelTrainer.restore(tmp_path)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: ScalingConfig(num_workers=-1), ValueError, "num_workers"),
        (lambda: ScalingConfig(use_gpu=False, resources_per_worker={"GPU": 1}), ValueError, "GPU"),
        (lambda: ScalingConfig(placement_strategy="RANDOM"), ValueError, "PACK"),
        (lambda: CheckpointConfig(num_to_keep=0), ValueError, "num_to_keep"),
        (lambda: CheckpointConfig(checkpoint_score_order="up"), ValueError, "max' or 'min"),
        (lambda: FailureConfig(max_failures=-2), ValueError, "max_failures"),
        (lambda: RunConfig(name="a/b"), ValueError, "plain folder name"),
        (lambda: RunConfig(callbacks=[print]), TypeError, "TrainingCallback"),
        (lambda: DataParallelTrainer(lambda a, b: None), ValueError, "none or one"),
        (lambda: DataParallelTrainer(lambda: None, scaling_config={"num_workers": 2}), TypeError, "ScalingConfig"),
        (lambda: DataParallelTrainer(lambda: None, datasets=[1]), TypeError, "datasets"),
        (lambda: DataParallelTrainer(lambda: None, resume_from_checkpoint=3), TypeError, "resume_from_checkpoint"),
    ],
)
def test_bad_configs_raise_clear_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_report_rejects_a_checkpoint_that_is_not_one(ray_cluster, tmp_path):
    def loop():
        sgd.report({"x": 1}, checkpoint="/tmp/some/dir")

    with pytest.raises(TypeError, match="takes an sgd.Checkpoint"):
        DataParallelTrainer(loop, run_config=RunConfig(storage_path=str(tmp_path))).fit()


def test_save_checkpoint_works_in_an_air_loop(ray_cluster, tmp_path):
    def loop():
        state = sgd.load_checkpoint() or {"n": 0}
        for n in range(state["n"] + 1, state["n"] + 4):
            sgd.report({"n": n})
            sgd.save_checkpoint(n=n)

    result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(storage_path=str(tmp_path),
                                                      checkpoint_config=CheckpointConfig(num_to_keep=2))).fit()
    assert result.error is None, result.error
    assert result.checkpoint.to_dict() == {"n": 3}
    # Ranked by recency: the last two are kept, each with the report it followed.
    assert [(c.to_dict()["n"], m["n"]) for c, m in result.best_checkpoints] == [(2, 2), (3, 3)]
