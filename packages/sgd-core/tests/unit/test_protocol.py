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


def _batch_and_lines(reports, whens):
    """``ReportFields.lines`` of ``reports`` stamped at ``whens``, and what ``encode_line`` gives
    each of them with its detailed values."""
    from sgd._worker.report_fields import ReportFields

    fields = ReportFields()
    expected = [encode_line({**r, DETAIL_KEY: fields.detail(w)}) for r, w in zip(reports, whens)]
    batch = [dict(r, **{DETAIL_KEY: w}) for r, w in zip(reports, whens)]
    got = fields.lines(batch)
    assert all(DETAIL_KEY not in r for r in batch)  # the time is taken out: it is in the text
    return got, expected


@settings(max_examples=400, deadline=None)
@given(batch=st.lists(st.dictionaries(_NAMES, _VALUES, max_size=5), min_size=1, max_size=4),
       steps=st.lists(st.floats(min_value=0, max_value=2), min_size=4, max_size=4))
def test_a_batch_of_reports_is_encoded_to_the_same_text_as_encode_line_gives_each(batch, steps):
    """The one-encoder-call shortcut for a worker's batch of plain reports: the same bytes as each
    report encoded on its own, for anything (nested values, NaN, secret keys, names that clash
    with the detailed values, empty reports, a date that changes within the batch)."""
    reports = [dict(metrics, _timestamp=1795800000, _time_this_iter_s=0.25, _training_iteration=i + 1)
               if i % 2 == 0 else dict(metrics) for i, metrics in enumerate(batch)]
    whens = [1795800000.5 + sum(steps[:i + 1]) for i in range(len(reports))]
    got, expected = _batch_and_lines(reports, whens)
    assert got == expected


def test_the_common_batch_takes_the_shortcut_and_reads_back_whole(monkeypatch):
    import sgd._worker.report_fields as fields_module

    reports = [{"loss": 0.1 * i, "step": i, "name": 'a}, {"b'} for i in range(3)]
    calls = []
    monkeypatch.setattr(fields_module, "encode_line", lambda *a: calls.append(a) or encode_line(*a))
    monkeypatch.setattr(fields_module, "_TAILS", {})  # as in a new process
    got, expected = _batch_and_lines(reports, [1795800000.25, 1795800000.75, 1795800001.5])
    assert got == expected
    assert len(calls) == 1  # not one per report: once a process, for the text of the values every report shares
    rows = [json.loads(line) for line in got]
    assert [row["name"] for row in rows] == ['a}, {"b'] * 3  # the row break inside a string is no break
    assert rows[2]["_date"] != rows[0]["_date"] and rows[2]["_time_total_s"] > rows[0]["_time_total_s"]
    assert [{k: row[k] for k in ("loss", "step")} for row in rows] == [{"loss": 0.1 * i, "step": i} for i in range(3)]


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
