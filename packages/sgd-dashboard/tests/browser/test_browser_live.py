"""A live run in the browser: lines appended to ``results.jsonl`` and ``events.jsonl`` by the test
(no Ray) reach the open page's chart and timeline through the server's event stream, without a
reload, within a deadline."""

from __future__ import annotations

import json
import time

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips each test, saying how to install it
    expect = None

#: What the issue asks: a report on disk is on the chart within 1 s. The assertion allows for a
#: loaded CI machine; the measured time is printed (pytest -s) and quoted in docs/dashboard.md.
DEADLINE_S = 3.0


def _points(page, metric: str) -> int:
    text = page.locator(f".chart-panel[data-metric={metric}] .chart-info").inner_text()
    return int(text.split()[0].replace(",", ""))


def test_a_live_run_gains_points_and_events_without_reload(tmp_path, serve, open_page, make):
    t0 = time.time() - 30
    run = make.run(tmp_path, "live", status="RUNNING", iterations=5, t0=t0,
                   logs={0: make.log_header(0, 1000, t0) + "step 1\n"}, events=[
        make.event("run_started", t0, pid=1, host="vm-test", num_workers=2),
        make.event("attempt_started", t0 + 0.1, attempt=1, num_workers=2, iteration=0, checkpoint=None,
                   workers=[{"rank": 0, "pid": 1000, "host": "vm-test"}, {"rank": 1, "pid": 1001, "host": "vm-test"}])])
    server = serve(tmp_path)
    w = open_page(f"{server.url}/#/run/{server.run_id('live')}")
    page = w.page
    page.wait_for_selector(".chart-panel[data-metric=loss] canvas")
    expect(page.locator(".chart-panel[data-metric=loss] .chart-info")).to_have_text("5 points")
    expect(page.locator("#live")).to_be_visible()
    page.evaluate("window.__not_reloaded = true")

    new = make.rounds(6, 3, 2, t0, make.loss)
    with open(run / "results.jsonl", "a") as f:
        f.write("\n".join(new[:2]) + "\n" + new[2][:40])  # the third line half-written
        f.flush()
        written = time.monotonic()
    info = page.locator(".chart-panel[data-metric=loss] .chart-info")
    expect(info).to_have_text("7 points", timeout=DEADLINE_S * 1000)
    latency = time.monotonic() - written
    print(f"\nreport on disk -> point on the chart: {latency:.2f} s")
    assert latency <= DEADLINE_S
    with open(run / "results.jsonl", "a") as f:
        f.write(new[2][40:] + "\n")  # the rest of the line
    expect(info).to_have_text("8 points", timeout=DEADLINE_S * 1000)
    assert _points(page, "accuracy") == 8

    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps(make.event("worker_failed", time.time(), rank=1, pid=1001, host="vm-test",
                                      error_type="ActorDiedError", message="killed", died=True)) + "\n")
        f.write(json.dumps(make.event("attempt_started", time.time(), attempt=2, num_workers=2, iteration=8,
                                      checkpoint=None, workers=[{"rank": 0, "pid": 1000, "host": "vm-test"},
                                                                {"rank": 1, "pid": 3003, "host": "vm-test"}])) + "\n")
    expect(page.locator("#timeline .tl-marker[data-kind=worker_failed]")).to_have_count(1, timeout=DEADLINE_S * 1000)
    expect(page.locator("#events-table tr[data-kind=attempt_started]").nth(1)).to_contain_text("pid 3003")

    # the log followed: what a worker appends shows without a reload
    expect(page.locator("#log-view")).to_contain_text("step 1")
    page.check("#log-follow")
    with open(run / "logs" / "rank_0.log", "a") as f:
        f.write("step 2: appended while followed\n")
    expect(page.locator("#log-view")).to_contain_text("appended while followed", timeout=DEADLINE_S * 1000)

    # all ranks, by time: the stream is opened again for the new query and goes on adding points
    page.select_option("#ranks", "all")
    expect(info).to_have_text("16 points")
    with open(run / "results.jsonl", "a") as f:
        f.write(make.rounds(9, 1, 2, t0, make.loss)[0] + "\n")
    expect(info).to_have_text("18 points", timeout=DEADLINE_S * 1000)

    # the run ends: the badge follows, the stream is closed
    (run / "status.json").write_text(json.dumps({"status": "FINISHED", "time": time.time(), "pid": 1, "host": "x"}))
    expect(page.locator("#run-name .badge")).to_have_attribute("data-status", "FINISHED", timeout=DEADLINE_S * 1000)
    expect(page.locator("#live")).to_be_hidden()
    assert page.evaluate("window.__not_reloaded") is True
    assert w.foreign(server.url) == [] and w.failed == [] and w.errors == [] and w.dialogs == []
