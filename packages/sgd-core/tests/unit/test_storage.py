"""A run's storage without Ray: the one checkpoint path (a worker writes into a temporary folder of
the run's checkpoint folder, directly or through the file server; the manager registers the
path once) and the public names the move to ``sgd.storage`` keeps."""

import json
import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest

import sgd
from sgd._common.protocol import CheckpointTarget, WrittenCheckpoint
from sgd.checkpoint import METADATA_FILE, Checkpoint
from sgd.storage.manager import CheckpointManager
from sgd.storage.staging import stage_directory, stage_state


def _manager(tmp_path, **strategy):
    return CheckpointManager(tmp_path / "checkpoints", sgd.CheckpointStrategy(**strategy), "pickle")


def _target(m):
    return CheckpointTarget(str(m.checkpoint_dir), m.codec, m.strategy.checkpoint_score_attribute)


class _FileServer:
    """What ``DriverFiles`` does for a worker on another host, without Ray: each upload copied
    to the driver's path; the order of the uploads kept."""

    def __init__(self):
        self.uploaded = []

    def upload(self, local, driver_path):
        os.makedirs(os.path.dirname(driver_path), exist_ok=True)
        shutil.copyfile(local, driver_path)
        self.uploaded.append(os.path.basename(driver_path))
        return os.path.getsize(driver_path)


def test_a_saved_state_is_written_into_the_run_and_registered_by_its_path(tmp_path):
    m = _manager(tmp_path, checkpoint_score_attribute="acc")
    written = stage_state(_target(m), {"acc": 0.5, "w": [1, 2]})
    assert isinstance(written, WrittenCheckpoint) and written.score_values == {"acc": 0.5}
    assert Path(written.path).parent == m.checkpoint_dir and Path(written.path).name.startswith(".tmp_")
    final = m.register(Path(written.path), written.score_values, 3)
    assert final.name == "checkpoint_000001" and not Path(written.path).exists()
    meta = json.loads((final / METADATA_FILE).read_text())
    assert meta["format"] == "dict" and meta["id"] == 1 and meta["iteration"] == 3 and meta["score"] == 0.5
    assert m.latest() == {"acc": 0.5, "w": [1, 2]}


def test_a_worker_on_another_host_writes_through_the_file_server_metadata_last(tmp_path):
    m = _manager(tmp_path)
    server = _FileServer()
    written = stage_state(_target(m), {"step": 1}, files=server)
    assert server.uploaded[-1] == METADATA_FILE and len(server.uploaded) == 2
    source = tmp_path / "model"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "w.bin").write_bytes(b"\x00\x01")
    (source / METADATA_FILE).write_text(json.dumps({"format": "dict", "id": 7}))  # an earlier one's: replaced
    server.uploaded.clear()
    directory = stage_directory(_target(m), str(source), files=server)
    assert server.uploaded == ["w.bin", METADATA_FILE]
    m.register(Path(written.path), {}, 1)
    final = m.register(Path(directory.path), {}, 2)
    assert Checkpoint.from_directory(final).to_dict() == {"_directory_files": {"sub/w.bin": b"\x00\x01"}}
    meta = json.loads((final / METADATA_FILE).read_text())
    assert meta["format"] == "directory" and meta["id"] == 2 and list(meta["files"]) == ["sub/w.bin"]
    # The same checkpoint written directly on the driver's host: the same folder.
    local = m.register(Path(stage_directory(_target(m), str(source)).path), {}, 3)
    assert Checkpoint.from_directory(local).to_dict() == Checkpoint.from_directory(final).to_dict()


def test_other_ranks_folders_are_merged_and_a_file_already_there_is_kept(tmp_path):
    m = _manager(tmp_path)
    parts = []
    for rank in range(3):
        source = tmp_path / f"rank{rank}"
        source.mkdir()
        (source / f"shard_{rank}.bin").write_bytes(bytes([rank]))
        (source / "common.txt").write_text(f"rank {rank}")
        parts.append(Path(stage_directory(_target(m), str(source)).path))
    final = m.register(parts[0], {}, 1, metrics={"loss": 1.0}, shards=parts[1:])
    files = Checkpoint.from_directory(final).to_dict()["_directory_files"]
    assert files == {"common.txt": b"rank 0", "shard_0.bin": b"\x00", "shard_1.bin": b"\x01", "shard_2.bin": b"\x02"}
    assert json.loads((final / METADATA_FILE).read_text())["metrics"] == {"loss": 1.0}
    assert not list(m.checkpoint_dir.glob(".tmp_*"))


def test_a_dict_checkpoint_is_not_merged_with_directories(tmp_path):
    m = _manager(tmp_path)
    first = Path(stage_state(_target(m), {"w": 1}).path)
    source = tmp_path / "dir"
    source.mkdir()
    (source / "x").write_text("x")
    other = Path(stage_directory(_target(m), str(source)).path)
    with pytest.raises(ValueError, match="cannot be merged"):
        m.register(first, {}, 1, shards=[other])
    assert m.latest_id == 0 and not list(m.checkpoint_dir.iterdir())
    # Other ranks' dict checkpoints are left out: the lowest rank's is the checkpoint.
    first, second = (Path(stage_state(_target(m), {"rank": r}).path) for r in (0, 1))
    final = m.register(first, {}, 1, shards=[second])
    assert Checkpoint.from_directory(final, trusted=True).to_dict() == {"rank": 0}
    assert not second.exists()


@pytest.mark.parametrize("where", ["outside", "final name", "symlink"])
def test_a_path_that_is_not_a_temporary_folder_of_the_checkpoint_folder_is_refused(tmp_path, where):
    m = _manager(tmp_path)
    kept = m.register(Path(stage_state(_target(m), {"step": 1}).path), {}, 1)
    if where == "outside":
        path = tmp_path / ".tmp_elsewhere"
        path.mkdir()
    elif where == "final name":
        path = kept
    else:
        path = m.checkpoint_dir / ".tmp_link"
        path.symlink_to(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a temporary folder"):
        m.register(path, {}, 2)
    assert m.latest_id == 1 and m.kept_ids == [1] and path.exists()
    m.discard([path])  # not ours to remove either
    assert path.exists() and kept.exists()


def test_num_to_keep_zero_holds_the_state_in_memory_and_nothing_on_disk(tmp_path):
    m = _manager(tmp_path, num_to_keep=0)
    written = stage_state(_target(m), {"step": 2})
    assert m.register(Path(written.path), {}, 2) is None
    assert m.latest_state == {"step": 2} and m.restorable() == {"step": 2} and m.latest_iteration == 2
    assert not m.checkpoint_dir.exists()


def test_a_bad_score_attribute_is_raised_after_the_checkpoint_is_committed(tmp_path):
    m = _manager(tmp_path, checkpoint_score_attribute="loss")
    written = stage_state(_target(m), {"acc": 1})
    with pytest.raises(ValueError, match="'loss' is not in the checkpoint"):
        m.register(Path(written.path), written.score_values, 1)
    assert m.kept_ids == [1] and m.latest() == {"acc": 1}


def test_the_old_import_paths_still_work():
    import sgd.checkpoint.manager as old
    import sgd.runs
    import sgd.storage.manager
    import sgd.storage.reading

    with pytest.warns(DeprecationWarning, match="sgd.storage.manager"):
        assert old.CheckpointManager is sgd.storage.manager.CheckpointManager
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(AttributeError):
            old.nothing_here  # noqa: B018
    assert sgd.runs.run_info is sgd.storage.reading.run_info
    info = sgd.runs.RunInfo("p", "FINISHED", 3, None, None)
    assert type(info).__module__ == "sgd.runs" and pickle.loads(pickle.dumps(info)) == info


def test_a_write_through_the_file_server_leaves_no_local_copy_and_says_what_failed(tmp_path, monkeypatch):
    import tempfile

    made = []
    real = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    m = _manager(tmp_path)
    stage_state(_target(m), {"step": 1}, files=_FileServer())
    assert made and not any(os.path.exists(p) for p in made)

    class Full(_FileServer):
        def upload(self, local, driver_path):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="could not write a checkpoint to .*the disk is full"):
        stage_state(_target(m), {"step": 2}, files=Full())
    assert not any(os.path.exists(p) for p in made)


def test_a_run_that_keeps_no_checkpoint_writes_without_fsync_and_restarts_from_the_state(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    kept = _manager(tmp_path / "kept")
    stage_state(_target(kept), {"step": 1})
    assert synced, "a checkpoint that is kept reaches the disk before it is reported"
    synced.clear()
    m = _manager(tmp_path / "none", num_to_keep=0)
    target = CheckpointTarget(str(m.checkpoint_dir), m.codec, m.strategy.checkpoint_score_attribute, durable=False)
    written = stage_state(target, {"step": 2})
    assert synced == []  # read back and deleted at once: no fsync
    assert m.register(Path(written.path), written.score_values, 2) is None
    assert m.restorable() == {"step": 2} and not Path(written.path).exists()


def _counting_loads(monkeypatch, name="pickle"):
    """Every decode by the codec ``name`` in this process, counted."""
    from sgd.checkpoint.codecs import get_codec

    codec_cls = type(get_codec(name))
    load, calls = codec_cls.load, []

    def counted(self, f, trusted, where):
        calls.append(where)
        return load(self, f, trusted, where)

    monkeypatch.setattr(codec_cls, "load", counted)
    return calls


def test_a_restart_reads_the_checkpoint_verified_and_leaves_decoding_it_to_the_workers(tmp_path, monkeypatch):
    """restorable(decode=False): the state file's bytes, checked against their digests, with the
    codec's name and the trust they were read with; the driver does not decode them (a torch
    checkpoint would import torch there). Decoded, they are the state; latest() still decodes."""
    from sgd.checkpoint.encoded import EncodedState

    m = _manager(tmp_path)
    m.register(Path(stage_state(_target(m), {"step": 2}).path), {}, 2)
    m.latest_state = None  # as after a restart that did not decode it
    loads = _counting_loads(monkeypatch)
    encoded = m.restorable(decode=False)
    assert isinstance(encoded, EncodedState) and loads == []
    assert encoded.codec == "pickle" and encoded.trusted is True  # this driver wrote it in this run
    assert encoded.decode() == {"step": 2} and len(loads) == 1
    assert m.latest() == {"step": 2} and m.latest_state == {"step": 2} and m.latest_iteration == 2

    # Damaged on disk: refused on the driver before anything is sent.
    state_file = m.checkpoint_dir / "checkpoint_000001" / "state.pkl"
    state_file.write_bytes(state_file.read_bytes()[:-1] + b"!")
    m.latest_state = None
    with pytest.raises(sgd.checkpoint.CheckpointIntegrityError, match="none of the checkpoints kept"):
        m.restorable(decode=False)


def test_an_undecoded_checkpoint_found_on_disk_keeps_the_trust_it_was_read_with(tmp_path, monkeypatch):
    """A checkpoint this driver did not write follows the trust switch; the switch travels with
    the bytes, so a worker decoding them refuses pickle as the driver would have."""
    from sgd.checkpoint import TRUST_ENV
    from sgd.errors import UntrustedCheckpointError

    m = _manager(tmp_path)
    m.register(Path(stage_state(_target(m), {"step": 2}).path), {}, 2)
    found = CheckpointManager(m.checkpoint_dir, sgd.CheckpointStrategy(), "pickle", start_id=1)
    encoded = found.restorable(decode=False)
    assert encoded.trusted is False
    with pytest.raises(UntrustedCheckpointError, match="trusted=True"):
        encoded.decode()
    monkeypatch.setenv(TRUST_ENV, "1")
    trusting = CheckpointManager(m.checkpoint_dir, sgd.CheckpointStrategy(), "pickle", start_id=1)
    assert trusting.restorable(decode=False).decode() == {"step": 2}
