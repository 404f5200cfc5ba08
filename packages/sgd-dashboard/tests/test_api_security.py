"""Every refusal of the dashboard's guard (issue 54, §4): bind, token and cookie, Host, method,
Origin, stacks opt-in, and paths in every parameter. The server keeps serving after each."""

from __future__ import annotations

import os

import pytest
import runfolders as rf

from sgd_dashboard import create_app

TOKEN = "t0ken-Abc_123"


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::", "example.com"])
def test_non_local_bind_needs_a_token(results, host):
    with pytest.raises(ValueError, match="without a token.*--token.*SGD_DASHBOARD_TOKEN"):
        create_app(results, host=host)
    create_app(results, host=host, token=TOKEN)  # with one it serves


def test_local_binds_need_none(results):
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        create_app(results, host=host)


@pytest.mark.parametrize("token", ["", "   ", "has space", "semi;colon", "x" * 300])
def test_a_malformed_token_is_refused(results, token):
    with pytest.raises(ValueError, match="token"):
        create_app(results, host="0.0.0.0", token=token)


def test_token_then_cookie(results, client_for):
    rf.make_run(results, rounds=2)
    client = client_for(results, token=TOKEN, host="0.0.0.0", port=6007)
    refused = client.get("/api/runs")
    assert refused.status_code == 403 and "needs its token" in refused.json()["error"]
    assert client.get("/api/runs", params={"token": "wrong"}).status_code == 403
    page = client.get("/", params={"token": TOKEN}, follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/"  # the token leaves the address bar
    cookie = page.headers["set-cookie"]
    assert f"sgd_dashboard_6007={TOKEN}" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert client.get("/api/runs").status_code == 200  # the cookie does from now on
    client.cookies.clear()
    assert client.get("/api/runs").status_code == 403
    assert client.get("/api/runs", params={"token": TOKEN}).status_code == 200  # an API call may bring it too


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:6007", "127.0.0.1.evil.com", "0.0.0.0"])
def test_a_foreign_host_header_is_refused(results, client_for, host):
    client = client_for(results)
    r = client.get("/api/runs", headers={"Host": host})
    assert r.status_code == 403 and "DNS rebinding" in r.json()["error"]
    for good in ("127.0.0.1:6007", "localhost:6007", "LOCALHOST", "[::1]:6007"):
        assert client.get("/api/runs", headers={"Host": good}).status_code == 200, good


def test_only_get_except_the_stacks_request(one_run):
    client, rid, _ = one_run
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        r = client.request(method, "/api/runs", headers={"Origin": "http://127.0.0.1:6007"})
        assert r.status_code == 405 and "only reads" in r.json()["error"], method
    assert client.delete(f"/api/runs/{rid}").status_code == 405
    assert client.get("/api/runs").status_code == 200


def test_stacks_need_the_flag_and_the_same_origin(results, client_for):
    rf.make_run(results, rounds=2, status="RUNNING", pid=os.getpid())
    off = client_for(results)
    (row,) = off.get("/api/runs").json()["runs"]
    url = f"/api/runs/{row['id']}/stacks"
    r = off.post(url, headers={"Origin": "http://127.0.0.1:6007"})
    assert r.status_code == 403 and "--allow-stacks" in r.json()["error"]
    on = client_for(results, allow_stacks=True, stacks_timeout_s=0.3)
    for origin in (None, "http://evil.example.com", "null", "http://127.0.0.1:6008"):
        headers = {"Origin": origin} if origin else {}
        r = on.post(url, headers=headers)
        assert r.status_code == 403 and "own page" in r.json()["error"], origin
    assert not (results / "run_001" / "stacks.request").exists()
    # from the page itself: the request is written; with no driver to answer, it times out and is taken back
    r = on.post(url, headers={"Origin": "http://127.0.0.1:6007"})
    assert r.status_code == 504 and "did not answer" in r.json()["error"]
    assert not (results / "run_001" / "stacks.request").exists()


def test_stacks_of_a_run_that_is_not_running(one_run, client_for):
    _, rid, run = one_run
    client = client_for(run.parent.parent, allow_stacks=True)
    r = client.post(f"/api/runs/{rid}/stacks", headers={"Origin": "http://127.0.0.1:6007"})
    assert r.status_code == 409 and "not running (its status is FINISHED)" in r.json()["error"]


def test_security_headers_on_every_answer(one_run):
    client, rid, _ = one_run
    for url in ("/", f"/api/runs/{rid}", "/api/runs/ffffffffffff", "/static/nothing.js"):
        r = client.get(url)
        assert r.headers["content-security-policy"].startswith("default-src 'self'"), url
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"


TRAVERSALS = ["..", "../..", "%2e%2e", "%2e%2e%2f%2e%2e%2fetc%2fpasswd", "..%2f..%2fetc%2fpasswd", "/etc/passwd",
              "%2fetc%2fpasswd", "....//....//etc/passwd", "..\\..\\etc\\passwd", "%252e%252e%252f", "%00",
              "run_001", "exp/run_001"]


@pytest.mark.parametrize("bad", TRAVERSALS)
def test_paths_in_every_parameter_are_refused(one_run, bad):
    client, rid, run = one_run
    urls = [f"/api/runs/{bad}", f"/api/runs/{bad}/metrics?names=loss", f"/api/runs/{rid}/logs/{bad}",
            f"/api/runs/{bad}/logs/0-1", f"/static/{bad}", f"/static/..%2f..%2f{bad}",
            f"/api/runs/{rid}/metrics?names={bad}", f"/api/runs/{rid}/export?names={bad}",
            f"/api/runs/{rid}/logs/0-1?q={bad}", f"/api/runs?q={bad}", f"/api/runs?sort={bad}",
            f"/api/runs/{rid}/stream?last_event_id={bad}", f"/api/runs/{rid}/stream?offset={bad}"]
    for url in urls:
        r = client.get(url)
        assert r.status_code in (200, 400, 404), (url, r.status_code)
        assert "root:" not in r.text and "Traceback" not in r.text, url
        if r.status_code != 200:
            assert r.headers["content-type"].startswith("application/json") and r.json()["error"], url
    assert client.get(f"/api/runs/{rid}").status_code == 200  # still serving


def test_a_symlink_out_of_the_folder_is_not_followed(results, tmp_path, client_for):
    outside = tmp_path / "outside"
    secret_run = rf.make_run(outside, "run_secret", rounds=2)
    (secret_run / "logs" / "rank_0.log").write_text("=== rank 0: pid 1 on h, d ===\nTOP SECRET\n")
    run = rf.make_run(results, rounds=3)
    os.symlink(secret_run, results / "linked_run")  # a whole run folder elsewhere
    os.symlink(secret_run / "logs" / "rank_0.log", run / "logs" / "rank_5.log")  # one file elsewhere
    (run / "events.jsonl").unlink()
    os.symlink(secret_run / "events.jsonl", run / "events.jsonl")
    client = client_for(results)
    rows = client.get("/api/runs").json()["runs"]
    assert [r["name"] for r in rows] == ["run_001"]
    rid = rows[0]["id"]
    logs = client.get(f"/api/runs/{rid}/logs").json()["logs"]
    assert [g["rank"] for g in logs] == [0, 1]
    assert client.get(f"/api/runs/{rid}/logs/5-1").status_code == 404
    events = client.get(f"/api/runs/{rid}/events").json()
    assert events["events"] == []
    assert "outside the results folder" in " ".join(client.get(f"/api/runs/{rid}").json()["problems"])
    for url in ("/static/../../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd"):
        r = client.get(url)
        assert r.status_code == 404 and "root:" not in r.text


def test_run_files_that_are_symlinks_out_are_not_read(results, tmp_path, client_for):
    outside = rf.make_run(tmp_path / "outside", "run_secret", rounds=7, metrics=lambda i, r: {"secret_metric": 1.0})
    run = rf.make_run(results, rounds=3)
    for name in ("results.jsonl", "trainer.json"):
        (run / name).unlink()
        os.symlink(outside / name, run / name)
    client = client_for(results)
    (row,) = client.get("/api/runs").json()["runs"]
    assert row["iterations"] == 0 and row["metric"] is None
    detail = client.get(f"/api/runs/{row['id']}").json()
    assert detail["settings"] == {} and detail["metrics"] == []
    assert "outside the results folder" in " ".join(detail["problems"])
    r = client.get(f"/api/runs/{row['id']}/metrics", params={"names": "secret_metric"})
    assert r.status_code == 400 and "secret" not in r.json()["error"].split("its metrics:")[1]
    assert client.get(f"/api/runs/{row['id']}/workers").status_code == 200
    assert "secret_metric" not in client.get(f"/api/runs/{row['id']}/export", params={"names": "x"}).text.split(":")[-1]
