"""A real run in the browser: a 2-worker torch run on Ray reports while the page is open (the
chart gains points), a worker is SIGKILLed, and the timeline shows the failure and the restart,
the events table and the worker table the restarted rank's new pid. Needs the controller's
``events.jsonl`` (sgd-core's :mod:`sgd.run.telling`)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import threading
import time

import pytest

import sgd

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips each test, saying how to install it
    expect = None


def _paced_train(config):
    """Reports a loss each step, checkpoints each step, resumes from the latest checkpoint; a step
    takes ``pace_s`` (the page has time to watch)."""
    import math

    state = sgd.load_checkpoint() or {"step": 0}
    for step in range(state["step"] + 1, config["steps"] + 1):
        time.sleep(config["pace_s"])
        sgd.report(step=step, loss=math.exp(-step / 10), rank=sgd.world_rank())
        sgd.save_checkpoint(step=step)


def _last_round(run_dir):
    lines = [line for line in (run_dir / "results.jsonl").read_text().splitlines() if line.endswith("]")]
    return json.loads(lines[-1]) if lines else None


#: The controller's writer of events.jsonl; without it a run has no events to show.
WRITES_EVENTS = importlib.util.find_spec("sgd.run.telling") is not None


@pytest.mark.timeout(600)
@pytest.mark.skipif(not WRITES_EVENTS, reason="this sgd-core's controller does not write events.jsonl yet "
                                              "(sgd.run.telling)")
def test_a_killed_worker_shows_on_the_timeline_with_its_new_pid(ray_cluster, tmp_path, serve, open_page, browser):
    from sgd_testing import wait_for

    results = tmp_path / "results"
    trainer = sgd.Trainer(backend="torch", num_workers=2, max_retries=1, logdir=results)
    trainer.start()
    outcome = {}

    def drive():
        try:
            outcome["result"] = trainer.run(_paced_train, config={"steps": 40, "pace_s": 0.25})
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        run_dir = wait_for(lambda: next((p.parent for p in results.rglob("results.jsonl")
                                         if p.stat().st_size > 0), None), timeout=120,
                           message="the run wrote no report within 120 s")
        server = serve(results)
        rid = server.api("/api/runs")["runs"][0]["id"]
        w = open_page(f"{server.url}/#/run/{rid}")
        page = w.page
        info = page.locator(".chart-panel[data-metric=loss] .chart-info")
        info.wait_for(timeout=30_000)
        before = int(info.inner_text().split()[0])
        # the chart gains points while the run reports, with no reload
        wait_for(lambda: int(info.inner_text().split()[0]) >= before + 2, timeout=30,
                 message="the open page's chart gained no points while the run reported")

        old = _last_round(run_dir)[1]["_pid"]
        os.kill(old, signal.SIGKILL)
        timeline = page.locator("#timeline")
        expect(timeline.locator(".tl-marker[data-kind=worker_failed]")).to_have_count(1, timeout=90_000)
        expect(timeline.locator(".tl-marker[data-kind=restart]")).to_have_count(1, timeout=90_000)
        expect(timeline.locator(".tl-marker[data-kind=attempt_started]")).to_have_count(2, timeout=90_000)
        failed = page.locator("#events-table tr[data-kind=worker_failed]")
        expect(failed).to_contain_text(f"pid {old}")
        new = wait_for(lambda: (_last_round(run_dir) or [{}, {}])[1].get("_pid") not in (None, old)
                       and _last_round(run_dir)[1]["_pid"], timeout=90, message="rank 1 never reported again")
        expect(page.locator("#events-table tr[data-kind=attempt_started]").nth(1)).to_contain_text(f"rank 1: pid {new}")
        expect(page.locator("#workers-table tbody tr[data-rank='1']")).to_have_attribute("data-pid", str(new),
                                                                                      timeout=10_000)
        driver.join(timeout=180)
        assert not driver.is_alive() and "error" not in outcome, outcome.get("error")
        expect(page.locator("#run-name .badge")).to_have_attribute("data-status", "FINISHED", timeout=15_000)
        assert w.foreign(server.url) == [] and w.errors == [] and w.dialogs == []

        # the folder copied elsewhere (a laptop): the same story from the files alone
        copy = tmp_path / "laptop" / "the_run"
        shutil.copytree(run_dir, copy)
        laptop = serve(copy.parent)
        w = open_page(f"{laptop.url}/#/run/{laptop.api('/api/runs')['runs'][0]['id']}")
        expect(w.page.locator("#timeline .tl-marker[data-kind=worker_failed]")).to_have_count(1)
        expect(w.page.locator("#events-table tr[data-kind=attempt_started]").nth(1)).to_contain_text(f"pid {new}")
        w.page.wait_for_selector(".chart-panel[data-metric=loss] canvas")
        assert w.failed == [] and w.errors == []
    finally:
        trainer.shutdown()
        driver.join(timeout=60)
