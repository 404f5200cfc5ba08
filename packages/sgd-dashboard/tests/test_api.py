"""Every JSON endpoint of the dashboard on run folders written by runfolders.py (no Ray)."""

from __future__ import annotations

import csv
import io
import json

import runfolders as rf


def test_runs_table(results, client_for):
    rf.make_run(results / "exp_a", rounds=10, mtime=rf.T0)
    rf.make_run(results / "exp_b", rounds=3, status="ERRORED", mtime=rf.T0 + 100)
    rf.make_run(results / "tune" / "trial_0", "run", rounds=4, settings={"trial_id": "abc_00000"}, mtime=rf.T0 + 50)
    body = client_for(results).get("/api/runs").json()
    assert body["root"] == str(results.resolve())
    by_name = {r["name"]: r for r in body["runs"]}
    assert set(by_name) == {"exp_a/run_001", "exp_b/run_001", "tune/trial_0/run"}
    a = by_name["exp_a/run_001"]
    assert (a["status"], a["num_workers"], a["iterations"], a["trial"]) == ("FINISHED", 2, 10, False)
    assert a["started"] == rf.T0 and a["ended"] == rf.T0 + 11 and a["duration_s"] == 11
    assert a["metric"]["name"] == "loss" and a["metric"]["last"] == 0.1
    assert a["metric"]["spark"][0] == 1.0 and len(a["metric"]["spark"]) == 10
    assert by_name["tune/trial_0/run"]["trial"] is True
    assert [r["name"] for r in body["runs"]] == ["exp_b/run_001", "tune/trial_0/run", "exp_a/run_001"]  # newest first
    assert len({r["id"] for r in body["runs"]}) == 3 and all(len(r["id"]) == 12 for r in body["runs"])


def test_runs_filter_and_sort(results, client_for):
    for n, status in enumerate(["FINISHED", "ERRORED", "FINISHED"]):
        rf.make_run(results / f"exp_{n}", rounds=5 + n, status=status, mtime=rf.T0 + n)
    client = client_for(results)
    names = lambda **p: [r["name"] for r in client.get("/api/runs", params=p).json()["runs"]]  # noqa: E731
    assert names(q="EXP_1") == ["exp_1/run_001"]
    assert names(status="errored") == ["exp_1/run_001"]
    assert names(status="FINISHED,ERRORED", sort="name") == ["exp_0/run_001", "exp_1/run_001", "exp_2/run_001"]
    assert names(sort="-iterations") == ["exp_2/run_001", "exp_1/run_001", "exp_0/run_001"]
    bad = client.get("/api/runs", params={"sort": "size"})
    assert bad.status_code == 400 and "sort by one of" in bad.json()["error"]


def test_a_single_run_folder_as_the_root(results, client_for):
    run = rf.make_run(results, "run_007", rounds=3)
    (row,) = client_for(run).get("/api/runs").json()["runs"]
    assert row["name"] == "run_007" and row["iterations"] == 3


def test_run_detail(one_run):
    client, rid, _ = one_run
    body = client.get(f"/api/runs/{rid}").json()
    assert body["id"] == rid and body["name"] == "exp/run_001" and body["status"] == "FINISHED"
    assert body["metrics"] == ["loss", "acc"]
    assert body["settings"]["run_config"] == {"lr": 0.1}  # the key that looks like a secret is left out
    assert body["error"] is None and body["stacks_allowed"] is False and body["num_workers"] == 2
    assert body["iterations"] == 10 and body["has_events"] is True and body["problems"] == []


def test_run_error_from_its_events(results, client_for):
    events = [rf.event("run_started", rf.T0, pid=1, host="h"),
              rf.event("worker_failed", rf.T0 + 1, rank=1, host="h", pid=1001, error_type="ValueError",
                       message="bad batch", traceback="Traceback ...\nValueError: bad batch", phase="train",
                       died=False),
              rf.event("run_failed", rf.T0 + 2, error_type="TrainingFailedError", message="rank 1 failed",
                       traceback="Traceback (most recent call last):\n ...")]
    rf.make_run(results, rounds=3, status="ERRORED", events=events)
    client = client_for(results)
    (row,) = client.get("/api/runs").json()["runs"]
    body = client.get(f"/api/runs/{row['id']}").json()
    assert body["error"] == {"error_type": "TrainingFailedError", "message": "rank 1 failed",
                             "traceback": "Traceback (most recent call last):\n ..."}
    workers = client.get(f"/api/runs/{row['id']}/workers").json()["workers"]
    assert [(w["rank"], w["state"]) for w in workers] == [(0, "gone"), (1, "failed")]


def test_metrics(one_run):
    client, rid, _ = one_run
    body = client.get(f"/api/runs/{rid}/metrics", params={"names": "loss,acc"}).json()
    assert body["x_axis"] == "iteration" and body["total_points"] == 10 and body["downsampled"] is False
    assert body["complete"] is True and body["offset"] > 0
    assert [(s["name"], s["rank"]) for s in body["series"]] == [("loss", 0), ("acc", 0)]
    assert body["series"][0]["x"] == list(range(1, 11)) and body["series"][0]["y"][1] == 0.5
    every = client.get(f"/api/runs/{rid}/metrics", params={"names": "loss", "ranks": "all", "x": "time"}).json()
    assert [(s["name"], s["rank"]) for s in every["series"]] == [("loss", 0), ("loss", 1)]
    assert every["x_axis"] == "time" and every["series"][1]["x"][0] == rf.T0 + 1
    assert every["series"][1]["y"][0] == 2.0


def test_metrics_downsampled_keeps_minima_and_maxima(results, client_for):
    spike = {500: 100.0, 777: -50.0}
    rf.make_run(results, rounds=2000, ranks=1, metrics=lambda i, r: {"loss": spike.get(i, 1.0)})
    client = client_for(results)
    (row,) = client.get("/api/runs").json()["runs"]
    body = client.get(f"/api/runs/{row['id']}/metrics", params={"names": "loss", "max_points": 100}).json()
    (series,) = body["series"]
    assert body["downsampled"] is True and body["total_points"] == 2000
    assert len(series["x"]) <= 100 and series["x"] == sorted(series["x"])
    assert 100.0 in series["y"] and -50.0 in series["y"]
    assert series["x"][series["y"].index(100.0)] == 500 and series["x"][series["y"].index(-50.0)] == 777


def test_metrics_refusals(one_run):
    client, rid, _ = one_run
    cases = [({}, "no metric asked for"), ({"names": "nope"}, "no numeric metric 'nope'"),
             ({"names": "loss", "x": "epoch"}, "x='epoch' is not an axis"),
             ({"names": "loss", "ranks": "first"}, "ranks='first'"),
             ({"names": "loss", "max_points": "many"}, "not a whole number"),
             ({"names": "loss", "max_points": "1"}, "max_points=1"),
             ({"names": ",".join(f"m{i}" for i in range(65))}, "at most 64")]
    for params, words in cases:
        r = client.get(f"/api/runs/{rid}/metrics", params=params)
        assert r.status_code == 400 and words in r.json()["error"], (params, r.text)


def test_export_csv_and_json(one_run):
    client, rid, _ = one_run
    r = client.get(f"/api/runs/{rid}/export", params={"names": "loss", "ranks": "all"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert 'filename="exp_run_001-metrics.csv"' in r.headers["content-disposition"]
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0] == ["metric", "rank", "iteration", "value"] and len(rows) == 21
    assert rows[1] == ["loss", "0", "1", "1.0"]
    data = client.get(f"/api/runs/{rid}/export", params={"names": "acc", "format": "json"}).json()
    assert data["series"][0]["y"][-1] == 0.1 and data["downsampled"] is False
    bad = client.get(f"/api/runs/{rid}/export", params={"names": "acc", "format": "xlsx"})
    assert bad.status_code == 400 and "format=csv or format=json" in bad.json()["error"]


def test_events(one_run):
    client, rid, run = one_run
    body = client.get(f"/api/runs/{rid}/events").json()
    assert [e["event"] for e in body["events"]] == ["run_started", "attempt_started", "run_finished"]
    assert body["bad_lines"] == 0 and body["offset"] == (run / "events.jsonl").stat().st_size
    rf.append(run / "events.jsonl", rf.event("mystery_kind", rf.T0 + 20, what="a kind this sgd does not know"))
    again = client.get(f"/api/runs/{rid}/events").json()
    assert again["events"][-1] == {"v": 1, "time": rf.T0 + 20, "event": "mystery_kind",
                                   "what": "a kind this sgd does not know"}


def test_workers_and_the_straggler_rule(results, client_for):
    # rank 2 takes 0.6 s a round against 0.5 s for the others: >= 1.1 x the median (0.5 s)
    rf.make_run(results, rounds=30, ranks=3, status="RUNNING", pid=__import__("os").getpid(),
                dt=lambda i, r: 0.6 if r == 2 else 0.5)
    client = client_for(results)
    (row,) = client.get("/api/runs").json()["runs"]
    assert row["status"] == "RUNNING"
    workers = client.get(f"/api/runs/{row['id']}/workers").json()["workers"]
    assert [(w["rank"], w["pid"], w["state"], w["straggler"]) for w in workers] == [
        (0, 1000, "running", False), (1, 1001, "running", False), (2, 1002, "running", True)]
    assert abs(workers[2]["s_per_iter"] - 0.6) < 1e-9 and workers[0]["since_last_report_s"] > 0


def test_the_slower_of_two_ranks_is_a_straggler(results, client_for):
    # the console's rule with 2 ranks: the median is the faster rank's time
    rf.make_run(results, rounds=30, ranks=2, status="RUNNING", pid=__import__("os").getpid(),
                dt=lambda i, r: 0.6 if r == 1 else 0.5)
    client = client_for(results)
    (row,) = client.get("/api/runs").json()["runs"]
    workers = client.get(f"/api/runs/{row['id']}/workers").json()["workers"]
    assert [w["straggler"] for w in workers] == [False, True]


def test_checkpoints(one_run):
    client, rid, run = one_run
    rows = client.get(f"/api/runs/{rid}/checkpoints").json()["checkpoints"]
    assert [(c["name"], c["iteration"], c["verified"], c["best"], c["latest"], c["resume"]) for c in rows] == [
        ("checkpoint_000005", 5, True, False, False, False), ("checkpoint_000010", 10, True, True, True, True)]
    assert rows[0]["bytes"] > len(b"weights") and rows[0]["metrics"]["loss"] == 0.2 and rows[0]["score"] == 5.0


def test_logs_by_attempt_with_search(one_run):
    client, rid, run = one_run
    rf.append(run / "logs" / "rank_1.log", "=== rank 1: pid 2001 on otherhost, 2026-11-29 00:01:00 ===\n"
                                           "restarted from checkpoint_000005\nrank 1 step 6\n")
    logs = client.get(f"/api/runs/{rid}/logs").json()["logs"]
    assert [(g["id"], g["rank"], g["attempt"], g["pid"]) for g in logs] == [
        ("0-1", 0, 1, 1000), ("1-1", 1, 1, 1001), ("1-2", 1, 2, 2001)]
    second = client.get(f"/api/runs/{rid}/logs/1-2").json()
    assert second["text"].startswith("=== rank 1: pid 2001 on otherhost") and second["text"].endswith("step 6\n")
    assert second["offset"] == second["size"] == logs[2]["bytes"]
    first = client.get(f"/api/runs/{rid}/logs/1-1", params={"offset": 10}).json()
    assert first["start"] == 10 and "restarted" not in first["text"] and first["text"].endswith("rank 1 step 10\n")
    found = client.get(f"/api/runs/{rid}/logs/1-1", params={"q": "STEP 1"}).json()
    assert found["text"].split("\n") == ["rank 1 step 1", "rank 1 step 10"] and found["matches"] == 2
    assert client.get(f"/api/runs/{rid}/logs/1-3").status_code == 404
    bad = client.get(f"/api/runs/{rid}/logs/1-1", params={"offset": "-5"})
    assert bad.status_code == 400 and "0 or more" in bad.json()["error"]


def test_unknown_run_and_route(results, client_for):
    client = client_for(results)
    r = client.get("/api/runs/0123456789ab")
    assert r.status_code == 404 and "ids come from /api/runs" in r.json()["error"]
    r = client.get("/api/nothing")
    assert r.status_code == 404 and json.loads(r.text)["error"].startswith("nothing at /api/nothing")


def test_page_and_static_files(results, client_for):
    client = client_for(results)
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/static/index.html").status_code == 200
