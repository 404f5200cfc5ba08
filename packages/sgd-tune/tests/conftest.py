"""Tune writes under pytest's tmp_path, never the home folder."""

import pytest


@pytest.fixture
def storage_path(tmp_path):
    path = tmp_path / "ray_results"
    path.mkdir()
    return str(path)


@pytest.fixture(autouse=True)
def _quiet_tune(monkeypatch):
    # The plain (old) console output: quieter in test logs.
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "0")
