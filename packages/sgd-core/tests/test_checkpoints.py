"""Checkpoint objects, strategies, on-disk layout, atomic writes and storage URIs."""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sgd
from sgd._common.protocol import CheckpointTarget
from sgd.checkpoint import METADATA_FILE
from sgd.checkpoint.integrity import checkpoint_dirs
from sgd.plugins import get_plugin_manager
from sgd.storage.manager import CheckpointManager
from sgd.storage.staging import stage_state

# --- CheckpointStrategy ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_to_keep": -1}, "num_to_keep"),
        ({"num_to_keep": 1.5}, "num_to_keep"),
        ({"checkpoint_score_order": "median"}, "max' or 'min"),
        ({"checkpoint_score_attribute": ""}, "non-empty"),
    ],
)
def test_strategy_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sgd.CheckpointStrategy(**kwargs)


def test_strategy_scores():
    s = sgd.CheckpointStrategy(checkpoint_score_attribute="loss", checkpoint_score_order="min")
    assert s.score({"loss": 2.0}) == -2.0
    assert s.score({"loss": float("nan")}) == -math.inf  # NaN ranks worst
    with pytest.raises(ValueError, match="'loss' is not in the checkpoint"):
        s.score({"acc": 1})
    with pytest.raises(ValueError, match="must be a number"):
        s.score({"loss": "low"})
    assert sgd.CheckpointStrategy(checkpoint_score_attribute="acc").score({"acc": 3}) == 3.0


# --- Checkpoint -----------------------------------------------------------------------------


def test_dict_roundtrip_through_a_directory(tmp_path):
    state = {"w": [1, 2, 3], "epoch": 4, "nested": {"a": None}}
    ckpt = sgd.Checkpoint.from_dict(state)
    assert ckpt.to_dict() is state and ckpt.path is None
    target = ckpt.to_directory(tmp_path / "c")
    assert (Path(target) / METADATA_FILE).exists()
    loaded = sgd.Checkpoint.from_directory(target)
    assert loaded.path == str(tmp_path / "c")
    assert loaded.to_dict() == state
    with ckpt.as_directory() as d:
        assert sgd.Checkpoint.from_directory(d).to_dict() == state
    assert not Path(d).exists()  # the temporary copy is cleaned up
    assert sgd.Trainer.load_checkpoint_from_path(target) == state


def test_plain_directory_checkpoint(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"\x00\x01")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.txt").write_text("hi")
    ckpt = sgd.Checkpoint.from_directory(tmp_path)
    assert ckpt.to_dict() == {"_directory_files": {"model.bin": b"\x00\x01", "sub/x.txt": b"hi"}}
    copy = ckpt.to_directory(tmp_path.parent / "copy")
    assert (Path(copy) / "sub" / "x.txt").read_text() == "hi"


def test_bad_checkpoint_inputs(tmp_path):
    with pytest.raises(FileNotFoundError):
        sgd.Checkpoint.from_directory(tmp_path / "missing")
    with pytest.raises(TypeError):
        sgd.Checkpoint.from_dict([1])
    with pytest.raises(ValueError, match="no checkpoint storage for nosuch://"):
        sgd.Checkpoint.from_dict({"a": 1}).to_directory("nosuch://bucket/x")


def test_storage_uris_through_the_hook(tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("fsspec")
    state = {"step": 7}
    for uri in (f"file://{tmp_path}/ckpt", "memory://sgd-test/ckpt"):
        sgd.Checkpoint.from_dict(state).to_directory(uri)
        assert sgd.Checkpoint.from_directory(uri).to_dict() == state
    assert json.loads((tmp_path / "ckpt" / METADATA_FILE).read_text())["format"] == "dict"


# --- CheckpointManager ---------------------------------------------------------------------


def _save(m, state, iteration):
    """``sgd.save_checkpoint(**state)`` as a worker and the driver do it: the state written into a
    temporary folder of the run's checkpoint folder, then registered by its path."""
    target = CheckpointTarget(str(m.checkpoint_dir), m.codec, m.strategy.checkpoint_score_attribute)
    written = stage_state(target, state, hook=m.hook)
    return m.register(Path(written.path), written.score_values, iteration)


def _manager(tmp_path, **strategy):
    return CheckpointManager(tmp_path / "checkpoints", sgd.CheckpointStrategy(**strategy), "sgd._internal.codec")


def test_keeps_the_k_best_and_the_latest(tmp_path):
    m = _manager(tmp_path, num_to_keep=2, checkpoint_score_attribute="acc")
    for i, acc in enumerate([0.5, 0.9, float("nan"), 0.7, 0.1], start=1):
        _save(m, {"acc": acc, "i": i}, i)
    # Best two are 2 (0.9) and 4 (0.7); 5 is kept because it is the latest.
    assert m.kept_ids == [2, 4, 5]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "checkpoint_000002", "checkpoint_000004", "checkpoint_000005"]
    assert m.best_path.name == "checkpoint_000002"
    _save(m, {"acc": 0.2, "i": 6}, 6)
    assert m.kept_ids == [2, 4, 6]


def test_num_to_keep_zero_persists_nothing(tmp_path):
    m = _manager(tmp_path, num_to_keep=0)
    assert _save(m, {"a": 1}, 1) is None
    assert m.latest_state == {"a": 1} and not (tmp_path / "checkpoints").exists()


def test_missing_score_attribute_keeps_the_checkpoint(tmp_path):
    m = _manager(tmp_path, checkpoint_score_attribute="loss")
    with pytest.raises(ValueError, match="'loss' is not in the checkpoint"):
        _save(m, {"acc": 1}, 1)
    assert sgd.Trainer.load_checkpoint_from_path(tmp_path / "checkpoints" / "checkpoint_000001") == {"acc": 1}


_SLOW_CODEC = '''
import os, signal, time
import sgd
from sgd.codecs import Codec, load_safe, save_safe
class Slow(Codec):
    name = suffix = "slowcodec"
    def save(self, obj, f):
        f.write(b"x" * 1000)
        f.flush()
        if obj.get("crash"):
            os.kill(os.getpid(), signal.SIGKILL)  # the driver dies half-way through the write
        return save_safe(obj, f)
    def load(self, f, trusted, where):
        return load_safe(f.read()[1000:])
@sgd.hookimpl
def sgd_checkpoint_codecs():
    return [Slow()]
'''


def test_crash_while_writing_leaves_no_half_checkpoint(tmp_path):
    (tmp_path / "slowcodec.py").write_text(_SLOW_CODEC)
    script = textwrap.dedent(f"""
        from pathlib import Path
        import sgd, slowcodec
        from sgd.storage.manager import CheckpointManager
        from sgd._common.protocol import CheckpointTarget
        from sgd.storage.staging import stage_state
        def _save(m, state, iteration):
            target = CheckpointTarget(str(m.checkpoint_dir), m.codec, m.strategy.checkpoint_score_attribute)
            written = stage_state(target, state)
            return m.register(Path(written.path), written.score_values, iteration)
        from sgd.plugins import get_plugin_manager
        get_plugin_manager().register(slowcodec)
        m = CheckpointManager(Path({str(tmp_path)!r}) / "checkpoints", sgd.CheckpointStrategy(), "slowcodec")
        _save(m, {{"step": 1}}, 1)
        _save(m, {{"step": 2, "crash": True}}, 2)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
    assert proc.returncode == -9
    names = {p.name for p in (tmp_path / "checkpoints").iterdir()}
    finals = {n for n in names if not n.startswith(".tmp_")}
    assert finals == {"checkpoint_000001"} and len(names) == 2  # plus the abandoned temporary one
    latest = checkpoint_dirs(tmp_path / "checkpoints")[-1][1]
    sys.path.insert(0, str(tmp_path))
    pm = get_plugin_manager()
    try:
        import slowcodec

        pm.register(slowcodec)
        assert sgd.Trainer.load_checkpoint_from_path(latest) == {"step": 1}
    finally:
        sys.path.remove(str(tmp_path))
        pm.unregister(name=pm.get_name(slowcodec))


def test_full_disk_gives_a_clear_error_and_loses_nothing(tmp_path):
    script = textwrap.dedent(f"""
        import resource, signal
        from pathlib import Path
        import sgd
        from sgd.storage.manager import CheckpointManager
        from sgd._common.protocol import CheckpointTarget
        from sgd.storage.staging import stage_state
        def _save(m, state, iteration):
            target = CheckpointTarget(str(m.checkpoint_dir), m.codec, m.strategy.checkpoint_score_attribute)
            written = stage_state(target, state)
            return m.register(Path(written.path), written.score_values, iteration)
        m = CheckpointManager(Path({str(tmp_path)!r}) / "checkpoints", sgd.CheckpointStrategy(), "sgd._internal.codec")
        _save(m, {{"small": 1}}, 1)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        try:
            _save(m, {{"big": b"x" * 1_000_000}}, 2)
        except OSError as exc:
            print("ERROR:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "could not write a checkpoint" in out and "disk is full" in out and "Earlier checkpoints are intact" in out
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_000001"]
    assert sgd.Trainer.load_checkpoint_from_path(tmp_path / "checkpoints" / "checkpoint_000001") == {"small": 1}


# --- through the Trainer ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trainer(base_trainer):
    return base_trainer


def _three_checkpoints(config):
    start = (sgd.load_checkpoint() or {}).get("epoch", 0)
    for epoch in range(start + 1, start + 4):
        sgd.report(epoch=epoch)
        sgd.save_checkpoint(epoch=epoch, loss=config.get("losses", [3, 1, 2])[epoch - start - 1])
    return start


def test_layout_numbering_and_properties(trainer):
    assert trainer.run(_three_checkpoints) == [0, 0]
    run1 = trainer.latest_run_dir
    assert trainer.latest_checkpoint_dir == run1 / "checkpoints"
    assert sorted(p.name for p in trainer.latest_checkpoint_dir.iterdir()) == [
        "checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    assert trainer.latest_checkpoint == {"epoch": 3, "loss": 2}
    # Default strategy ranks by time: the best is the latest.
    assert trainer.best_checkpoint_path.name == "checkpoint_000003"
    # Numbering starts again in the next run; the checkpoint path resumes training.
    assert trainer.run(_three_checkpoints, checkpoint=trainer.best_checkpoint_path) == [3, 3]
    # The next run's folder (the module's trainer may have run before this test: count from run1).
    assert trainer.latest_run_dir == run1.parent / f"run_{int(run1.name.split('_')[1]) + 1:03d}"
    assert sorted(p.name for p in trainer.latest_checkpoint_dir.iterdir())[0] == "checkpoint_000001"
    assert trainer.latest_checkpoint["epoch"] == 6


def test_strategy_through_run(trainer):
    strategy = sgd.CheckpointStrategy(num_to_keep=1, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    trainer.run(_three_checkpoints, checkpoint_strategy=strategy)
    assert trainer.best_checkpoint_path.name == "checkpoint_000002"
    assert trainer.best_checkpoint == {"epoch": 2, "loss": 1}
    assert sorted(p.name for p in trainer.latest_checkpoint_dir.iterdir()) == [
        "checkpoint_000002", "checkpoint_000003"]


def test_checkpoint_argument_forms(trainer, tmp_path):
    state = {"epoch": 10}
    path = sgd.Checkpoint.from_dict(state).to_directory(tmp_path / "c")
    for form in (state, sgd.Checkpoint.from_dict(state), path, Path(path), sgd.Checkpoint.from_directory(path)):
        assert trainer.run(lambda: sgd.load_checkpoint(), checkpoint=form) == [state, state]
    with pytest.raises(TypeError, match="checkpoint must be"):
        trainer.run(lambda: None, checkpoint=42)
    with pytest.raises(TypeError, match="CheckpointStrategy"):
        trainer.run(lambda: None, checkpoint_strategy={"num_to_keep": 1})


def test_mismatched_checkpoint_counts(trainer):
    def train_func():
        for _ in range(2 - sgd.world_rank()):
            sgd.save_checkpoint(x=1)

    with pytest.raises(RuntimeError, match="different number of times"):
        trainer.run(train_func)


def test_results_and_status_persisted(trainer):
    def train_func():
        for i in range(3):
            sgd.report(i=i, bad=float("nan"), wandb_api_key="k-123", nested={"Password": "p-456", "ok": 1})

    trainer.run(train_func)
    run = trainer.latest_run_dir
    lines = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    assert [[r["i"] for r in line] for line in lines] == [[0, 0], [1, 1], [2, 2]]
    assert lines[0][0]["bad"] == "NaN"
    text = (run / "results.jsonl").read_text()
    assert "k-123" not in text and "p-456" not in text and lines[0][0]["nested"] == {"ok": 1}
    assert json.loads((run / "status.json").read_text())["status"] == "FINISHED"
    assert json.loads((run / "trainer.json").read_text())["num_workers"] == [2, 2]
    with pytest.raises(ValueError):
        trainer.run(lambda: (_ for _ in ()).throw(ValueError("x")))
    assert json.loads((trainer.latest_run_dir / "status.json").read_text())["status"] == "ERRORED"


def _many_reports_then_a_checkpoint():
    """Hundreds of reports between checkpoints, so that the driver's polls run ahead of the
    rounds it hands out; each save/report-with-checkpoint must still return only once that
    checkpoint is on disk, and the reports between them arrive complete and in order."""
    seen = []
    for step in range(1, 4):
        for i in range(300):
            sgd.report(step=step, i=i)
        if step == 2:
            with sgd.Checkpoint.from_dict({"step": step}).as_directory() as d:
                sgd.report({"step": step, "i": 300}, checkpoint=sgd.Checkpoint.from_directory(d))
        else:
            sgd.save_checkpoint(step=step)
        seen.append(len(checkpoint_dirs(Path(sgd.get_context().get_trial_dir(), "checkpoints"))))
    return seen


def test_a_checkpoint_returns_only_once_persisted_while_polls_run_ahead(trainer):
    rounds = []

    class Count(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            rounds.append((results[0]["step"], results[0]["i"], results[1]["i"]))

    out = trainer.run(_many_reports_then_a_checkpoint, callbacks=[Count()])
    assert out == [[1, 2, 3]] * 2
    expected = [(s, i, i) for s in (1, 2, 3) for i in range(300 + (s == 2))]
    assert rounds == expected


@pytest.mark.parametrize("kind", ["memory", "file", "path"])
def test_storage_path_mirrors_kept_checkpoints(ray_cluster, tmp_path, kind):
    pytest.importorskip("pyarrow")
    pytest.importorskip("fsspec")
    base = {"memory": f"memory://sgd-{tmp_path.name}/exp", "file": f"file://{tmp_path}/remote",
            "path": str(tmp_path / "plain")}[kind]
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, logdir=tmp_path / "logs", storage_path=base)
    trainer.start()
    try:
        trainer.run(_three_checkpoints, checkpoint_strategy=sgd.CheckpointStrategy(
            num_to_keep=1, checkpoint_score_attribute="loss", checkpoint_score_order="min"))
    finally:
        trainer.shutdown()
    root = trainer.storage_path + "/logs/run_001/checkpoints"
    # Kept locally: 2 (best) and 3 (latest); the mirror holds the same, 1 was deleted there too.
    assert sgd.Checkpoint.from_directory(root + "/checkpoint_000002").to_dict() == {"epoch": 2, "loss": 1}
    assert sgd.Checkpoint.from_directory(root + "/checkpoint_000003").to_dict() == {"epoch": 3, "loss": 2}
    with pytest.raises(FileNotFoundError):
        sgd.Checkpoint.from_directory(root + "/checkpoint_000001").to_dict()


def test_storage_path_with_unknown_scheme_fails_at_construction():
    with pytest.raises(ValueError, match="no checkpoint storage for nosuch://"):
        sgd.Trainer(backend=sgd.BackendConfig(), storage_path="nosuch://bucket")
