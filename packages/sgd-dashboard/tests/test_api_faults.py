"""Bad input and faults (issue 54): files being written or damaged, older runs, odd metric values,
many metrics, hostile metric names. Each is shown for what it is, the rest still shown, and the
server keeps serving."""

from __future__ import annotations

import math

import runfolders as rf

from sgd_testing import wait_for


def _only(client):
    (row,) = client.get("/api/runs").json()["runs"]
    return row


def test_a_half_written_last_line_waits_for_its_end(results, client_for):
    run = rf.make_run(results, rounds=5, status="RUNNING")
    line = rf.round_line(6)
    rf.append(run / "results.jsonl", line[:40])
    client = client_for(results)
    rid = _only(client)["id"]
    body = client.get(f"/api/runs/{rid}/metrics", params={"names": "loss"}).json()
    assert body["series"][0]["x"] == [1, 2, 3, 4, 5] and body["bad_lines"] == 0
    assert _only(client)["iterations"] == 5
    rf.append(run / "results.jsonl", line[40:])
    body = client.get(f"/api/runs/{rid}/metrics", params={"names": "loss"}).json()
    assert body["series"][0]["x"] == [1, 2, 3, 4, 5, 6] and body["offset"] == (run / "results.jsonl").stat().st_size
    assert _only(client)["iterations"] == 6


def test_damaged_results_lines_are_counted_and_passed_over(results, client_for):
    run = rf.make_run(results, rounds=3)
    rf.append(run / "results.jsonl", '{"not": "a round"\n[1, 2, 3]\n\x00\x01garbage\n' + rf.round_line(4))
    client = client_for(results)
    rid = _only(client)["id"]
    body = client.get(f"/api/runs/{rid}/metrics", params={"names": "loss"}).json()
    assert body["series"][0]["x"] == [1, 2, 3, 4] and body["bad_lines"] == 3
    assert client.get(f"/api/runs/{rid}/workers").status_code == 200


def test_damaged_events_lines(results, client_for):
    events = [rf.event("run_started", rf.T0, pid=1), "{broken json\n", '"a string"\n',
              rf.event("restart", rf.T0 + 5, attempt=2, checkpoint="checkpoint_000002", iteration=2, num_workers=2)]
    rf.make_run(results, rounds=3, events=events)
    client = client_for(results)
    rid = _only(client)["id"]
    body = client.get(f"/api/runs/{rid}/events").json()
    assert [e["event"] for e in body["events"]] == ["run_started", "restart"] and body["bad_lines"] == 2
    assert "2 damaged line(s)" in " ".join(client.get(f"/api/runs/{rid}").json()["problems"])


def test_events_with_missing_fields_do_not_break_the_workers_table(results, client_for):
    events = [rf.event("attempt_started", rf.T0), rf.event("attempt_started", rf.T0 + 1, workers=[{"rank": 0}, "x"]),
              rf.event("worker_failed", rf.T0 + 2), rf.event("host_lost", rf.T0 + 3)]
    rf.make_run(results, rounds=3, events=events, status="ERRORED")
    client = client_for(results)
    rid = _only(client)["id"]
    workers = client.get(f"/api/runs/{rid}/workers").json()["workers"]
    assert [w["rank"] for w in workers] == [0, 1]
    assert client.get(f"/api/runs/{rid}").json()["error"] == {"error_type": "", "message": "", "traceback": ""}


def test_an_older_run_without_events(results, client_for):
    rf.make_run(results, rounds=4, events=[])
    client = client_for(results)
    rid = _only(client)["id"]
    assert client.get(f"/api/runs/{rid}/events").json() == {"events": [], "bad_lines": 0, "offset": 0, "dropped": 0,
                                                            "has_events": False}
    detail = client.get(f"/api/runs/{rid}").json()
    assert detail["has_events"] is False and detail["metrics"] == ["loss", "acc"]
    workers = client.get(f"/api/runs/{rid}/workers").json()["workers"]
    assert [(w["rank"], w["pid"], w["state"]) for w in workers] == [(0, 1000, "finished"), (1, 1001, "finished")]


def test_damaged_settings_and_status(results, client_for):
    run = rf.make_run(results, rounds=2)
    (run / "trainer.json").write_text("{half")
    (run / "status.json").write_text("[]")
    client = client_for(results)
    row = _only(client)
    assert row["status"] == "UNKNOWN" and row["iterations"] == 2
    detail = client.get(f"/api/runs/{row['id']}").json()
    assert detail["settings"] == {} and "trainer.json is damaged" in " ".join(detail["problems"])


def test_a_run_without_results(results, client_for):
    run = rf.make_run(results, rounds=0)
    (run / "results.jsonl").unlink()
    client = client_for(results)
    row = _only(client)
    assert row["iterations"] == 0 and row["metric"] is None
    body = client.get(f"/api/runs/{row['id']}/metrics", params={"names": "loss"})
    assert body.status_code == 400 and "its metrics: none" in body.json()["error"]
    workers = client.get(f"/api/runs/{row['id']}/workers").json()["workers"]  # from the attempt's event
    assert [(w["rank"], w["pid"], w["s_per_iter"]) for w in workers] == [(0, 1000, None), (1, 1001, None)]


def test_damaged_checkpoints_are_shown_as_such(results, client_for):
    run = rf.make_run(results, rounds=6, checkpoints=[2, 4, 6])
    (run / "checkpoints" / "checkpoint_000004" / "model.bin").write_bytes(b"flipped")
    (run / "checkpoints" / "checkpoint_000006" / ".sgd_checkpoint.json").write_text("{cut")
    (run / "checkpoints" / "checkpoint_000007").mkdir()
    client = client_for(results)
    rows = client.get(f"/api/runs/{_only(client)['id']}/checkpoints").json()["checkpoints"]
    by_name = {c["name"]: c for c in rows}
    assert list(by_name) == ["checkpoint_000002", "checkpoint_000004", "checkpoint_000006", "checkpoint_000007"]
    assert by_name["checkpoint_000002"]["verified"] and by_name["checkpoint_000002"]["resume"]
    assert not by_name["checkpoint_000004"]["verified"] and "sha256" in by_name["checkpoint_000004"]["problem"]
    assert by_name["checkpoint_000004"]["latest"] and not by_name["checkpoint_000004"]["resume"]
    assert not by_name["checkpoint_000006"]["verified"] and "damaged" in by_name["checkpoint_000006"]["problem"]
    assert "no metadata" in by_name["checkpoint_000007"]["problem"]


def test_metric_values_that_are_not_numbers(results, client_for):
    values = {1: 1.0, 2: "nan", 3: "inf", 4: "a string", 5: None, 6: [1, 2], 7: True, 9: 9.0}

    def metrics(i, r):
        return {} if i == 8 else {"m": values[i], "text_only": "hello"}

    run = rf.make_run(results, rounds=9, ranks=1, metrics=metrics)
    # json.dumps writes a bare NaN (not JSON), which Python's reader takes as a float
    rf.append(run / "results.jsonl", rf.round_line(10, 1, metrics=lambda i, r: {"m": float("nan")}))
    client = client_for(results)
    rid = _only(client)["id"]
    assert client.get(f"/api/runs/{rid}").json()["metrics"] == ["m"]
    body = client.get(f"/api/runs/{rid}/metrics", params={"names": "m"})
    assert "NaN" not in body.text and "Infinity" not in body.text
    (series,) = body.json()["series"]
    assert series["x"] == list(range(1, 11))
    assert series["y"] == [1.0, None, None, None, None, None, None, None, 9.0, None]
    r = client.get(f"/api/runs/{rid}/metrics", params={"names": "text_only"})
    assert r.status_code == 400 and "no numeric metric 'text_only'" in r.json()["error"]


def test_ten_thousand_metrics(results, client_for):
    names = [f"layer_{i}/grad_norm" for i in range(10_000)]
    rf.make_run(results, rounds=5, ranks=1, metrics=lambda i, r: {n: i * k for k, n in enumerate(names)})
    client = client_for(results)
    rid = _only(client)["id"]
    detail = client.get(f"/api/runs/{rid}").json()
    assert len(detail["metrics"]) == 10_000 and detail["metrics"][:2] == names[:2]
    body = client.get(f"/api/runs/{rid}/metrics", params={"names": f"{names[3]},{names[9999]}"}).json()
    assert [s["y"] for s in body["series"]] == [[3, 6, 9, 12, 15], [9999 * i for i in range(1, 6)]]


def test_a_metric_named_like_html_is_only_json(results, client_for):
    evil = "<img src=x onerror=alert(1)>"
    rf.make_run(results, rounds=3, ranks=1, metrics=lambda i, r: {evil: float(i), "</script><script>x()": 1})
    client = client_for(results)
    row = _only(client)
    detail = client.get(f"/api/runs/{row['id']}")
    assert detail.headers["content-type"] == "application/json" and evil in detail.json()["metrics"]
    assert row["metric"]["name"] == evil
    body = client.get(f"/api/runs/{row['id']}/metrics", params={"name": evil})
    assert body.json()["series"][0]["name"] == evil and body.headers["x-content-type-options"] == "nosniff"
    csv_text = client.get(f"/api/runs/{row['id']}/export", params={"name": evil}).text
    assert csv_text.splitlines()[1].startswith(evil)


def test_a_large_run_opens_from_samples_then_from_its_columns(results, client_for, monkeypatch):
    from sgd_dashboard import columns

    monkeypatch.setattr(columns, "SYNC_BYTES", 64 * 1024)  # read in the background beyond 64 KB
    run = rf.make_run(results, rounds=3000, ranks=2, metrics=lambda i, r: {"loss": 1000.0 if i == 1500 else 1.0 / i})
    size = (run / "results.jsonl").stat().st_size
    assert size > 512 * 1024
    client = client_for(results)
    rid = _only(client)["id"]
    first = client.get(f"/api/runs/{rid}/metrics", params={"names": "loss", "max_points": 50}).json()
    assert first["downsampled"] is True and first["total_points"] == 3000
    assert first["complete"] is False and 0 <= first["read_fraction"] <= 1  # sampled while the columns are read
    assert len(first["series"][0]["x"]) <= 50 and first["offset"] == size

    def whole():
        body = client.get(f"/api/runs/{rid}/metrics", params={"names": "loss", "max_points": 50}).json()
        return body if body["complete"] else None

    body = wait_for(whole, timeout=120, message="the run's columns were not read")
    assert 1000.0 in body["series"][0]["y"] and body["total_points"] == 3000 and body["offset"] == size
    assert not any(isinstance(v, float) and math.isnan(v) for v in body["series"][0]["y"] if v is not None)
    exported = client.get(f"/api/runs/{rid}/export", params={"names": "loss", "ranks": "all"}).text
    assert exported.count("\n") == 1 + 2 * 3000
