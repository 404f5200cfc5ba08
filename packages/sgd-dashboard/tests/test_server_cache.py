"""What keeps the server fast and its memory bounded: the run index re-reads only runs whose files
changed, a run's columns are read once and then only by what was appended, the runs held are an
LRU bounded in bytes, and the min/max downsampling."""

from __future__ import annotations

import numpy as np
import runfolders as rf

from sgd_dashboard import columns as columns_module
from sgd_dashboard import index as index_module
from sgd_dashboard.columns import ColumnCache, RunColumns
from sgd_dashboard.files import Root
from sgd_dashboard.series import minmax_indices


def test_the_index_reads_only_runs_that_changed(results, client_for, monkeypatch):
    runs = [rf.make_run(results / f"exp_{n}", rounds=3) for n in range(5)]
    calls = []
    real = index_module.summarize
    monkeypatch.setattr(index_module, "summarize", lambda *a: calls.append(a[1]) or real(*a))
    client = client_for(results)
    assert len(client.get("/api/runs").json()["runs"]) == 5 and len(calls) == 5
    calls.clear()
    client.get("/api/runs")
    assert calls == []  # nothing changed: nothing read
    rf.append(runs[2] / "results.jsonl", rf.round_line(4))
    rows = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
    assert calls == [runs[2]] and rows["exp_2/run_001"]["iterations"] == 4
    calls.clear()
    rf.make_run(results / "exp_new", rounds=1)
    assert len(client.get("/api/runs").json()["runs"]) == 6 and [p.parent.name for p in calls] == ["exp_new"]


def test_columns_read_only_what_was_appended(results, monkeypatch):
    run = rf.make_run(results, rounds=4)
    added = []
    real = RunColumns._add
    monkeypatch.setattr(RunColumns, "_add", lambda self, raw: added.append(raw) or real(self, raw))
    cols = RunColumns(Root(results), run / "results.jsonl")
    assert cols.catch_up() and cols.rows == 4 and len(added) == 4
    assert cols.catch_up() and len(added) == 4
    rf.append(run / "results.jsonl", rf.round_line(5) + rf.round_line(6)[:30])
    assert cols.catch_up() and cols.rows == 5 and len(added) == 5  # the half line waits
    assert cols.offset == (run / "results.jsonl").stat().st_size - 30
    assert list(cols.column("loss", 1)) == [2.0, 1.5, 1 + 1 / 3, 1.25, 1.2]
    assert list(cols.names) == ["loss", "acc"] and cols.ranks == 2


def test_a_metric_that_appears_later_and_a_rank_that_goes(results):
    def metrics(i, r):
        return {"loss": float(i), **({"late": 10.0 * i} if i > 2 else {})}

    run = rf.make_run(results, rounds=4, ranks=2, metrics=metrics)
    rf.append(run / "results.jsonl", rf.round_line(5, ranks=1, metrics=metrics))  # resized to one rank
    cols = RunColumns(Root(results), run / "results.jsonl")
    assert cols.catch_up()
    as_list = lambda a: [None if v != v else v for v in a]  # noqa: E731
    assert as_list(cols.column("late", 0)) == [None, None, 30.0, 40.0, 50.0]
    assert as_list(cols.column("loss", 1)) == [1.0, 2.0, 3.0, 4.0, None]
    assert as_list(cols.column("_training_iteration", 1)) == [1, 2, 3, 4, None]


def test_the_runs_held_are_bounded_in_bytes(results):
    root = Root(results)
    paths = [rf.make_run(results, f"run_{n}", rounds=200) / "results.jsonl" for n in range(3)]
    one = RunColumns(root, paths[0])
    one.catch_up()
    cache = ColumnCache(max_bytes=int(one.nbytes() * 1.5))
    held = []
    for n, path in enumerate(paths):
        cols = cache.get(f"id{n}", root, path)
        cols.catch_up()
        held.append(cols)
        cache.get(f"id{n}", root, path)  # evicts what no longer fits
    assert cache.held() == ["id2"] and held[0].closed and held[1].closed and not held[2].closed
    assert cache.get("id2", root, paths[2]) is held[2]
    cache.close()
    assert cache.held() == [] and held[2].closed


def test_a_replaced_results_file_starts_over(results):
    run = rf.make_run(results, rounds=5)
    cache = ColumnCache()
    cols = cache.get("x", Root(results), run / "results.jsonl")
    cols.catch_up()
    (run / "results.jsonl").write_text(rf.round_line(1))
    again = cache.get("x", Root(results), run / "results.jsonl")
    assert again is not cols and again.catch_up() and again.rows == 1


def test_background_reading_waits_for_requests(results, monkeypatch):
    monkeypatch.setattr(columns_module, "SYNC_BYTES", 1000)
    run = rf.make_run(results, rounds=300)
    cols = RunColumns(Root(results), run / "results.jsonl")
    with columns_module.FOREGROUND:
        assert cols.catch_up() is False and cols.reading
        assert cols.rows == 0  # held back while a request is answered
    cols._thread.join(60)  # type: ignore[union-attr]
    assert cols.rows == 300 and cols.catch_up()


def test_minmax_downsampling():
    y = np.arange(10, dtype=float)
    assert list(minmax_indices(y, 20)) == list(range(10))
    y = np.ones(1000)
    y[123], y[877] = 50.0, -50.0
    keep = minmax_indices(y, 10)
    assert len(keep) <= 10 and 123 in keep and 877 in keep and list(keep) == sorted(keep)
    y = np.full(100, np.nan)
    y[:10] = 1.0
    keep = minmax_indices(y, 10)  # buckets with no number keep one point: a gap
    assert all(np.isnan(y[k]) for k in keep if k >= 10) and len(keep) <= 10
    assert len(minmax_indices(np.random.default_rng(0).random(1_000_001), 2000)) <= 2000


def test_a_sparkline_point_read_fast_is_the_decoded_one():
    import json

    from sgd_dashboard.index import _number_of, _spark_value, _value, first_result

    lines = [[{"loss": 1.5, "a": 2}, {"loss": 9}], [{"a": 2, "loss": -3e-5}], [{"model": {"loss": 7}, "loss": 1.0}],
             [{"s": "x}y", "loss": 4}], [{"s": 'a, "loss": 5'}], [{"loss": "nan"}], [{"loss": None}], [{"x": 1}],
             [{"loss2": 3, "loss": 5}], [{"<img src=x onerror=alert(1)>": 2}], [{"loss": 1e308, "b": [1, {"c": 2}]}]]
    for line in lines:
        raw = json.dumps(line).encode()
        for metric in ("loss", "<img src=x onerror=alert(1)>"):
            assert _spark_value(raw, metric, _number_of(metric)) == _value(first_result(raw), metric), (line, metric)
    assert _spark_value(b'[{"loss": NaN}]', "loss", _number_of("loss")) is None
    assert _spark_value(b'[{"loss": 2.5, "_pid": 1}]', "loss", _number_of("loss")) == 2.5
