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
