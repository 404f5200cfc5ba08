"""The one secret rule (sgd.redact), shared by the run directory and every logger."""

from collections import OrderedDict

from sgd.redact import redact


def test_secrets_are_removed_at_any_depth_and_containers_keep_their_kind():
    value = {"a": 1, "api_key": "x", "n": {"token": 1, "b": [1, {"password": 2, "c": (3, {"secret_x": 1})}]},
             "o": OrderedDict(x=1, my_token=2), "API-Key": "y"}
    assert redact(value) == {"a": 1, "n": {"b": [1, {"c": (3, {})}]}, "o": {"x": 1}}
    assert isinstance(redact(value)["n"]["b"][1]["c"], tuple)


def test_a_clean_dict_is_copied_not_returned():
    report = {"loss": 0.5, "step": 3, "name": "x", "none": None}
    out = redact(report)
    assert out == report and out is not report
    out["loss"] = 1.0
    assert report["loss"] == 0.5


def test_the_same_keys_with_a_secret_added_later_are_still_checked():
    assert redact({"a": 1, "b": 2}) == {"a": 1, "b": 2}
    assert redact({"a": 1, "b_token": 2}) == {"a": 1}

