"""Files between workers on hosts of their own and the driver's disk (sgd._worker.driver_files).

The server's rules are tested on the plain object; transfers go through a real Ray actor. The
multi-host path (shards from hosts with private disks, restored after a host loss) is in
tests/test_hosts.py.
"""

from __future__ import annotations

import os

import pytest
import ray

from sgd._worker import driver_files
from sgd._worker.driver_files import DriverFiles, DriverFileServer, start_server


def test_writes_and_reads_stay_inside_the_folders_the_driver_allowed(tmp_path):
    run, other, ckpt = tmp_path / "run", tmp_path / "other", tmp_path / "from"
    run.mkdir(), other.mkdir(), ckpt.mkdir()
    (ckpt / "shard").write_bytes(b"0123456789")
    (other / "secret").write_bytes(b"x")
    server = DriverFileServer([str(run)], [str(ckpt)])

    with pytest.raises(PermissionError, match="outside the folders this run may use"):
        server.write(str(other / "f"), 0, b"x")
    with pytest.raises(PermissionError, match="outside"):
        server.write(str(run / ".." / "other" / "f"), 0, b"x")  # .. resolved before the check
    os.symlink(other, run / "link")
    with pytest.raises(PermissionError, match="outside"):
        server.write(str(run / "link" / "f"), 0, b"x")  # nor through a symbolic link
    with pytest.raises(ValueError, match="not an absolute path"):
        server.write("relative/f", 0, b"x")
    with pytest.raises(PermissionError, match="outside"):
        server.read(str(other / "secret"), 0, 1)
    with pytest.raises(PermissionError, match="outside"):
        server.write(str(ckpt / "shard"), 0, b"x")  # the checkpoint it started from: read only
    assert server.read(str(ckpt / "shard"), 3, 4) == b"3456"
    assert not (other / "f").exists()


def test_a_request_waits_for_the_telling_of_its_runs_folders_and_only_for_that(tmp_path, monkeypatch):
    """The driver starts a run without waiting for the server to be told of its folders: the
    run's requests carry the telling's number and wait for it; other requests are refused at once."""
    import threading

    run, later = tmp_path / "run", tmp_path / "later"
    server = DriverFileServer([str(run)])
    monkeypatch.setattr(driver_files, "ALLOW_WAIT_S", 600.0)  # a wait it should not make would hang the test
    with pytest.raises(PermissionError, match="outside"):
        server.write(str(later / "f"), 0, b"x")  # told with no number: no telling to wait for
    server.allow([str(later)], [], number=1)
    with pytest.raises(PermissionError, match="outside"):
        server.write(str(tmp_path / "f"), 0, b"x", told=1)  # its telling arrived: refused at once

    # A request of the run told with number 2 that comes before that telling: it waits, then writes.
    done = []
    third = tmp_path / "third"
    writer = threading.Thread(target=lambda: done.append(server.write(str(third / "f"), 0, b"xyz", told=2)))
    writer.start()
    server.allow([str(third)], [], number=2)
    writer.join(60)
    assert done == [3] and (third / "f.sgd-part").read_bytes() == b"xyz"

    # One whose telling never comes is refused once the wait is over.
    monkeypatch.setattr(driver_files, "ALLOW_WAIT_S", 0.05)
    with pytest.raises(PermissionError, match="outside"):
        server.write(str(tmp_path / "fourth" / "f"), 0, b"x", told=3)


def test_a_file_appears_only_once_every_byte_arrived(tmp_path):
    server = DriverFileServer([str(tmp_path)])
    target = tmp_path / "sub" / "shard.distcp"
    server.write(str(target), 4, b"5678")
    assert not target.exists()
    server.write(str(target), 8, b"9")  # the file is 9 bytes long, with a hole
    with pytest.raises(OSError, match="5 of 9 bytes arrived"):
        server.commit(str(target), 9)
    assert not target.exists()
    server.write(str(target), 4, b"5678")
    server.write(str(target), 8, b"9")
    server.write(str(target), 0, b"1234")
    server.commit(str(target), 9)
    assert target.read_bytes() == b"123456789" and not list(tmp_path.rglob("*.sgd-part"))
    server.commit(str(tmp_path / "empty"), 0)
    assert (tmp_path / "empty").read_bytes() == b""


def test_upload_and_ranged_reads_through_a_ray_actor_in_chunks(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(driver_files, "CHUNK_BYTES", 1000)  # many chunks, more than the window in flight
    data = os.urandom(10_500)
    local = tmp_path / "local.bin"
    local.write_bytes(data)
    run = tmp_path / "run"
    server = start_server(ray.get_runtime_context().get_node_id(), [str(run)])
    try:
        files = DriverFiles(server)
        assert files.upload(str(local), str(run / "ckpt" / "f.bin")) == len(data)
        assert (run / "ckpt" / "f.bin").read_bytes() == data
        assert files.size(str(run / "ckpt" / "f.bin")) == len(data)
        assert files.read(str(run / "ckpt" / "f.bin"), 999, 3002) == data[999:4001]  # across 4 chunks
        with pytest.raises(PermissionError, match="outside"):
            files.upload(str(local), str(tmp_path / "elsewhere.bin"))
    finally:
        ray.kill(server)


def _as_on_a_host_of_its_own(config):
    """Every checkpoint this worker makes goes through a file server on the driver's host, as
    on a host with a disk of its own (here the same host: the path is the one tests/test_hosts.py
    takes with private disks)."""
    import tempfile
    from pathlib import Path

    import sgd
    from sgd.session import get_session

    session = get_session()
    server = start_server(ray.get_runtime_context().get_node_id(), [session.context.get_trial_dir()])
    uploads = []

    class Counted(DriverFiles):
        def upload(self, local_path, driver_path):
            uploads.append(os.path.basename(driver_path))
            return super().upload(local_path, driver_path)

    session._checkpoint_files = Counted(server)
    sgd.save_checkpoint(step=1)
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, f"shard_{sgd.world_rank()}.bin").write_bytes(bytes([sgd.world_rank()]) * 10)
        Path(folder, "common.txt").write_text(f"rank {sgd.world_rank()}")
        sgd.report({"step": 2}, checkpoint=sgd.Checkpoint.from_directory(folder))
    ray.kill(server)
    return uploads


def test_checkpoints_written_through_the_file_server_are_committed_like_any_other(ray_cluster, tmp_path):
    import sgd

    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, logdir=tmp_path)
    trainer.start()
    try:
        uploads = trainer.run(_as_on_a_host_of_its_own)
    finally:
        trainer.shutdown()
    assert uploads[0][-1] == ".sgd_checkpoint.json" and ".sgd_checkpoint.json" in uploads[1]  # metadata last
    folder = trainer.latest_checkpoint_dir
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint_000001", "checkpoint_000002"]
    assert sgd.Trainer.load_checkpoint_from_path(folder / "checkpoint_000001") == {"step": 1}
    files = sgd.Checkpoint.from_directory(folder / "checkpoint_000002").to_dict()["_directory_files"]
    assert files == {"common.txt": b"rank 0", "shard_0.bin": b"\x00" * 10, "shard_1.bin": b"\x01" * 10}
    assert not list(folder.rglob("*.sgd-part"))
