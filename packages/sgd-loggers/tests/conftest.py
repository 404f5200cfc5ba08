"""Fixtures for the sgd-loggers tests: synthetic rounds, a real MLflow server, offline W&B."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from sgd_testing import wait_for

#: A value that must never appear in any file a logger writes.
SECRET = "s3cr3t-VALUE-8c1f"

T0 = 1_700_000_000


def make_rounds(workers: int = 4, reports: int = 5):
    """``reports`` rounds of ``workers`` result dicts, as the driver hands them to callbacks."""
    rounds = []
    for it in range(1, reports + 1):
        rounds.append(
            [
                {
                    "loss": round(1.0 / it + rank / 10, 6),
                    "acc": {"top1": round(0.1 * it + 0.01 * rank, 6)},
                    "_timestamp": T0 + it,
                    "_time_this_iter_s": 0.25,
                    "_training_iteration": it,
                }
                for rank in range(workers)
            ]
        )
    return rounds


@pytest.fixture
def rounds():
    """4 workers x 5 reports."""
    return make_rounds()


@pytest.fixture(name="make_rounds")
def _make_rounds_fixture():
    return make_rounds


@pytest.fixture
def secret():
    return SECRET


@pytest.fixture(name="files_containing")
def _files_containing_fixture():
    return files_containing


@pytest.fixture(autouse=True)
def _offline_tools(monkeypatch, tmp_path_factory):
    """No logging library talks to the network or to the user's own settings."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path_factory.getbasetemp() / "wandb-config"))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    monkeypatch.setenv("SGD_LOGGERS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "sgd-loggers-cache"))
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` on a free loopback port, stopped by its pid at the end.

    Yields ``.url`` and ``.root`` (the folder holding its store and artifacts).

    Its SQLite store is a copy of the migrated empty store sgd-loggers caches (MLflow's
    own migrations cost seconds of CPU); artifacts are proxied into a temporary folder.
    """
    from sgd_loggers.mlflow_logger import local_tracking_uri

    root = tmp_path_factory.mktemp("mlflow-server")
    with pytest.MonkeyPatch.context() as mp:  # the same cache the tests use (see _offline_tools)
        mp.setenv("SGD_LOGGERS_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "sgd-loggers-cache"))
        backend_uri = local_tracking_uri(root / "store")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(root / "server.log", "wb")
    env = {
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # no job runner processes
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", backend_uri, "--artifacts-destination", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"mlflow server exited with {proc.returncode}:\n{(root / 'server.log').read_text()}")
        return _healthy(url)

    try:
        wait_for(up, timeout=180, interval=0.5, message=f"mlflow server on {url} not healthy within 180s")
        yield SimpleNamespace(url=url, root=root)
    finally:
        # The server runs uvicorn in a child process: stop the session it leads, by its pid.
        _stop_group(proc)
        log.close()


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the process group ``proc`` leads (the server and its uvicorn worker): TERM, then KILL."""

    def gone() -> bool:
        proc.poll()  # reap the leader, or it lingers as a zombie of the group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        return False

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            wait_for(gone, timeout=30, interval=0.2)
            return
        except AssertionError:
            continue


def files_containing(root: Path, needle: str):
    """Every file under ``root`` whose bytes contain ``needle``."""
    data = needle.encode()
    return [p for p in Path(root).rglob("*") if p.is_file() and data in p.read_bytes()]


def read_wandb_offline(run_dir: Path, timeout: float = 30) -> SimpleNamespace:
    """The one offline W&B run under ``run_dir/wandb``, once its exit record is written.

    W&B's service process writes the file asynchronously: ``run.finish()`` may return
    before the last records reach it, so wait (with a deadline) for the exit record.
    """
    return wait_for(lambda: (r := _read_wandb_file(run_dir)).exit_code is not None and r, timeout=timeout,
                    message=f"no W&B exit record under {run_dir} within {timeout}s")


def _read_wandb_file(run_dir: Path) -> SimpleNamespace:
    """Read the one offline W&B run under ``run_dir/wandb`` back from its ``.wandb`` file.

    The file is W&B's transaction log: a 7-byte header, then LevelDB-log-style records in
    32 KiB blocks (4-byte checksum, 2-byte length, 1-byte type: full/first/middle/last),
    each a protobuf ``wandb_internal_pb2.Record``. Nested history/summary keys are joined
    with ``.`` (a histogram ``h`` gives ``h._type``, ``h.values``, ``h.bins``).

    Returns ``.config`` (dict), ``.history`` (list of dicts, one per logged step),
    ``.summary`` (dict), ``.exit_code`` and ``.path`` (the run's folder).
    """
    import json
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = sorted(Path(run_dir, "wandb").glob("offline-run-*/run-*.wandb"))
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, pos, pending, payloads = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            payloads.append(pending + chunk)

    def key_of(item) -> str:
        return item.key or ".".join(item.nested_key)

    out = SimpleNamespace(config={}, history=[], summary={}, exit_code=None, path=path.parent)
    for payload in payloads:
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            for item in record.run.config.update:
                out.config[item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                out.config[key_of(item)] = json.loads(item.value_json)
        elif kind == "history":
            out.history.append({key_of(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                out.summary[key_of(item)] = json.loads(item.value_json)
        elif kind == "exit":
            out.exit_code = record.exit.exit_code
    out.config.pop("_wandb", None)
    return out


@pytest.fixture(name="read_wandb_offline")
def _read_wandb_offline_fixture():
    return read_wandb_offline
