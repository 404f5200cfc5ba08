"""TBXLoggerCallback: event files read back with tensorboard's own event reader."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

from sgd_loggers import TBXLoggerCallback  # noqa: E402


def read_events(logdir):
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def steps(acc, tag):
    return [e.step for e in acc.Scalars(tag)]


def values(acc, tag):
    return [e.value for e in acc.Scalars(tag)]


def test_scalars_tags_steps_and_values(tmp_path, rounds):
    cb = TBXLoggerCallback()
    cb.start_training(logdir=str(tmp_path), config={"lr": 0.1})
    for round_ in rounds:
        cb.handle_result(round_)
    cb.finish_training()
    acc = read_events(tmp_path)
    assert sorted(acc.Tags()["scalars"]) == sorted(
        ["sgd/loss", "sgd/acc/top1", "sgd/_timestamp", "sgd/_time_this_iter_s", "sgd/_training_iteration"]
    )
    for tag in acc.Tags()["scalars"]:
        assert steps(acc, tag) == [1, 2, 3, 4, 5], tag
    # Stored as float32.
    assert values(acc, "sgd/loss") == pytest.approx([r[0]["loss"] for r in rounds], rel=1e-6)
    assert values(acc, "sgd/loss") == pytest.approx([1.0, 0.5, 0.333333, 0.25, 0.2], rel=1e-6)
    assert values(acc, "sgd/acc/top1") == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5], rel=1e-6)
    assert values(acc, "sgd/_training_iteration") == [1, 2, 3, 4, 5]
    assert [e.wall_time for e in acc.Scalars("sgd/loss")] == [1_700_000_000 + it for it in range(1, 6)]


def test_worker_to_log_and_steps_from_training_iteration(tmp_path, rounds):
    cb = TBXLoggerCallback(worker_to_log=2)
    cb.start_training(logdir=str(tmp_path), config={})
    for round_ in rounds[::2]:  # iterations 1, 3, 5: steps follow _training_iteration, not a counter
        cb.handle_result(round_)
    cb.finish_training()
    acc = read_events(tmp_path)
    assert steps(acc, "sgd/loss") == [1, 3, 5]
    assert values(acc, "sgd/loss") == pytest.approx([1.2, 0.533333, 0.4], rel=1e-6)


def test_lists_as_histograms_non_finite_and_non_numeric(tmp_path):
    np = pytest.importorskip("numpy")
    cb = TBXLoggerCallback()
    cb.start_training(logdir=str(tmp_path), config={})
    cb.handle_result([{"_training_iteration": 1, "grads": [1.0, 2.0, 3.0, float("nan")], "w": np.arange(4.0),
                       "nan": float("nan"), "inf": float("inf"), "name": "abc", "words": ["a", "b"], "empty": [],
                       "flag": True}])
    cb.finish_training()
    acc = read_events(tmp_path)
    assert sorted(acc.Tags()["histograms"]) == ["sgd/grads", "sgd/w"]
    grads = acc.Histograms("sgd/grads")[0]
    assert grads.step == 1
    h = grads.histogram_value
    assert (h.num, h.sum, h.min, h.max) == (3, 6.0, 1.0, 3.0)  # the NaN element is dropped
    w = acc.Histograms("sgd/w")[0].histogram_value
    assert (w.num, w.sum, w.min, w.max) == (4, 6.0, 0.0, 3.0)
    assert sorted(acc.Tags()["scalars"]) == ["sgd/_training_iteration", "sgd/flag", "sgd/inf", "sgd/nan"]
    assert math.isnan(acc.Scalars("sgd/nan")[0].value)
    assert acc.Scalars("sgd/inf")[0].value == math.inf
    assert acc.Scalars("sgd/flag")[0].value == 1.0


def test_config_text_and_no_secrets(tmp_path, secret, files_containing):
    cb = TBXLoggerCallback(logdir="tb")
    cb.start_training(logdir=str(tmp_path), config={"lr": 0.125, "wandb": {"API_KEY": secret}, "token": secret})
    cb.handle_result([{"_training_iteration": 1, "loss": 0.5, "my_secret": 123.0, "db": {"password": 7}}])
    cb.finish_training()
    acc = read_events(tmp_path / "tb")
    assert "sgd/db/password" not in acc.Tags()["scalars"] and "sgd/my_secret" not in acc.Tags()["scalars"]
    assert (steps(acc, "sgd/loss"), values(acc, "sgd/loss")) == ([1], [0.5])
    (text_event,) = acc.Tensors("sgd/config/text_summary")
    text = text_event.tensor_proto.string_val[0].decode()
    assert '"lr": 0.125' in text and '"wandb": {}' in text
    assert files_containing(tmp_path, secret) == []
    assert files_containing(tmp_path, "0.125") != []  # the grep would see a written value
