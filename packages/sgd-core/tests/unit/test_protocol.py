"""The report wire format: each worker encodes its report's results.jsonl text, and the driver
writes a round by joining them (issue 20). No Ray here: the functions the two sides call."""

import json
import math
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from sgd._common.protocol import (
    CHECKPOINT_KEY,
    DETAIL_KEY,
    LINE_KEY,
    REPORT,
    decode_items,
    decode_round,
    encode_line,
    encode_stamped,
    plain_report,
)


def _report(**metrics):
    data = dict(metrics, _training_iteration=1)
    data[DETAIL_KEY] = {"_pid": 7, "_hostname": "h"}
    return data


def test_the_line_is_the_full_report_without_secrets_or_checkpoint():
    data = _report(loss=0.5, api_key="s3cr3t", nested={"token": 1, "a": [1, {"password": 2, "b": 3}]})
    data[CHECKPOINT_KEY] = object()  # travels beside the report, never into the file
    row = json.loads(encode_line(data))
    assert row == {"loss": 0.5, "nested": {"a": [1, {"b": 3}]}, "_training_iteration": 1, "_pid": 7, "_hostname": "h"}


def test_values_json_cannot_hold_are_spelled_not_raised():
    row = json.loads(encode_line(_report(nan=math.nan, inf=-math.inf, obj=object(), t=(1, 2))))
    assert row["nan"] == "NaN" and row["inf"] == "-Infinity" and row["t"] == [1, 2]
    assert row["obj"].startswith("<object object")
    # A key JSON cannot hold drops that entry only.
    assert json.loads(encode_line(_report(**{"ok": 1}) | {(1, 2): "x"}))["ok"] == 1


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_NAMES = st.one_of(st.text(max_size=8), st.sampled_from(["_date", "_pid", "api_key", "password", "loss", "é"]))


@settings(max_examples=400, deadline=None)
@given(metrics=st.dictionaries(_NAMES, _VALUES, max_size=5),
       total=st.one_of(st.floats(), st.integers()),
       date=st.one_of(st.text(max_size=20), st.integers()),
       host=st.text(max_size=6), shape=st.sampled_from(["stamped", "reordered", "short"]))
def test_a_stamped_report_is_encoded_to_the_same_text_as_encode_line_gives(metrics, total, date, host, shape):
    """The shortcut for a worker's plain report: the same bytes for anything, the common report
    (plain values, sgd's five detailed values as stamped) and every other case it hands on."""
    metrics = dict(metrics, _timestamp=1795800000, _time_this_iter_s=0.25, _training_iteration=3)
    detail = {"_date": date, "_time_total_s": total, "_pid": 4242, "_hostname": host, "_node_ip": "10.0.0.7"}
    if shape == "reordered":
        detail = dict(reversed(list(detail.items())))
    elif shape == "short":
        del detail["_node_ip"]
    assert encode_stamped(dict(metrics), detail) == encode_line({**metrics, DETAIL_KEY: detail})


def test_the_common_report_takes_the_shortcut_and_reads_back_whole():
    detail = {"_date": "2026-11-27_21-00-00", "_time_total_s": 1.5e-05, "_pid": 9, "_hostname": "vm",
              "_node_ip": "1.2.3.4"}
    line = encode_stamped({"loss": 0.1, "step": 2}, detail)
    assert json.loads(line) == {"loss": 0.1, "step": 2, **detail}
    assert line == encode_line({"loss": 0.1, "step": 2, DETAIL_KEY: detail})


def test_a_decoded_round_hands_out_plain_results_and_one_line():
    items = []
    for rank in range(3):
        data = _report(rank=rank)
        data[LINE_KEY] = encode_line(data)
        items.append(data)
    items[1][CHECKPOINT_KEY] = {"w": 1}
    round_ = decode_round("report", items)
    assert round_.results == [{"rank": r, "_training_iteration": 1} for r in range(3)]
    assert round_.checkpoints == [None, {"w": 1}, None]
    assert [row["rank"] for row in json.loads(round_.json_line())] == [0, 1, 2]
    assert round_.full_result(1)["_pid"] == 7 and "_pid" not in round_.results[1]
    round_.add_details()  # what the driver does when the detailed metrics are asked for
    assert round_.results[2]["_hostname"] == "h"


def test_the_detailed_values_travel_in_the_line_only_and_are_read_back_exactly():
    """A polled report without a checkpoint leaves its detail dict behind (it is in the line):
    a third less to unpickle on the driver for each report. Asked for, they come back exact."""
    from sgd._worker.session import STATE, Session, WorkerContext

    def train():
        import sgd

        sgd.report(loss=0.25, _pid_like="mine")

    session = Session(train, WorkerContext(world_size=1), lambda d: d)
    STATE.session = session
    try:
        session.start()
        session.join()
        batch, finished, _, error = session.poll(10)
    finally:
        STATE.session = None
    assert finished and error is None
    (item,) = batch
    kind, data, line = item  # a plain report travels as three parts: no dict holds the line
    assert kind == REPORT and DETAIL_KEY not in data and LINE_KEY not in data
    assert json.loads(line)["loss"] == 0.25
    round_ = decode_items([item])
    assert "_pid" not in round_.results[0]  # handed out without them unless asked for
    full = round_.full_result(0)
    assert full["_pid"] == os.getpid() and isinstance(full["_time_total_s"], float)
    assert set(full) >= {"_date", "_time_total_s", "_pid", "_hostname", "_node_ip", "loss"}
    round_.add_details()
    assert round_.results[0] == full


def test_a_round_of_plain_reports_and_a_reported_checkpoint_decodes_each_part_to_its_place():
    """The driver's fast path takes a round of plain reports apart without touching a dict; a
    round where one rank passed a checkpoint (its item keeps the two-part form) decodes the same."""
    plain = []
    for rank in range(3):
        data = _report(rank=rank)
        line = encode_line(data)
        del data[DETAIL_KEY]
        plain.append(plain_report(data, line))
    fast = decode_items(plain)
    assert fast.results == [{"rank": r, "_training_iteration": 1} for r in range(3)]
    assert fast.checkpoints == [None] * 3 and not fast.has_reported_checkpoint
    assert [row["rank"] for row in json.loads(fast.json_line())] == [0, 1, 2]
    assert fast.full_result(2)["_hostname"] == "h"  # read back from its line

    with_checkpoint = _report(rank=0)
    with_checkpoint[LINE_KEY] = encode_line(with_checkpoint)
    with_checkpoint[CHECKPOINT_KEY] = {"w": 1}
    mixed = decode_items([(REPORT, with_checkpoint), *plain[1:]])
    assert mixed.results == fast.results and mixed.has_reported_checkpoint
    assert mixed.checkpoints == [{"w": 1}, None, None]
    assert mixed.details[0] == {"_pid": 7, "_hostname": "h"} and mixed.details[1] is None
    assert mixed.json_line() == fast.json_line()


def test_a_report_without_a_worker_line_is_encoded_by_the_driver():
    data = _report(x=1, secret="no")
    round_ = decode_round("report", [data])
    assert json.loads(round_.json_line()) == [{"x": 1, "_training_iteration": 1, "_pid": 7, "_hostname": "h"}]


def test_a_peer_failure_is_known_by_its_flag_or_its_message():
    from sgd._common.protocol import RemoteError
    from sgd.group.rounds import looks_like_peer_failure

    def error(message, **kw):
        return RemoteError(None, "mod.SomeError", message, "", 1, 7, "h", **kw)

    assert not error("allreduce: rank 0 went away").peer_failure  # the default
    assert not looks_like_peer_failure(error("allreduce: rank 0 went away"))
    assert looks_like_peer_failure(error("allreduce: rank 0 went away", peer_failure=True))
    assert looks_like_peer_failure(error("Connection reset by peer"))
