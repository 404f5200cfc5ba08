"""Trainer construction and argument checking: no workers are started here."""

import os
from pathlib import Path

import pytest

import sgd
from sgd.utils import wrap_train_func


def test_unknown_backend_lists_installed_and_names_package():
    with pytest.raises(ValueError) as info:
        sgd.Trainer(backend="jax")
    msg = str(info.value)
    assert "unknown backend 'jax'" in msg
    assert "installed:" in msg
    assert "sgd-jax" in msg


def test_known_backend_name_points_to_its_package(monkeypatch):
    from sgd import plugins

    # As if no backend package were installed.
    monkeypatch.setenv("SGD_DISABLE_PLUGIN_AUTOLOAD", "1")
    plugins.reset()
    try:
        for name in ("torch", "tensorflow", "horovod"):
            with pytest.raises(ValueError, match=f"sgd-{name}"):
                sgd.Trainer(backend=name)
    finally:
        monkeypatch.delenv("SGD_DISABLE_PLUGIN_AUTOLOAD")
        plugins.reset()


@pytest.mark.parametrize("backend", [1, None, ["torch"], object()])
def test_backend_of_wrong_type_is_type_error(backend):
    with pytest.raises(TypeError, match="BackendConfig"):
        sgd.Trainer(backend=backend)


@pytest.mark.parametrize("n", [-1, 1.5, True, (0, 2), (3, 2), (1, 2, 3)])  # 0 is local mode
def test_bad_num_workers(n):
    with pytest.raises(ValueError, match="num_workers"):
        sgd.Trainer(backend=sgd.BackendConfig(), num_workers=n)


def test_elastic_range_accepted():
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=(1, 3))
    assert trainer.num_workers == 3
    assert "1-3" in str(trainer)


def test_resources_default_and_not_mutated():
    given = {"CPU": 2, "custom": 1}
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, resources_per_worker=given)
    assert given == {"CPU": 2, "custom": 1}
    assert trainer.resources_per_worker == {"CPU": 2, "GPU": 0, "custom": 1}
    assert sgd.Trainer(backend=sgd.BackendConfig()).resources_per_worker == {"CPU": 1, "GPU": 0}


def test_gpu_contradictions():
    with pytest.raises(ValueError, match="use_gpu=False"):
        sgd.Trainer(backend=sgd.BackendConfig(), resources_per_worker={"GPU": 1})
    with pytest.raises(ValueError, match="use_gpu=True"):
        sgd.Trainer(backend=sgd.BackendConfig(), use_gpu=True, resources_per_worker={"GPU": 0})
    assert sgd.Trainer(backend=sgd.BackendConfig(), use_gpu=True).resources_per_worker["GPU"] == 1


def test_negative_resource_rejected():
    with pytest.raises(ValueError, match="CPU"):
        sgd.Trainer(backend=sgd.BackendConfig(), resources_per_worker={"CPU": -1})


def test_max_retries_checked():
    with pytest.raises(ValueError, match="max_retries"):
        sgd.Trainer(backend=sgd.BackendConfig(), max_retries=-2)


def test_logdir_resolution(results_dir, monkeypatch, tmp_path):
    default = sgd.Trainer(backend=sgd.BackendConfig()).logdir
    assert default.parent == results_dir.resolve()
    assert default.name.startswith("train_")
    assert sgd.Trainer(backend=sgd.BackendConfig(), logdir="exp").logdir == results_dir.resolve() / "exp"
    assert sgd.Trainer(backend=sgd.BackendConfig(), logdir=tmp_path / "abs").logdir == tmp_path / "abs"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert sgd.Trainer(backend=sgd.BackendConfig(), logdir="~/x").logdir == tmp_path / "x"
    assert isinstance(default, Path)


def test_run_before_start_is_runtime_error():
    trainer = sgd.Trainer(backend=sgd.BackendConfig())
    with pytest.raises(RuntimeError, match="start"):
        trainer.run(lambda: None)
    with pytest.raises(RuntimeError, match="start"):
        trainer.run_iterator(lambda: None)


def test_train_func_arity():
    assert wrap_train_func(lambda: 1, None)() == 1
    assert wrap_train_func(lambda c: c, None)() == {}
    assert wrap_train_func(lambda c: c, {"a": 1})() == {"a": 1}
    assert wrap_train_func(lambda c=5: c, {"a": 1})() == {"a": 1}
    assert wrap_train_func(lambda *a: a, {"a": 1})() == ({"a": 1},)

    def two(config, extra):
        pass

    with pytest.raises(ValueError, match="two"):
        wrap_train_func(two, None)
    trainer = sgd.Trainer(backend=sgd.BackendConfig())
    with pytest.raises(ValueError, match="none or one"):
        trainer.run(two)
    with pytest.raises(TypeError):
        wrap_train_func(3, None)


def test_str_is_a_resource_table():
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=3, resources_per_worker={"CPU": 2, "acc": 0.5})
    text = str(trainer)
    assert "| CPUs     | 2          | 6     |" in text
    assert "acc" in text and "1.5" in text
    assert "base" in text


def test_to_tune_trainable_without_sgd_tune(monkeypatch):
    from sgd import plugins

    # As if sgd-tune were not installed: no plugin answers the tune hook.
    monkeypatch.setenv("SGD_DISABLE_PLUGIN_AUTOLOAD", "1")
    plugins.reset()
    try:
        trainer = sgd.Trainer(backend=sgd.BackendConfig())
        with pytest.raises(ImportError, match="sgd-tune"):
            trainer.to_tune_trainable(lambda: None)
    finally:
        monkeypatch.delenv("SGD_DISABLE_PLUGIN_AUTOLOAD")
        plugins.reset()


def test_an_unreachable_head_fails_fast_naming_its_address():
    """Ray retries an unreachable RAY_ADDRESS for minutes; sgd says what is wrong at once."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port on loopback that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = ("import sgd\n"
              "try:\n"
              "    sgd.Trainer(backend='base', num_workers=1).start()\n"
              "except ConnectionError as e:\n"
              "    print('ERROR:', e)\n")
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}", "SGD_CONNECT_TIMEOUT_S": "2"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert f"ERROR: cannot reach the Ray head at 127.0.0.1:{port} (RAY_ADDRESS)" in out.stdout, out.stderr[-2000:]
    assert "ray start --head" in out.stdout


@pytest.mark.parametrize("value", [-1, "soon", float("nan"), True])
def test_placement_timeout_must_be_seconds(value):
    with pytest.raises(ValueError, match="placement_timeout_s must be a number of seconds"):
        sgd.Trainer(backend="base", placement_timeout_s=value)
    with pytest.raises(ValueError, match="placement_timeout_s must be a number of seconds"):
        sgd.FailureConfig(placement_timeout_s=value)
