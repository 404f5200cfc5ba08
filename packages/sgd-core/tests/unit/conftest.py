"""The unit tier (``nox -s unit``): no Ray, no subprocess. A test here that reaches for either
fails at once, naming what it called, instead of quietly starting a cluster."""

import subprocess

import pytest
import ray


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} called in the unit tier (packages/sgd-core/tests/unit): "
                             "move the test to packages/sgd-core/tests/ or use sgd_testing.FakeGroup")
    return refuse


@pytest.fixture(autouse=True)
def _no_ray_no_subprocess(monkeypatch):
    for name in ("init", "get", "wait", "remote"):
        monkeypatch.setattr(ray, name, _refuse(f"ray.{name}"))
    monkeypatch.setattr(subprocess, "Popen", _refuse("subprocess.Popen"))
