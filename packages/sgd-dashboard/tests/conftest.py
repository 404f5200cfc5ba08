"""Fixtures of the dashboard's tests: run folders (runfolders.py), a test client, a live server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Tuple

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # runfolders and serving, for the browser tests too

import runfolders

BASE = "http://127.0.0.1:6007"


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """An empty results folder."""
    folder = tmp_path / "results"
    folder.mkdir()
    return folder


@pytest.fixture
def client_for():
    """``client_for(root, **create_app kwargs)``: a TestClient of a dashboard, as the browser
    that opened ``http://127.0.0.1:6007/``."""
    from starlette.testclient import TestClient

    from sgd_dashboard import create_app

    made: List[Any] = []

    def make(root: Path, base_url: str = BASE, **kwargs: Any) -> Any:
        client = TestClient(create_app(root, **kwargs), base_url=base_url)
        made.append(client)
        return client

    yield make
    for c in made:
        c.close()


@pytest.fixture
def one_run(results: Path, client_for) -> Tuple[Any, str, Path]:
    """A finished two-rank run of 10 rounds with checkpoints, events and logs: (client, id, folder)."""
    run = runfolders.make_run(results / "exp", checkpoints=[5, 10], mtime=runfolders.T0)
    client = client_for(results)
    (row,) = client.get("/api/runs").json()["runs"]
    return client, row["id"], run
