"""Ray AIR 2.x code that runs unchanged (issue 37): every documented ``report`` signature, AIR's
``session`` names, AIR's dataset rules, the loop's return value discarded, ``CheckpointConfig``'s
AIR fields, Ray Tune callbacks in ``RunConfig``, ``best_checkpoints`` in Ray's order, and
preprocessors kept in checkpoints."""

from __future__ import annotations

import os
import pickle

import pytest
import ray

import sgd
from sgd import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    DatasetConfig,
    RunConfig,
    ScalingConfig,
    UntrustedCheckpointError,
    session,
)
from sgd.checkpoint.preprocessor import decode_preprocessor, encode_preprocessor

TWO = ScalingConfig(num_workers=2)


def _fit(loop, tmp_path, **kwargs):
    kwargs.setdefault("scaling_config", TWO)
    kwargs.setdefault("run_config", RunConfig(storage_path=str(tmp_path)))
    return DataParallelTrainer(loop, **kwargs).fit()


# --- report: every signature of Ray 1.x, AIR 2.x and Ray 2.x ------------------------------------


def test_every_report_signature(ray_cluster, tmp_path):
    def loop():
        from ray.train import CheckpointUploadMode

        def ckpt(n):
            return Checkpoint.from_dict({"n": n})

        sgd.report(a=1)                                            # Ray Train 1.x
        sgd.report({"a": 2})                                       # AIR, positional dict
        sgd.report({"a": 3}, checkpoint=ckpt(3))                   # AIR
        sgd.report(metrics={"a": 4}, checkpoint=ckpt(4))           # AIR, keywords
        sgd.report(metrics={"a": 5})                               # AIR, keyword, no checkpoint
        sgd.report({"a": 6}, ckpt(6))                              # Ray 2.x, checkpoint positional
        session.report({"a": 7}, checkpoint=ckpt(7))               # from ray.air import session
        directory = os.path.join(sgd.get_context().get_trial_dir(), f"local_{sgd.world_rank()}")
        Checkpoint.from_dict({"n": 8}).to_directory(directory)
        sgd.report({"a": 8}, checkpoint=Checkpoint.from_directory(directory),
                   checkpoint_upload_mode=CheckpointUploadMode.ASYNC)  # Ray 2.x: ASYNC deletes the local dir
        sgd.get_all_reported_checkpoints()  # waits for the upload, after which the local dir is gone
        assert not os.path.exists(directory)
        sgd.report({"a": 9}, checkpoint=ckpt(9), checkpoint_upload_mode="SYNC",
                   delete_local_checkpoint_after_upload=False)
        sgd.report(checkpoint=10)                                  # Ray 1.x keywords: a metric so named
        sgd.report({"a": 11}, b=11)                                # a dict and keywords together

    result = _fit(loop, tmp_path)
    assert result.error is None, result.error
    df = result.metrics_dataframe
    assert list(df["a"].fillna(0).astype(int)) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 11]
    assert "metrics" not in df.columns
    assert df["checkpoint"].dropna().tolist() == [10]
    # The directory reported with a=8 holds the files Checkpoint.to_directory wrote.
    assert [c.to_dict().get("n", "dir") for c, _ in result.best_checkpoints] == [3, 4, 6, 7, "dir", 9]
    assert [m["a"] for _, m in result.best_checkpoints] == [3, 4, 6, 7, 8, 9]


@pytest.mark.parametrize("call, error, match", [
    (lambda: sgd.report(5), TypeError, "takes the metrics as a dict"),
    (lambda: sgd.report(metrics=5), TypeError, "takes the metrics as a dict"),
    (lambda: sgd.report(metrics=[("loss", 1.0)]), TypeError, "not a list"),
    (lambda: sgd.report({"a": 1}, "/some/dir"), TypeError, "takes an sgd.Checkpoint, got builtins.str"),
    (lambda: sgd.report(metrics={"a": 1}, checkpoint={"w": 1}), TypeError, "takes an sgd.Checkpoint"),
    (lambda: sgd.report({"a": 1}, checkpoint_dir_name="x/y"), ValueError, "checkpoint_dir_name='x/y'.* is a path"),
    (lambda: sgd.report({"a": 1}, validation=True), ValueError, "validation"),
    (lambda: sgd.report({"a": 1}, checkpoint_upload_mode="LATER"), ValueError,
     "checkpoint_upload_mode must be one of CheckpointUploadMode.ASYNC, CheckpointUploadMode.SYNC"),
])
def test_bad_report_calls_are_clear_errors_before_any_session(call, error, match):
    # Checked before the session is looked up: the same error outside a training function.
    with pytest.raises(error, match=match):
        call()


def test_a_non_dict_metrics_fails_the_run_and_reports_nothing(ray_cluster, tmp_path):
    def loop():
        sgd.report(metrics=1.0)

    with pytest.raises(TypeError, match="dict") as info:
        _fit(loop, tmp_path)
    assert isinstance(info.value, sgd.WorkerGroupError) and info.value.result.metrics is None
    pickle.loads(pickle.dumps(info.value))


def test_air_session_names(ray_cluster, tmp_path):
    def loop():
        session.report({"rank": session.get_world_rank(), "local": session.get_local_rank(),
                        "size": session.get_world_size(), "local_size": session.get_local_world_size(),
                        "node": session.get_node_rank(), "experiment": session.get_experiment_name(),
                        "trial_dir": session.get_trial_dir()})

    result = _fit(loop, tmp_path, run_config=RunConfig(name="names", storage_path=str(tmp_path)))
    m = result.metrics
    assert (m["rank"], m["local"], m["size"], m["local_size"], m["node"]) == (0, 0, 2, 2, 0)
    assert m["experiment"] == "names" and m["trial_dir"] == result.path


# --- datasets: AIR's rules ---------------------------------------------------------------


def test_with_an_air_dataset_config_train_is_split_and_the_others_go_whole(ray_cluster, tmp_path):
    def loop():
        sgd.report({"train": sgd.get_dataset_shard("train").count(),
                    "val": session.get_dataset_shard(dataset_name="val").count()})

    # Without dataset_config every dataset is split (Ray 2.60's default, sgd.DataConfig()).
    result = _fit(loop, tmp_path, datasets={"train": ray.data.range(10), "val": ray.data.range(6)},
                  dataset_config={"train": DatasetConfig()})
    assert result.error is None, result.error
    assert (result.metrics["train"], result.metrics["val"]) == (5, 6)


def test_dataset_config_overrides_per_dataset_as_air_merged_it(ray_cluster, tmp_path):
    def loop():
        sgd.report({"train": sgd.get_dataset_shard("train").count(), "val": sgd.get_dataset_shard("val").count()})

    result = _fit(loop, tmp_path, datasets={"train": ray.data.range(10), "val": ray.data.range(6)},
                  dataset_config={"val": DatasetConfig(split=True), "train": DatasetConfig(global_shuffle=True)})
    assert result.error is None, result.error
    assert (result.metrics["train"], result.metrics["val"]) == (5, 3)  # train still split: AIR's merge


def test_a_required_dataset_that_is_missing_is_a_clear_error(ray_cluster, tmp_path):
    with pytest.raises(ValueError, match="'val' is required") as info:
        _fit(lambda: None, tmp_path, datasets={"train": ray.data.range(4)},
             dataset_config={"val": DatasetConfig(required=True)})
    assert isinstance(info.value, sgd.ControllerError)  # the driver's: never retried
    assert info.value.result.path is None  # nothing started, nothing written


def test_the_loop_return_value_is_discarded(ray_cluster, tmp_path):
    class FailOnPickle:
        def __reduce__(self):
            raise RuntimeError("must not be pickled")

    def loop():
        sgd.report({"loss": 1})
        return FailOnPickle()

    result = _fit(loop, tmp_path)
    assert result.error is None, result.error
    assert result.metrics["loss"] == 1


# --- configs ---------------------------------------------------------------------------


def test_checkpoint_frequency_is_accepted_and_refused_at_fit(tmp_path):
    config = CheckpointConfig(checkpoint_frequency=2)
    trainer = DataParallelTrainer(lambda: None, run_config=RunConfig(checkpoint_config=config))
    with pytest.raises(ValueError, match="checkpoint_frequency=2"):
        trainer.fit()
    with pytest.raises(ValueError, match="checkpoint_at_end"):
        DataParallelTrainer(lambda: None, run_config=RunConfig(
            checkpoint_config=CheckpointConfig(checkpoint_at_end=True))).fit()
    with pytest.raises(ValueError, match="int >= 0"):
        CheckpointConfig(checkpoint_frequency=-1)
    assert RunConfig(local_dir=str(tmp_path)).storage_path == str(tmp_path)


def test_tune_callbacks_in_run_config_see_every_result(ray_cluster, tmp_path):
    from ray.tune import Callback

    class Capture(Callback):
        def __init__(self):
            self.events = []

        def on_trial_start(self, iteration, trials, trial, **info):
            self.events.append(("start", trial.trial_id))

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.events.append(("result", result["index"], result["training_iteration"]))

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.events.append(("complete", trial.status))

        def on_experiment_end(self, trials, **info):
            self.events.append(("end", len(trials)))

    def loop():
        for i in range(2):
            sgd.report(dict(index=i), checkpoint=Checkpoint.from_dict({"epoch": i}))

    capture = Capture()
    result = _fit(loop, tmp_path, run_config=RunConfig(storage_path=str(tmp_path), callbacks=[capture]))
    assert result.error is None, result.error
    run = os.path.basename(result.path)
    assert capture.events == [("start", run), ("result", 0, 1), ("result", 1, 2), ("complete", "TERMINATED"),
                              ("end", 1)]
    with pytest.raises(TypeError, match="TrainingCallback or ray.tune.Callback"):
        RunConfig(callbacks=[object()])


def test_best_checkpoints_in_rays_order(ray_cluster, tmp_path):
    def loop():
        for idx, loss in enumerate([float("nan"), 3, 7, 5]):
            sgd.report(dict(loss=loss), checkpoint=Checkpoint.from_dict({"idx": idx}))

    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    result = _fit(loop, tmp_path, run_config=RunConfig(storage_path=str(tmp_path), checkpoint_config=config))
    assert result.checkpoint.to_dict()["idx"] == 3
    assert [(c.to_dict()["idx"], m["loss"]) for c, m in result.best_checkpoints] == [(3, 5), (1, 3)]


# --- preprocessors ----------------------------------------------------------------------


def test_builtin_preprocessors_keep_without_pickle_and_others_need_trust(ray_cluster):
    from ray.data.preprocessors import Chain, OneHotEncoder, StandardScaler

    ds = ray.data.from_items([{"x": float(i), "c": "ab"[i % 2]} for i in range(8)])
    chain = Chain(StandardScaler(columns=["x"]), OneHotEncoder(columns=["c"]))
    chain.fit(ds)
    data = encode_preprocessor(chain)
    assert b"cloudpickle" not in data and b"pickle" not in data
    back = decode_preprocessor(data, trusted=False)
    assert type(back) is Chain
    # Ray Data keeps no row order across blocks unless asked: compare the rows, sorted.
    assert sorted(back.transform(ds).take_all(), key=repr) == sorted(chain.transform(ds).take_all(), key=repr)

    class Mine(StandardScaler):
        pass

    with pytest.raises(UntrustedCheckpointError, match="get_preprocessor\\(trusted=True\\)"):
        decode_preprocessor(encode_preprocessor(Mine(columns=["x"])), trusted=False)
    assert type(decode_preprocessor(encode_preprocessor(Mine(columns=["x"])), trusted=True)).__name__ == "Mine"


def test_preprocessor_fitted_on_train_applied_to_all_and_kept(ray_cluster, tmp_path):
    from ray.data.preprocessors import StandardScaler

    def loop():
        rows = sgd.get_dataset_shard("val").take_all()
        for kind in ("dict", "dir"):
            checkpoint = Checkpoint.from_dict({"kind": kind})
            if kind == "dir":
                directory = os.path.join(sgd.get_context().get_trial_dir(), f"d{sgd.world_rank()}")
                os.makedirs(directory, exist_ok=True)
                with open(os.path.join(directory, "w.txt"), "w") as f:
                    f.write("weights")
                checkpoint = Checkpoint.from_directory(directory)
            sgd.report({"val_x": sorted(round(r["x"], 6) for r in rows)}, checkpoint=checkpoint)

    train = ray.data.from_items([{"x": float(v)} for v in (0, 2, 4, 6)])  # mean 3
    val = ray.data.from_items([{"x": 3.0}])
    scaler = StandardScaler(columns=["x"])
    result = _fit(loop, tmp_path, datasets={"train": train, "val": val}, preprocessor=scaler,
                  dataset_config={"train": DatasetConfig()})  # AIR's rule: val whole to every worker
    assert result.error is None, result.error
    assert result.metrics["val_x"] == [0.0]  # fitted on train, applied to val
    for checkpoint, _ in result.best_checkpoints:
        kept = Checkpoint.from_directory(checkpoint.path).get_preprocessor()
        assert type(kept) is StandardScaler and kept.stats_ == scaler.stats_
    dict_ckpt, dir_ckpt = [c for c, _ in result.best_checkpoints]
    assert dict_ckpt.to_dict()["kind"] == "dict"
    assert sorted(dir_ckpt.to_dict()["_directory_files"]) == ["preprocessor.sgd", "w.txt"]


def test_a_preprocessor_that_fails_to_fit_names_the_dataset_and_column(ray_cluster, tmp_path):
    from ray.data.preprocessors import StandardScaler

    with pytest.raises(ValueError, match="dataset 'train'.*nope") as info:
        _fit(lambda: None, tmp_path, datasets={"train": ray.data.from_items([{"x": 1.0}])},
             preprocessor=StandardScaler(columns=["nope"]))
    assert isinstance(info.value, sgd.ControllerError) and info.value.result.path is None
    pickle.loads(pickle.dumps(info.value))
    with pytest.raises(TypeError, match="preprocessor must be"):
        DataParallelTrainer(lambda: None, preprocessor=object())


def test_dataset_config_air_fields_resolve_and_merge_without_ray():
    assert DatasetConfig(global_shuffle=True).resolved().shuffle is True
    assert DatasetConfig(randomize_block_order=True).resolved().shuffle is True
    assert DatasetConfig(randomize_block_order=False).resolved().shuffle is False
    assert DatasetConfig(max_object_store_memory_fraction=-1).resolved().streaming is False
    assert DatasetConfig(max_object_store_memory_fraction=0.2).resolved().streaming is True
    assert DatasetConfig().resolved().split is True and DatasetConfig().resolved(split=False).split is False
    base = DatasetConfig(split=False, fit=False, transform=True)
    merged = DatasetConfig(shuffle=True).merged(base)
    assert (merged.split, merged.fit, merged.shuffle) == (False, False, True)  # unset fields keep the base's

    # The trainer's rules: "train" split and fitted, the others whole; "*" applies to every dataset.
    trainer = DataParallelTrainer(lambda: None, datasets={"train": [1], "val": [2], "test": [3]},
                                  dataset_config={"*": DatasetConfig(transform=False),
                                                  "test": DatasetConfig(split=True)})
    configs = trainer.dataset_configs()
    assert {n: (c.split, bool(c.fit), c.transform) for n, c in configs.items()} == {
        "train": (True, True, False), "val": (False, False, False), "test": (True, False, False)}
    with pytest.raises(ValueError, match="split="):
        DatasetConfig(split="sometimes")
    with pytest.raises(TypeError, match="sgd.DatasetConfig"):
        DataParallelTrainer(lambda: None, dataset_config={"train": {"split": True}})


def test_per_epoch_preprocessor_applies_to_every_epoch(ray_cluster, tmp_path):
    from ray.data.preprocessors import Concatenator

    def loop():
        shard = sgd.get_dataset_shard("train")
        for epoch in range(2):
            rows = list(shard.iter_rows())
            sgd.report({"epoch": epoch, "columns": sorted(rows[0]), "rows": len(rows)})

    per_epoch = Concatenator(columns=["a", "b"], output_column_name="x")
    result = _fit(loop, tmp_path, datasets={"train": ray.data.from_items([{"a": 1.0, "b": 2.0}] * 4)},
                  dataset_config={"train": DatasetConfig(per_epoch_preprocessor=per_epoch)})
    assert result.error is None, result.error
    assert [(r["columns"], r["rows"]) for r in result.metrics_dataframe.to_dict("records")] == [(["x"], 2)] * 2
