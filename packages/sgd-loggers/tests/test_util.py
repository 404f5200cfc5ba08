"""Shared helpers (redaction, flattening, conversion) and the missing-extra install hints."""

from __future__ import annotations

import math
import pickle
import sys

import pytest

import sgd_loggers
from sgd_loggers._util import clean, flatten, histogram_values, is_secret_key, redact, scalar, to_jsonable


@pytest.mark.parametrize(
    "key", ["api_key", "WANDB_API_KEY", "apiKey", "api-key", "token", "refresh_token", "Tokens", "password",
            "DB_PASSWORD", "secret", "client_secret", "MySecretThing"],
)
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["loss", "lr", "api", "key", "pass", "tok", "secretary"[:5] + "e", 3, None])
def test_not_secret_keys(key):
    assert not is_secret_key(key)


def test_redact_any_level_keeps_the_rest():
    value = {"a": 1, "Token": "x",
             "b": {"password": "x", "c": [{"secret_sauce": 1, "d": 2}, 3], "e": ("x", {"api_key": 1})}}
    assert redact(value) == {"a": 1, "b": {"c": [{"d": 2}, 3], "e": ("x", {})}}
    assert value["Token"] == "x"  # the caller's dict is not changed


def test_flatten_and_clean():
    assert flatten({"a": {"b": {"c": 1}, "d": 2}, "e": [1, {"f": 2}], "g": {}}) == {
        "a/b/c": 1, "a/d": 2, "e": [1, {"f": 2}], "g": {}}
    assert clean({"opt": {"lr": 0.1, "token": "x"}, 1: "int key"}) == {"opt/lr": 0.1, "1": "int key"}


def test_scalar_and_histogram_values():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    assert scalar(1) == 1.0 and scalar(True) == 1.0 and scalar(np.int64(3)) == 3.0
    assert scalar(torch.tensor(2.5)) == 2.5 and scalar(np.array(4.0)) == 4.0
    assert math.isnan(scalar(float("nan"))) and scalar(-math.inf) == -math.inf
    assert scalar("1") is None and scalar(None) is None and scalar([1]) is None and scalar(1j) is None
    assert histogram_values([1, 2.5, math.nan, math.inf]) == [1.0, 2.5]
    assert sorted(histogram_values(np.arange(4).reshape(2, 2))) == [0.0, 1.0, 2.0, 3.0]
    assert histogram_values(torch.ones(3)) == [1.0, 1.0, 1.0]
    assert histogram_values([]) is None and histogram_values(["a"]) is None and histogram_values([math.nan]) is None


def test_to_jsonable():
    np = pytest.importorskip("numpy")
    assert to_jsonable({"a": math.nan, "b": [math.inf, -math.inf], "c": np.float64(0.5), "d": {1, 2} and (1, 2),
                        "api_key": "x"}) == {"a": "NaN", "b": ["Infinity", "-Infinity"], "c": 0.5, "d": [1, 2]}


@pytest.mark.parametrize(
    "cls, module, extra",
    [("TBXLoggerCallback", "tensorboardX", "tensorboard"), ("MLflowLoggerCallback", "mlflow", "mlflow"),
     ("WandbLoggerCallback", "wandb", "wandb")],
)
def test_missing_library_names_the_extra(monkeypatch, cls, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(ImportError) as info:
        getattr(sgd_loggers, cls)()
    message = str(info.value)
    assert message == (f"{cls} needs the '{module}' package, which is not installed: "
                       f"pip install 'sgd-loggers[{extra}]'")


def test_callbacks_pickle_before_and_after_a_run(tmp_path):
    pytest.importorskip("tensorboardX")
    callbacks = [sgd_loggers.JsonLoggerCallback(), sgd_loggers.CSVLoggerCallback(), sgd_loggers.TBXLoggerCallback(),
                 sgd_loggers.PrintCallback(), sgd_loggers.ProgressCallback()]
    for cb in callbacks:
        pickle.loads(pickle.dumps(cb))
        cb.start_training(logdir=str(tmp_path), config={})
        copy = pickle.loads(pickle.dumps(cb))  # open files/writers are not carried over
        cb.finish_training()
        copy.finish_training()
