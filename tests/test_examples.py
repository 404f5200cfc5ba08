"""Every example in examples/ runs in quick mode (``--smoke-test``) and gets the answer it should.

The examples mirror Ray Train 1.x's own (each header names which); they are imported and their
``main`` called in this process, on the session's Ray cluster.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name):
    import ray.cloudpickle

    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    ray.cloudpickle.register_pickle_by_value(module)  # the workers cannot import examples/
    return module


def test_every_example_names_the_ray_train_example_it_mirrors():
    for path in sorted(EXAMPLES.glob("*.py")):
        head = path.read_text().split('"""')[1]
        assert "Mirrors Ray Train" in head, path.name


def test_train_linear(ray_cluster):
    results = load("train_linear").main(["--smoke-test"])
    assert len(results) == 2 and all(len(r) == 1 for r in results)
    # Each worker evaluates its half of the data; an untrained model's loss is in the hundreds.
    assert all(0 < r[0]["loss"] < 10 for r in results)


def test_digits(ray_cluster):
    pytest.importorskip("sklearn")
    assert load("digits").main(["--smoke-test"]) == 0  # validation accuracy above 90%


def test_ray_data_linear(ray_cluster):
    results = load("ray_data_linear").main(["--smoke-test"])
    losses = [r["loss"] for r in results[0]]
    assert len(losses) == 2 and losses[1] < losses[0]


def test_tune_linear(ray_cluster, tmp_path):
    pytest.importorskip("ray.tune")
    analysis = load("tune_linear").main(["--smoke-test", "--storage-path", str(tmp_path)])
    assert len(analysis.trials) == 2 and all(t.status == "TERMINATED" for t in analysis.trials)
    assert analysis.get_best_config(metric="loss", mode="min")["lr"] in (1e-2, 5e-3)


def test_tensorflow_digits(ray_cluster):
    pytest.importorskip("tensorflow")
    pytest.importorskip("sklearn")
    results = load("tensorflow_digits").main(["--smoke-test"])
    (w0, w1) = results
    assert w0 == pytest.approx(w1)  # synchronised workers: the same losses and model
    assert w0[1] < w0[0] and w0[-1] > 0.8  # loss falls; accuracy on the digits above 80%


def test_horovod_linear(ray_cluster):
    pytest.importorskip("horovod.torch")
    results = load("horovod_linear").main(["--smoke-test"])
    (w0, w1) = results
    assert w0[-1] == pytest.approx(w1[-1])  # the same weight on both workers after allreduce
    assert abs(w0[-1] - 2.0) < 1.0  # heading for the true slope (an untrained one is within ±1 of 0)


def test_transformers_tiny(ray_cluster):
    pytest.importorskip("transformers")
    results = load("transformers_tiny").main(["--smoke-test"])
    for losses in results:
        assert len(losses) == 2 and losses[1] < losses[0]


def test_lightning_regression(ray_cluster, tmp_path):
    pytest.importorskip("lightning")
    result = load("lightning_regression").main(["--smoke-test", "--storage-path", str(tmp_path)])
    df = result.metrics_dataframe
    assert list(df["epoch"]) == [0, 1, 2]
    assert df["loss"].iloc[-1] < df["loss"].iloc[0]
