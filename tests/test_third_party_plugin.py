"""A third-party backend, in its own distribution installed during the test, is found by
its entry-point name, runs, and is listed by `sgd plugins` with the broken and duplicate
entry points of the same distribution reported, not crashing anything.

The distribution is installed with ``pip install --target`` into a temporary folder put
on ``sys.path``, so a failed test can never leave it in the environment.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sgd
from sgd import plugins

HERE = Path(__file__).parent
DIST = HERE / "plugins" / "sgd-dummy-backend"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(DIST)],
        check=True,
    )
    sys.path.insert(0, str(target))
    plugins.reset()
    try:
        yield target
    finally:
        sys.path.remove(str(target))
        for name in [m for m in sys.modules if m.startswith("sgd_dummy")]:
            del sys.modules[name]
        plugins.reset()


def _cli(target, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "sgd", *args], capture_output=True, text=True, env=env, check=True)


def test_found_by_entry_point_name(installed):
    spec = plugins.available_backends()["dummy"]
    assert spec.provider == "sgd-dummy-backend"
    assert spec.config_cls.__module__ == "sgd_dummy.plugin"


def test_runs_as_a_backend(installed, ray_cluster):
    import ray.cloudpickle
    import sgd_dummy.plugin

    # The workers of this test cluster were started before the package existed;
    # ship the plugin's worker-side functions by value instead of by import.
    ray.cloudpickle.register_pickle_by_value(sgd_dummy.plugin)
    try:
        trainer = sgd.Trainer(backend="dummy", num_workers=2)
        trainer.start()
        try:
            assert trainer.run(lambda: os.environ["DUMMY_BACKEND_RANK"]) == ["dummy-0", "dummy-1"]
        finally:
            trainer.shutdown()
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sgd_dummy.plugin)


def _session_and_pid():
    return os.environ["DUMMY_BACKEND_SESSION"], os.getpid()


def test_stateful_backend_keeps_one_object_across_runs_and_a_restart(installed, ray_cluster, tmp_path):
    import ray.cloudpickle
    import sgd_dummy.plugin
    from sgd_dummy.plugin import DummyBackend

    ray.cloudpickle.register_pickle_by_value(sgd_dummy.plugin)
    made_before = len(DummyBackend.instances)
    try:
        trainer = sgd.Trainer(backend="dummy", num_workers=2, max_retries=1)
        trainer.start()
        try:
            first = trainer.run(_session_and_pid)
            second = trainer.run(_session_and_pid)
            assert first == second  # the same workers, the same backend session

            def dies_once(config):
                sgd.report(step=1)
                if sgd.world_rank() == 1 and not os.path.exists(config["marker"]):
                    open(config["marker"], "w").close()
                    os._exit(1)  # rank 1's process dies: the group restarts, the run goes on
                sgd.report(step=2)
                return _session_and_pid()

            after = trainer.run(dies_once, config={"marker": str(tmp_path / "died")})
        finally:
            trainer.shutdown()
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sgd_dummy.plugin)
    made = DummyBackend.instances[made_before:]
    assert len(made) == 1, f"{len(made)} backend objects for one trainer"
    backend = made[0]
    assert backend.events == ["start", "training_start", "training_start", "training_start",
                              "failure", "start", "training_start", "shutdown"]
    # The restarted workers are new processes that got the session the object kept.
    assert [s for s, _ in after] == [s for s, _ in first]
    assert {p for _, p in after}.isdisjoint({p for _, p in first})
    assert backend.session is None  # closed by on_shutdown


def test_listed_with_failures_and_conflicts(installed):
    table = _cli(installed, "plugins").stdout
    lines = table.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("dummy "))
    dummy_row = lines[row]
    assert "dummy" in dummy_row.split()[2] and "dummyfs" in dummy_row
    assert "0.0.1" in dummy_row
    assert lines[row + 1].strip() == "callbacks: DummyCallback"   # callbacks under the plugin's row
    assert max(len(line) for line in lines) <= 100
    assert "failed to load" in table and "dummy-broken" in table and "needs the 'jax' package" in table
    assert "conflict: backend 'torch'" in table

    data = json.loads(_cli(installed, "plugins", "--json").stdout)
    names = {p["name"]: p for p in data["plugins"]}
    assert names["dummy"]["backends"] == ["dummy"]
    assert names["dummy"]["distribution"] == "sgd-dummy-backend"
    assert [f["name"] for f in data["failed"]] == ["dummy-broken"]
    assert set(data["conflicts"]["torch"]) == {"sgd-torch", "sgd-dummy-backend"}


def test_duplicate_backend_name_is_an_error_when_asked_for(installed):
    with pytest.raises(ValueError, match="more than one plugin"):
        sgd.Trainer(backend="torch")
    assert sgd.Trainer(backend="dummy").backend_config.name == "dummy"


def test_sgd_plugins_env_limits_loading(installed):
    env = dict(os.environ, PYTHONPATH=str(installed), SGD_PLUGINS="dummy")
    out = subprocess.run([sys.executable, "-m", "sgd", "plugins", "--json"], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert sorted(p["name"] for p in json.loads(out)["plugins"]) == ["dummy", "sgd-core"]
