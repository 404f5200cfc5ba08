"""JsonLoggerCallback and CSVLoggerCallback: exact file contents, validity after every round, crashes."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest

from sgd_loggers import CSVLoggerCallback, JsonLoggerCallback
from sgd_testing import sigkill_when


def run_callback(cb, run_dir, rounds, config=None, check=None):
    cb.start_training(logdir=str(run_dir), config=config or {})
    for i, round_ in enumerate(rounds):
        cb.handle_result(round_)
        if check:
            check(i + 1)
    cb.finish_training(error=False)


# --- JSON ------------------------------------------------------------------------------


FIRST_LINE_RANK0 = (
    '[{"loss": 1.0, "acc": {"top1": 0.1}, "_timestamp": 1700000001, "_time_this_iter_s": 0.25, '
    '"_training_iteration": 1}],'
)


@pytest.mark.parametrize(
    "workers_to_log, ranks",
    [(0, [0]), (None, [0, 1, 2, 3]), ([0, 1], [0, 1]), ([3, 1], [3, 1])],
)
def test_json_exact_contents(tmp_path, rounds, workers_to_log, ranks):
    cb = JsonLoggerCallback(workers_to_log=workers_to_log)
    run_callback(cb, tmp_path, rounds)
    text = (tmp_path / "results.json").read_text()
    expected = [[round_[r] for r in ranks] for round_ in rounds]
    assert json.loads(text) == expected
    # Layout: the bracket, one round per line, the bracket.
    lines = text.split("\n")
    assert lines[0] == "[" and lines[-2:] == ["]", ""] and len(lines) == 5 + 3
    assert lines[1:6] == [json.dumps(e) + ("," if i < 4 else "") for i, e in enumerate(expected)]
    if workers_to_log == 0:
        assert lines[1] == FIRST_LINE_RANK0


def test_json_valid_after_every_round(tmp_path, rounds):
    path = tmp_path / "results.json"

    def check(n):
        assert json.loads(path.read_text()) == rounds[:n]

    cb = JsonLoggerCallback(workers_to_log=None)
    cb.start_training(logdir=str(tmp_path), config={})
    assert json.loads(path.read_text()) == []  # valid before the first round too
    for i, round_ in enumerate(rounds):
        cb.handle_result(round_)
        check(i + 1)
    # No finish_training: a run that crashed still leaves a complete file.
    assert json.loads(path.read_text()) == rounds


def test_json_killed_writer_leaves_valid_file(tmp_path):
    """SIGKILL a process in the middle of writing rounds as fast as it can: the file parses."""
    script = textwrap.dedent(
        f"""
        from sgd_loggers import JsonLoggerCallback
        cb = JsonLoggerCallback(workers_to_log=None)
        cb.start_training(logdir={str(tmp_path)!r}, config={{}})
        it = 0
        while True:
            it += 1
            cb.handle_result([{{"_training_iteration": it, "rank": r, "x": list(range(200))}} for r in range(4)])
        """
    )
    path = tmp_path / "results.json"

    def many_rounds():
        try:
            return len(json.loads(path.read_bytes())) >= 300
        except (OSError, ValueError):  # not created yet, or read while a write is in flight
            return False

    sigkill_when(script, many_rounds, timeout=60, message="the writer did not get to 300 rounds")
    data = json.loads(path.read_bytes())
    assert len(data) >= 300
    assert [r[0]["_training_iteration"] for r in data] == list(range(1, len(data) + 1))
    assert all(len(r) == 4 for r in data)


def test_json_non_finite_and_odd_values(tmp_path):
    np = pytest.importorskip("numpy")
    cb = JsonLoggerCallback()
    odd = object()
    run_callback(cb, tmp_path, [[{
        "nan": float("nan"), "inf": float("inf"), "ninf": -float("inf"),
        "np": np.float32(0.5), "arr": np.array([1.0, np.nan]), "obj": odd, "tuple": (1, 2), "none": None,
    }]])
    text = (tmp_path / "results.json").read_text()
    assert json.loads(text) == [[{
        "nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "np": 0.5, "arr": [1.0, "NaN"],
        "obj": str(odd), "tuple": [1, 2], "none": None,
    }]]
    assert "NaN," not in text.replace('"NaN"', "")  # no bare NaN token: strict JSON


def test_json_leaves_out_secrets(tmp_path, secret, files_containing):
    cb = JsonLoggerCallback()
    run_callback(cb, tmp_path, [[{"loss": 1.0, "API_KEY": secret, "auth": {"Token": secret, "user": "me"},
                                  "items": [{"password": secret, "ok": 1}]}]], config={"secret": secret})
    assert json.loads((tmp_path / "results.json").read_text()) == [[{"loss": 1.0, "auth": {"user": "me"},
                                                                     "items": [{"ok": 1}]}]]
    assert files_containing(tmp_path, secret) == []


def test_json_logdir_filename_and_reuse(tmp_path, rounds):
    cb = JsonLoggerCallback(logdir="logs", filename="r.json")
    run_callback(cb, tmp_path / "run_001", rounds[:2])
    run_callback(cb, tmp_path / "run_002", rounds[2:])
    assert json.loads((tmp_path / "run_001" / "logs" / "r.json").read_text()) == [[r[0]] for r in rounds[:2]]
    assert json.loads((tmp_path / "run_002" / "logs" / "r.json").read_text()) == [[r[0]] for r in rounds[2:]]


def test_json_resumed_run_keeps_earlier_rounds(tmp_path, rounds):
    first = JsonLoggerCallback()
    first.start_training(logdir=str(tmp_path), config={})
    for round_ in rounds[:3]:
        first.handle_result(round_)
    # The driver died here; Trainer.restore starts the callbacks again in the same run dir.
    second = JsonLoggerCallback()
    run_callback(second, tmp_path, rounds[3:])
    assert json.loads((tmp_path / "results.json").read_text()) == [[r[0]] for r in rounds]


@pytest.mark.parametrize("bad", [-1, "0", 1.5, [], [0, 0], True])
def test_json_rejects_bad_workers_to_log(bad):
    with pytest.raises(ValueError, match="workers_to_log"):
        JsonLoggerCallback(workers_to_log=bad)


def test_json_missing_worker_is_a_clear_error(tmp_path, rounds):
    cb = JsonLoggerCallback(workers_to_log=[0, 5])
    cb.start_training(logdir=str(tmp_path), config={})
    with pytest.raises(ValueError, match=r"workers_to_log=\[0, 5\] but this round has results from 4 worker"):
        cb.handle_result(rounds[0])


def test_handle_result_before_start_is_an_error(rounds):
    with pytest.raises(RuntimeError, match="before start_training"):
        JsonLoggerCallback().handle_result(rounds[0])
    with pytest.raises(RuntimeError, match="before start_training"):
        CSVLoggerCallback().handle_result(rounds[0])


# --- CSV -----------------------------------------------------------------------------------

HEADER = "loss,acc/top1,_timestamp,_time_this_iter_s,_training_iteration"
RANK0_ROWS = [
    "1.0,0.1,1700000001,0.25,1",
    "0.5,0.2,1700000002,0.25,2",
    "0.333333,0.3,1700000003,0.25,3",
    "0.25,0.4,1700000004,0.25,4",
    "0.2,0.5,1700000005,0.25,5",
]
RANK1_ROWS = [
    "1.1,0.11,1700000001,0.25,1",
    "0.6,0.21,1700000002,0.25,2",
    "0.433333,0.31,1700000003,0.25,3",
    "0.35,0.41,1700000004,0.25,4",
    "0.3,0.51,1700000005,0.25,5",
]


def test_csv_exact_contents_one_worker(tmp_path, rounds):
    run_callback(CSVLoggerCallback(), tmp_path, rounds)
    assert (tmp_path / "results.csv").read_text() == "\n".join([HEADER, *RANK0_ROWS]) + "\n"
    run_callback(CSVLoggerCallback(filename="w1.csv", worker_to_log=1), tmp_path, rounds)
    assert (tmp_path / "w1.csv").read_text() == "\n".join([HEADER, *RANK1_ROWS]) + "\n"


def test_csv_exact_contents_several_workers(tmp_path, rounds):
    run_callback(CSVLoggerCallback(worker_to_log=[0, 1]), tmp_path, rounds)
    rows = [f"{rank},{row}" for r0, r1 in zip(RANK0_ROWS, RANK1_ROWS) for rank, row in ((0, r0), (1, r1))]
    assert (tmp_path / "results.csv").read_text() == "\n".join(["_world_rank," + HEADER, *rows]) + "\n"

    run_callback(CSVLoggerCallback(filename="all.csv", worker_to_log=None), tmp_path, rounds)
    with open(tmp_path / "all.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 20
    assert [(row["_world_rank"], row["_training_iteration"]) for row in table] == [
        (str(rank), str(it)) for it in range(1, 6) for rank in range(4)
    ]
    assert table[-1] == {"_world_rank": "3", "loss": "0.5", "acc/top1": "0.53", "_timestamp": "1700000005",
                         "_time_this_iter_s": "0.25", "_training_iteration": "5"}


def test_csv_header_grows_with_new_keys(tmp_path):
    cb = CSVLoggerCallback()
    cb.start_training(logdir=str(tmp_path), config={})
    cb.handle_result([{"a": 1, "_training_iteration": 1}])
    cb.handle_result([{"a": 2, "_training_iteration": 2}])
    assert (tmp_path / "results.csv").read_text() == "a,_training_iteration\n1,1\n2,2\n"
    cb.handle_result([{"a": 3, "val": {"loss": 0.5}, "_training_iteration": 3}])
    cb.handle_result([{"_training_iteration": 4, "a": 4}])
    cb.finish_training()
    assert (tmp_path / "results.csv").read_text() == (
        "a,_training_iteration,val/loss\n1,1,\n2,2,\n3,3,0.5\n4,4,\n"
    )


def test_csv_non_finite_non_numeric_and_secrets(tmp_path, secret, files_containing):
    cb = CSVLoggerCallback()
    run_callback(cb, tmp_path, [[{
        "nan": float("nan"), "inf": float("inf"), "text": 'say "hi", ok', "list": [1, float("nan")],
        "none": None, "flag": True, "user_token": secret, "cfg": {"db_password": secret, "host": "h"},
    }]], config={"api_key": secret})
    with open(tmp_path / "results.csv", newline="") as f:
        assert list(csv.reader(f)) == [
            ["nan", "inf", "text", "list", "none", "flag", "cfg/host"],
            ["nan", "inf", 'say "hi", ok', '[1, "NaN"]', "", "True", "h"],
        ]
    assert files_containing(tmp_path, secret) == []


def test_csv_resumed_run_keeps_earlier_rows(tmp_path, rounds):
    first = CSVLoggerCallback()
    first.start_training(logdir=str(tmp_path), config={})
    for round_ in rounds[:2]:
        first.handle_result(round_)
    second = CSVLoggerCallback()
    run_callback(second, tmp_path, rounds[2:])
    assert (tmp_path / "results.csv").read_text() == "\n".join([HEADER, *RANK0_ROWS]) + "\n"
