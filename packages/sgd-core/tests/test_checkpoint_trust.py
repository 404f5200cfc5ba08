"""Checkpoints you can trust (issue 17): no code runs on load without the opt-in, every file
verified, metadata confined, restore survives a damaged checkpoint, clear errors."""

import errno
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import sgd
from sgd._common.protocol import CheckpointTarget
from sgd.checkpoint import (
    METADATA_FILE,
    CheckpointIntegrityError,
    UntrustedCheckpointError,
    write_dict_dir,
)
from sgd.codecs import Codec, save_safe
from sgd.plugins import get_plugin_manager
from sgd.storage.manager import CheckpointManager
from sgd.storage.staging import stage_state


class _Evil:
    """Unpickling it creates the directory ``marker``: proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def _plant(checkpoint: Path, marker: Path) -> None:
    """Replace the state file with a malicious pickle and fix the recorded digest, as an
    attacker who controls the whole folder would."""
    from sgd.checkpoint.integrity import file_digest

    meta = json.loads((checkpoint / METADATA_FILE).read_text())
    state_file = checkpoint / meta["state_file"]
    state_file.write_bytes(pickle.dumps({"x": _Evil(marker)}))
    meta["files"][meta["state_file"]] = file_digest(state_file)
    (checkpoint / METADATA_FILE).write_text(json.dumps(meta))


def _codec_names():
    names = ["sgd", "pickle"]
    try:
        import sgd_tensorflow  # noqa: F401

        names.append("tensorflow")
    except ImportError:
        pass
    return names


# --- the safe format --------------------------------------------------------------------------


def test_plain_data_is_stored_without_pickle_and_round_trips(tmp_path):
    data = {"step": 3, "loss": 0.5, "nan": float("nan"), "name": "x", "list": [1, (2, 3)], "nested": {4: b"raw"},
            "weights": np.arange(6, dtype=np.float32).reshape(2, 3), "scalar": np.int64(7), "tags": {"a"}}
    path = sgd.Checkpoint.from_dict(data).to_directory(tmp_path / "c")
    meta = json.loads((Path(path) / METADATA_FILE).read_text())
    assert meta["codec"] == "sgd" and "needs_trust" not in meta
    raw = (Path(path) / meta["state_file"]).read_bytes()
    assert raw.startswith(b"SGDSTATE1") and b"\x80\x04" not in raw[:20]  # not a pickle
    assert meta["files"][meta["state_file"]]["size"] == len(raw)
    back = sgd.Checkpoint.from_directory(path).to_dict()
    assert back["weights"].dtype == np.float32 and (back["weights"] == data["weights"]).all()
    assert back["scalar"] == 7 and type(back["scalar"]) is np.int64
    assert back["list"] == [1, (2, 3)] and back["nested"] == {4: b"raw"} and back["tags"] == {"a"}
    assert np.isnan(back["nan"]) and back["step"] == 3


def test_state_that_needs_pickle_says_so_and_loads_when_trusted(tmp_path, monkeypatch):
    monkeypatch.delenv("SGD_TRUST_CHECKPOINTS", raising=False)
    path = sgd.Checkpoint.from_dict({"obj": threading.Event}).to_directory(tmp_path / "c")
    with pytest.raises(UntrustedCheckpointError) as info:
        sgd.Checkpoint.from_directory(path).to_dict()
    message = str(info.value)
    assert str(tmp_path / "c") in message and "builtins.type" in message
    assert "trusted=True" in message and "SGD_TRUST_CHECKPOINTS=1" in message
    assert sgd.Checkpoint.from_directory(path, trusted=True).to_dict() == {"obj": threading.Event}


# --- malicious pickles ----------------------------------------------------------------------------


@pytest.mark.parametrize("codec", _codec_names())
def test_malicious_pickle_runs_nothing_without_the_opt_in(tmp_path, monkeypatch, codec):
    monkeypatch.delenv("SGD_TRUST_CHECKPOINTS", raising=False)
    marker = tmp_path / "pwned"
    checkpoint = tmp_path / "c"
    write_dict_dir({"x": 1}, checkpoint, codec)
    _plant(checkpoint, marker)
    for load in (lambda: sgd.Checkpoint.from_directory(checkpoint).to_dict(),
                 lambda: sgd.Trainer.load_checkpoint_from_path(checkpoint),
                 lambda: sgd.Trainer.load_checkpoint_from_path(str(checkpoint), trusted=False)):
        with pytest.raises(UntrustedCheckpointError, match="trusted=True"):
            load()
        assert not marker.exists()
    # The opt-in, both spellings, does run it: the caller said the file is theirs.
    sgd.Trainer.load_checkpoint_from_path(checkpoint, trusted=True)
    assert marker.is_dir()
    marker.rmdir()
    monkeypatch.setenv("SGD_TRUST_CHECKPOINTS", "1")
    sgd.Checkpoint.from_directory(checkpoint).to_dict()
    assert marker.is_dir()


def test_malicious_pickle_in_a_run_is_not_loaded_by_run_or_restore(base_trainer, tmp_path, monkeypatch):
    monkeypatch.delenv("SGD_TRUST_CHECKPOINTS", raising=False)
    marker = tmp_path / "pwned"
    base_trainer.run(_three_checkpoints)
    run_dir = base_trainer.latest_run_dir
    newest = run_dir / "checkpoints" / "checkpoint_000003"
    _plant(newest, marker)
    with pytest.raises(UntrustedCheckpointError, match="checkpoint_000003"):
        base_trainer.run(_three_checkpoints, checkpoint=newest)
    assert not marker.exists()
    restored = sgd.Trainer.restore(run_dir)
    restored.start()
    try:
        with pytest.raises(UntrustedCheckpointError, match="checkpoint_000003"):
            restored.run(_three_checkpoints)
        assert not marker.exists()
    finally:
        restored.shutdown()


# --- tampered metadata --------------------------------------------------------------------------


@pytest.mark.parametrize("state_file", ["/etc/passwd", "../outside.sgd", "sub/../../outside.sgd"])
def test_state_file_outside_the_checkpoint_is_refused(tmp_path, state_file):
    checkpoint = tmp_path / "c"
    write_dict_dir({"x": 1}, checkpoint)
    (tmp_path / "outside.sgd").write_bytes((checkpoint / "state.sgd").read_bytes())
    meta = json.loads((checkpoint / METADATA_FILE).read_text())
    meta["state_file"] = state_file
    meta["files"] = {state_file: meta["files"]["state.sgd"]}
    (checkpoint / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointIntegrityError, match="outside the checkpoint directory") as info:
        sgd.Checkpoint.from_directory(checkpoint).to_dict()
    assert str(checkpoint) in str(info.value) and state_file in str(info.value)


def test_unknown_codec_name_is_never_imported(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evilcodec.py").write_text(f"import os\nos.makedirs({str(marker)!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    checkpoint = tmp_path / "c"
    write_dict_dir({"x": 1}, checkpoint)
    meta = json.loads((checkpoint / METADATA_FILE).read_text())
    meta["codec"] = "evilcodec"
    (checkpoint / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointIntegrityError, match="'evilcodec'.*not a registered codec") as info:
        sgd.Trainer.load_checkpoint_from_path(checkpoint, trusted=True)
    assert "sgd, torch" in str(info.value) or "registered: " in str(info.value)
    assert not marker.exists() and "evilcodec" not in sys.modules


def test_legacy_metadata_names_still_load(tmp_path):
    """Checkpoints written before issue 17 name their codec by module path."""
    checkpoint = tmp_path / "c"
    write_dict_dir({"x": 1}, checkpoint)
    meta = json.loads((checkpoint / METADATA_FILE).read_text())
    meta["codec"] = "sgd._internal.codec"
    del meta["files"]  # nor did they record digests
    (checkpoint / METADATA_FILE).write_text(json.dumps(meta))
    assert sgd.Checkpoint.from_directory(checkpoint).to_dict() == {"x": 1}


# --- verification ----------------------------------------------------------------------------------


def test_changed_truncated_or_added_files_name_the_file(tmp_path):
    checkpoint = tmp_path / "c"
    write_dict_dir({"w": np.ones(1000)}, checkpoint)
    state = checkpoint / "state.sgd"
    good = state.read_bytes()
    state.write_bytes(good[:-10])
    with pytest.raises(CheckpointIntegrityError, match=r"'state.sgd' has \d+ bytes, \d+ were written"):
        sgd.Checkpoint.from_directory(checkpoint).to_dict()
    state.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    with pytest.raises(CheckpointIntegrityError, match="'state.sgd' does not match its sha256"):
        sgd.Checkpoint.from_directory(checkpoint).to_dict()
    state.unlink()
    with pytest.raises(CheckpointIntegrityError, match="'state.sgd' is missing"):
        sgd.Checkpoint.from_directory(checkpoint).to_dict()

    source = tmp_path / "files"
    source.mkdir()
    (source / "model.bin").write_bytes(b"abc")
    directory = Path(sgd.Checkpoint.from_directory(source).to_directory(tmp_path / "d"))
    from sgd.checkpoint import write_directory_metadata

    write_directory_metadata(directory)
    assert sgd.Checkpoint.from_directory(directory).to_dict() == {"_directory_files": {"model.bin": b"abc"}}
    (directory / "planted.py").write_text("print('hi')")
    with pytest.raises(CheckpointIntegrityError, match="'planted.py' is not among the files"):
        sgd.Checkpoint.from_directory(directory).to_dict()


def test_decode_error_names_the_checkpoint(tmp_path):
    checkpoint = tmp_path / "c"
    write_dict_dir({"x": 1}, checkpoint)
    meta = json.loads((checkpoint / METADATA_FILE).read_text())
    del meta["files"]  # an old checkpoint: nothing to verify against, so decoding finds it
    (checkpoint / METADATA_FILE).write_text(json.dumps(meta))
    (checkpoint / "state.sgd").write_bytes(b"SGDSTATE1\n" + os.urandom(64))
    with pytest.raises(CheckpointIntegrityError, match="cannot decode state.sgd") as info:
        sgd.Checkpoint.from_directory(checkpoint).to_dict()
    assert str(checkpoint) in str(info.value)


# --- restore survives damage -----------------------------------------------------------------------


def _three_checkpoints(config):
    start = (sgd.load_checkpoint() or {}).get("epoch", 0)
    for epoch in range(start + 1, start + 4):
        sgd.report(epoch=epoch)
        sgd.save_checkpoint(epoch=epoch)
    return start


def _truncate_state(checkpoint: Path) -> None:
    meta = json.loads((checkpoint / METADATA_FILE).read_text())
    state = checkpoint / meta["state_file"]
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])


def test_restore_skips_a_truncated_newest_checkpoint(base_trainer, caplog):
    base_trainer.run(_three_checkpoints)
    run_dir = base_trainer.latest_run_dir
    _truncate_state(run_dir / "checkpoints" / "checkpoint_000003")
    restored = sgd.Trainer.restore(run_dir)
    restored.start()
    try:
        with caplog.at_level(logging.WARNING, logger="sgd"):
            # Resumed from epoch 2: the function starts at 2 and saves epochs 3-5.
            assert restored.run(_three_checkpoints) == [2, 2]
        assert any("checkpoint_000003" in r.getMessage() and "does not verify" in r.getMessage()
                   for r in caplog.records)
        assert restored.latest_checkpoint == {"epoch": 5}
    finally:
        restored.shutdown()

    # `sgd runs show` marks it.
    out = subprocess.run([sys.executable, "-m", "sgd", "runs", "show", str(run_dir)], capture_output=True,
                         text=True, check=True).stdout
    assert "NOT VERIFIED" in out and "checkpoint_000003" in out


def test_restore_with_no_checkpoint_that_verifies_says_so(base_trainer):
    base_trainer.run(_three_checkpoints)
    run_dir = base_trainer.latest_run_dir
    for p in (run_dir / "checkpoints").iterdir():
        _truncate_state(p)
    restored = sgd.Trainer.restore(run_dir)
    restored.start()
    try:
        with pytest.raises(CheckpointIntegrityError, match="none of the 3 checkpoints .* verifies"):
            restored.run(_three_checkpoints)
    finally:
        restored.shutdown()


def _save(m, state, iteration):
    """``sgd.save_checkpoint(**state)`` as a worker and the driver do it: the state written into a
    temporary folder of the run's checkpoint folder, then registered by its path."""
    target = CheckpointTarget(str(m.checkpoint_dir), m.codec, m.strategy.checkpoint_score_attribute)
    written = stage_state(target, state, hook=m.hook)
    return m.register(Path(written.path), written.score_values, iteration)


def test_restart_uses_the_newest_kept_checkpoint_that_verifies(tmp_path, caplog):
    m = CheckpointManager(tmp_path / "checkpoints", sgd.CheckpointStrategy(), "sgd")
    _save(m, {"step": 1}, 1)
    newest = _save(m, {"step": 2}, 2)
    _truncate_state(newest)
    m.latest_state = None  # as after a direct write: read back from disk when a restart needs it
    with caplog.at_level(logging.WARNING, logger="sgd"):
        assert m.latest() == {"step": 1}
    assert m.latest_iteration == 1
    assert any("checkpoint_000002" in r.getMessage() for r in caplog.records)


def test_checkpoints_this_run_wrote_load_without_the_opt_in(tmp_path, monkeypatch):
    """A restart reloads what this driver wrote (and recorded) itself, pickled or not."""
    monkeypatch.delenv("SGD_TRUST_CHECKPOINTS", raising=False)
    m = CheckpointManager(tmp_path / "checkpoints", sgd.CheckpointStrategy(), "sgd")
    _save(m, {"cls": threading.Event}, 1)
    m.latest_state = None
    assert m.latest() == {"cls": threading.Event}


# --- full disk ---------------------------------------------------------------------------------------


class _FullDisk(Codec):
    """Writes some bytes, then fails the way a full disk makes each kind of writer fail."""

    suffix = "full"

    def __init__(self, name, error):
        self.name, self.error = name, error

    def save(self, obj, f):
        f.write(b"x" * 100)
        raise self.error

    def load(self, f, trusted, where):
        raise AssertionError("never written")


class _FullDiskPlugin:
    @sgd.hookimpl
    def sgd_checkpoint_codecs(self):
        return [_FullDisk("enospc", OSError(errno.ENOSPC, "No space left on device")),
                _FullDisk("torchfull", RuntimeError("[enforce fail at inline_container.cc:672] . "
                                                    "unexpected pos 11392 vs 11284"))]


@pytest.fixture
def full_disk_codecs():
    pm = get_plugin_manager()
    plugin = _FullDiskPlugin()
    pm.register(plugin)
    yield
    pm.unregister(plugin)


@pytest.mark.parametrize("codec", ["enospc", "torchfull"])
def test_injected_enospc_is_the_disk_is_full(tmp_path, full_disk_codecs, codec):
    m = CheckpointManager(tmp_path / "checkpoints", sgd.CheckpointStrategy(), codec)
    m.codec = "sgd"
    _save(m, {"step": 1}, 1)
    m.codec = codec
    with pytest.raises(OSError, match="the disk is full") as info:
        _save(m, {"step": 2}, 2)
    assert info.value.errno == errno.ENOSPC
    assert str(tmp_path / "checkpoints") in str(info.value) and "Earlier checkpoints are intact" in str(info.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_000001"]
    assert sgd.Trainer.load_checkpoint_from_path(tmp_path / "checkpoints" / "checkpoint_000001") == {"step": 1}


def test_a_codec_bug_is_not_called_a_full_disk(tmp_path):
    class Broken(Codec):
        name = suffix = "broken"

        def save(self, obj, f):
            save_safe(obj, f)
            raise RuntimeError("codec bug")

    class Plugin:
        @sgd.hookimpl
        def sgd_checkpoint_codecs(self):
            return [Broken()]

    pm = get_plugin_manager()
    plugin = Plugin()
    pm.register(plugin)
    try:
        with pytest.raises(RuntimeError, match="codec bug"):
            write_dict_dir({"x": 1}, tmp_path / "c", "broken")
    finally:
        pm.unregister(plugin)


def test_a_small_real_disk_fills_with_a_clear_error(small_disk):
    m = CheckpointManager(small_disk / "checkpoints", sgd.CheckpointStrategy(), "sgd")
    _save(m, {"w": np.zeros(1000)}, 1)
    with pytest.raises(OSError, match="the disk is full") as info:
        _save(m, {"w": np.zeros(2_000_000)}, 2)  # 16 MB
    assert str(small_disk / "checkpoints") in str(info.value)
    assert sorted(p.name for p in (small_disk / "checkpoints").iterdir()) == ["checkpoint_000001"]
    assert (sgd.Trainer.load_checkpoint_from_path(small_disk / "checkpoints" / "checkpoint_000001")["w"]
            == np.zeros(1000)).all()


# --- unpicklable reports -----------------------------------------------------------------------------


class _Rounds(sgd.TrainingCallback):
    def __init__(self):
        self.rounds = []

    def handle_result(self, results, **info):
        self.rounds.append(results[0])


def _reports_a_lock(config):
    sgd.report(step=1)
    sgd.report(step=2)
    sgd.report(step=3, lock=threading.Lock())
    return "done"


def _reports_a_lock_first(config):
    sgd.report(step=1, lock=threading.Lock())


@pytest.mark.parametrize("func, first_wait_s, delivered", [
    (_reports_a_lock, 0.0, [1, 2]),  # no first reply: every item comes with a poll
    # The run's first items travel with the start call's reply (issue 35): the lock is in it.
    (_reports_a_lock_first, 3600.0, []),
], ids=["later", "in-the-start-reply"])
def test_an_unpicklable_report_names_sgd_report_and_the_key(base_trainer, monkeypatch, func, first_wait_s,
                                                            delivered):
    import sgd.group.starts

    monkeypatch.setattr(sgd.group.starts, "FIRST_REPLY_S", first_wait_s)
    rounds = _Rounds()
    with pytest.raises(TypeError, match=r"sgd.report .*key 'lock'.*_thread.lock.* cannot be pickled"):
        base_trainer.run(func, callbacks=[rounds])
    assert [r["step"] for r in rounds.rounds] == delivered  # nothing reported before it is lost
    results = base_trainer.latest_run_dir / "results.jsonl"
    lines = results.read_text().splitlines() if delivered else []
    assert [json.loads(line)[0]["step"] for line in lines] == delivered
    assert delivered or not results.exists() or not results.read_text()
    # The trainer is usable afterwards.
    assert base_trainer.run(_three_checkpoints) == [0, 0]
