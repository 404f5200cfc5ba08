"""The dashboard reads the folder of a real run: ``sgd.Trainer(backend="torch", num_workers=2)`` on
the session's Ray cluster, followed live through the stream while it reports, then read whole."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
from serving import live_server, sse_messages

import sgd
from sgd_dashboard import create_app
from sgd_testing import wait_for


def train_func(config):
    go = Path(config["go"])
    for i in range(1, 5):
        if i == 4:  # the test follows the run live: the last round waits for its word
            deadline = time.monotonic() + 120
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        print(f"step {i} on rank {sgd.world_rank()}", flush=True)
        sgd.report(loss=1.0 / i + sgd.world_rank(), lr=config["lr"])
        if i == 2:
            sgd.save_checkpoint(step=i)


def test_a_real_two_worker_run(ray_cluster, results, tmp_path):
    go = tmp_path / "go"
    trainer = sgd.Trainer(backend="torch", num_workers=2, logdir=str(results / "real"))
    trainer.start()
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.setdefault(
        "result", trainer.run(train_func, config={"lr": 0.1, "go": str(go)})), daemon=True)
    try:
        thread.start()
        app = create_app(results, poll_s=0.05)
        with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
            def live_row():
                rows = client.get("/api/runs").json()["runs"]
                return rows[0] if rows and rows[0]["iterations"] >= 3 else None

            row = wait_for(live_row, timeout=180, message="the run did not report 3 rounds")
            assert row["status"] == "RUNNING" and row["num_workers"] == 2 and row["metric"]["name"] == "loss"
            rid = row["id"]
            offset = client.get(f"/api/runs/{rid}/metrics", params={"names": "loss"}).json()["offset"]
            got = []
            with client.stream("GET", f"/api/runs/{rid}/stream",
                               params={"names": "loss", "ranks": "all", "offset": offset}) as r:
                go.touch()
                for message in sse_messages(r.iter_lines()):
                    got.append(message)
                    if message.get("event") == "status" and json.loads(message["data"])["status"] == "FINISHED":
                        break
            rounds = [json.loads(m["data"]) for m in got if m.get("event") == "rounds"]
            xs = sorted({x for m in rounds for s in m["series"] for x in s["x"]})
            assert xs == [4], got
            thread.join(120)
            assert not thread.is_alive()

            detail = client.get(f"/api/runs/{rid}").json()
            assert detail["status"] == "FINISHED" and detail["metrics"] == ["loss", "lr"]
            assert detail["settings"]["backend"] == "torch"
            body = client.get(f"/api/runs/{rid}/metrics", params={"names": "loss", "ranks": "all"}).json()
            assert [(s["rank"], s["x"]) for s in body["series"]] == [(0, [1, 2, 3, 4]), (1, [1, 2, 3, 4])]
            assert body["series"][1]["y"] == [2.0, 1.5, 1 + 1 / 3, 1.25]
            workers = client.get(f"/api/runs/{rid}/workers").json()["workers"]
            assert [w["rank"] for w in workers] == [0, 1] and all(w["state"] == "finished" for w in workers)
            assert all(isinstance(w["pid"], int) and w["pid"] != os.getpid() for w in workers)
            checkpoints = client.get(f"/api/runs/{rid}/checkpoints").json()["checkpoints"]
            assert [(c["iteration"], c["verified"], c["latest"]) for c in checkpoints] == [(2, True, True)]
            logs = client.get(f"/api/runs/{rid}/logs").json()["logs"]
            assert [(g["rank"], g["attempt"]) for g in logs] == [(0, 1), (1, 1)]
            text = client.get(f"/api/runs/{rid}/logs/{logs[1]['id']}").json()["text"]
            assert text.startswith("=== rank 1: pid ") and "step 4 on rank 1" in text
            events = client.get(f"/api/runs/{rid}/events").json()
            assert detail["has_events"] and events["bad_lines"] == 0  # the controller writes them (issue 54)
            kinds = [e["event"] for e in events["events"]]
            assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
            assert "checkpoint_persisted" in kinds
            (started,) = [e for e in events["events"] if e["event"] == "attempt_started"]
            assert [(w["rank"], w["pid"]) for w in started["workers"]] == [(w["rank"], w["pid"]) for w in workers]
    finally:
        go.touch()
        thread.join(120)
        trainer.shutdown()
