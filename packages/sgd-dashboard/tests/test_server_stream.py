"""The live stream over real HTTP (uvicorn on loopback): rounds, events and status as they reach
disk, ids and resuming with Last-Event-ID, heartbeats, a client too far behind; and a stacks
request answered by a stand-in driver."""

from __future__ import annotations

import json
import os
import threading
import time

import httpx
import pytest
import runfolders as rf
from serving import live_server, sse_messages

from sgd_dashboard import create_app

ORIGIN = {"Origin": "http://127.0.0.1:6007"}


def _kinds(messages, kind):
    return [json.loads(m["data"]) for m in messages if m.get("event") == kind]


@pytest.fixture
def live(results):
    run = rf.make_run(results, rounds=3, status="RUNNING", pid=os.getpid())
    app = create_app(results, poll_s=0.05, heartbeat_s=0.5)
    with live_server(app) as url:
        with httpx.Client(base_url=url, timeout=10) as client:
            (row,) = client.get("/api/runs").json()["runs"]
            yield client, row["id"], run


def test_new_rounds_events_and_status_arrive(live):
    client, rid, run = live
    offset = client.get(f"/api/runs/{rid}/metrics", params={"names": "loss"}).json()["offset"]
    events_offset = client.get(f"/api/runs/{rid}/events").json()["offset"]
    params = {"names": "loss", "ranks": "all", "offset": offset, "events_offset": events_offset}
    with client.stream("GET", f"/api/runs/{rid}/stream", params=params) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        first = _collect_from(lines, lambda got: _kinds(got, "status"))
        assert _kinds(first, "status") == [{"status": "RUNNING", "ended": None}]
        written = time.monotonic()
        rf.append(run / "results.jsonl", rf.round_line(4))
        got = _collect_from(lines, lambda got: _kinds(got, "rounds"))
        latency = time.monotonic() - written
        (rounds,) = _kinds(got, "rounds")
        assert rounds["rows"] == 1 and rounds["offset"] == (run / "results.jsonl").stat().st_size
        assert [(s["name"], s["rank"], s["x"], s["y"]) for s in rounds["series"]] == [
            ("loss", 0, [4], [0.25]), ("loss", 1, [4], [1.25])]
        assert latency < 5, latency  # the contract's 1 s, with room for a loaded test machine
        rf.append(run / "events.jsonl", rf.event("resize", rf.T0 + 9, **{"from": 2, "to": 1, "reason": "host lost"}))
        got = _collect_from(lines, lambda got: _kinds(got, "events"))
        assert _kinds(got, "events")[0]["events"][0]["event"] == "resize"
        (run / "status.json").write_text(json.dumps({"status": "FINISHED", "time": rf.T0 + 10, "pid": 1}))
        got = _collect_from(lines, lambda got: _kinds(got, "status"))
        assert _kinds(got, "status") == [{"status": "FINISHED", "ended": rf.T0 + 10}]
        ids = [m["id"] for m in got if "id" in m]
        size = (run / "results.jsonl").stat().st_size
        assert ids[-1] == f"r{size}.e{(run / 'events.jsonl').stat().st_size}"


def _collect_from(lines, until, timeout=20.0):
    got = []
    deadline = time.monotonic() + timeout
    for message in sse_messages(lines):
        got.append(message)
        if until(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not received within {timeout} s: {got}")
    raise AssertionError(f"the stream ended: {got}")


def test_a_reconnect_resumes_from_the_last_event_id(live):
    client, rid, run = live
    with client.stream("GET", f"/api/runs/{rid}/stream", params={"names": "acc"}) as r:
        lines = r.iter_lines()
        rf.append(run / "results.jsonl", rf.round_line(4))
        got = _collect_from(lines, lambda got: _kinds(got, "rounds"))
        last_id = [m["id"] for m in got if m.get("event") == "rounds"][-1]
    rf.append(run / "results.jsonl", rf.round_line(5) + rf.round_line(6))  # while the client was away
    with client.stream("GET", f"/api/runs/{rid}/stream", params={"names": "acc"},
                       headers={"Last-Event-ID": last_id}) as r:
        got = _collect_from(r.iter_lines(), lambda got: sum(m["rows"] for m in _kinds(got, "rounds")) >= 2)
    xs = [x for m in _kinds(got, "rounds") for s in m["series"] for x in s["x"]]
    assert xs == [5, 6]  # nothing lost, nothing twice


def test_heartbeat_and_refusals(live):
    client, rid, _ = live
    with client.stream("GET", f"/api/runs/{rid}/stream") as r:
        got = _collect_from(r.iter_lines(), lambda got: any("comment" in m for m in got))
    assert {"comment": "heartbeat"} in got
    for headers, params, words in [({"Last-Event-ID": "../../etc"}, {}, "not one this server sent"),
                                   ({}, {"offset": "-1"}, "0 or more"), ({}, {"offset": "x"}, "whole number"),
                                   ({}, {"names": "loss", "x": "nope"}, "not an axis")]:
        r = client.get(f"/api/runs/{rid}/stream", headers=headers, params=params)
        assert r.status_code == 400 and words in r.json()["error"], words
    assert client.get("/api/runs/ffffffffffff/stream").status_code == 404


def test_a_client_too_far_behind_is_told_to_reload(live, monkeypatch):
    from sgd_dashboard import stream

    monkeypatch.setattr(stream, "RESET_BYTES", 100)
    client, rid, run = live
    with client.stream("GET", f"/api/runs/{rid}/stream", params={"offset": 0}) as r:
        got = _collect_from(r.iter_lines(), lambda got: _kinds(got, "reset"))
    assert _kinds(got, "reset") == [{"offset": (run / "results.jsonl").stat().st_size}]


def test_stacks_answered_by_the_driver(results, client_for):
    run = rf.make_run(results, rounds=2, status="RUNNING", pid=os.getpid())
    client = client_for(results, allow_stacks=True, stacks_timeout_s=20)
    (row,) = client.get("/api/runs").json()["runs"]
    assert client.get(f"/api/runs/{row['id']}").json()["stacks_allowed"] is True
    stop = threading.Event()

    def driver():  # answers as sgd's driver does: the request's token, then the stacks
        while not stop.is_set():
            request = run / "stacks.request"
            if request.exists():
                token = request.read_text()
                request.unlink()
                (run / "stacks.txt").write_text(f"{token}\n=== rank 0 (pid 1000 on h) ===\n  File \"train.py\"\n")
                return
            stop.wait(0.05)

    thread = threading.Thread(target=driver, daemon=True)
    thread.start()
    try:
        r = client.post(f"/api/runs/{row['id']}/stacks", headers=ORIGIN)
    finally:
        stop.set()
        thread.join(5)
    assert r.status_code == 200 and r.json() == {"text": "=== rank 0 (pid 1000 on h) ===\n  File \"train.py\"\n"}
