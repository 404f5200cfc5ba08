"""The page in headless Chromium against the real server: every view clicked through with no
request to any other host, user text shown as text (never markup), a run's events on the timeline
and in the worker table."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, List

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips each test, saying how to install it
    expect = None

XSS = "<img src=x onerror=alert(1)>"


def _failure_events(make: Any, t0: float) -> List[Any]:
    """Attempt 1 (pids 1000, 1001), rank 1 killed, a restart from checkpoint 10, attempt 2 with
    rank 1's new pid 2001, the end."""
    first = [{"rank": 0, "pid": 1000, "host": "vm-test", "node_ip": "192.0.2.2"},
             {"rank": 1, "pid": 1001, "host": "vm-test", "node_ip": "192.0.2.2"}]
    second = [first[0], {"rank": 1, "pid": 2001, "host": "vm-test", "node_ip": "192.0.2.2"}]
    return [
        make.event("run_started", t0, driver_attempt=1, pid=4242, host="vm-test", num_workers=2),
        make.event("attempt_started", t0 + 0.5, attempt=1, num_workers=2, iteration=0, checkpoint=None, workers=first),
        *[make.event("checkpoint_persisted", t0 + it, checkpoint=f"checkpoint_{it:06d}", iteration=it, bytes=4096)
          for it in (5, 10)],
        make.event("worker_failed", t0 + 12.2, rank=1, host="vm-test", pid=1001, error_type="ActorDiedError",
              message="the worker process died (SIGKILL)", traceback="Traceback (most recent call last):\n  ...",
              phase="training", died=True),
        make.event("restart", t0 + 12.5, attempt=2, max_failures=1, checkpoint="checkpoint_000010", iteration=10,
              num_workers=2),
        make.event("attempt_started", t0 + 13.0, attempt=2, num_workers=2, iteration=10, checkpoint="checkpoint_000010",
              workers=second),
        make.event("run_finished", t0 + 31),
    ]


def _failed_run(make: Any, root: Path, name: str = "exp/run_restarted") -> Path:
    t0 = time.time() - 600
    lines = make.rounds(1, 12, 2, t0, _metrics) + make.rounds(11, 20, 2, t0 + 1.5, _metrics, pids=[1000, 2001])
    header = make.log_header
    logs = {0: header(0, 1000, t0) + "epoch 1 loss 2.0\n" * 5 + header(0, 1000, t0 + 13) + "resumed\n",
            1: header(1, 1001, t0) + "epoch 1\n" + header(1, 2001, t0 + 13) + "resumed at iteration 10\n"}
    return make.run(root, name, lines=lines, events=_failure_events(make, t0), logs=logs, checkpoints=[5, 10, 20, 30],
                     t0=t0)


def _metrics(it: int, rank: int) -> dict:
    import math

    return {"loss": 2.0 * math.exp(-it / 12) + 0.03 * ((it * 7 + rank) % 5), "accuracy": 1 - 0.9 * math.exp(-it / 10),
            "grad_norm": 1.0 + 0.5 * math.sin(it / 2 + rank)}


def test_every_view_talks_to_the_server_only(tmp_path, serve, open_page, make):
    _failed_run(make, tmp_path)
    make.run(tmp_path, "exp/run_finished", iterations=120, checkpoints=[60, 120])
    failure = make.event("run_failed", time.time() - 30, error_type="ValueError", message="loss is NaN at step 25",
                         traceback='Traceback (most recent call last):\n  File "train.py"\nValueError: loss is NaN')
    make.run(tmp_path, "exp/run_failed", status="ERRORED", iterations=25, events=[failure])
    make.run(tmp_path, "old_run_no_events", iterations=8)
    make.run(tmp_path, "exp/driver_killed", status="RUNNING", driver_alive=False, iterations=15)
    server = serve(tmp_path)
    w = open_page(server.url + "/")
    page = w.page

    # runs: every run listed with its badge, sortable, filterable
    expect(page.locator("#runs-table tbody tr")).to_have_count(5)
    assert page.locator("#runs-table tbody tr[data-run-id] .badge").count() == 5
    assert page.locator(".badge[data-status=ERRORED]").count() == 1
    assert page.locator(".badge[data-status=DRIVER_DIED]").inner_text() == "driver died"
    assert page.locator("#runs-table svg.spark path").count() == 5
    page.locator("th[data-sort=name]").click()  # ascending by name
    names = page.locator("#runs-table td.name a").all_text_contents()
    assert names == sorted(names)
    page.locator("th[data-sort=name]").click()
    assert page.locator("#runs-table td.name a").all_text_contents() == sorted(names, reverse=True)
    page.fill("input.filter", "fail")
    expect(page.locator("#runs-table tbody tr")).to_have_count(1)
    page.fill("input.filter", "")
    expect(page.locator("#runs-table tbody tr")).to_have_count(5)
    make.screenshot(page, "runs")

    # compare: tick two runs
    page.locator("tr", has_text="exp/run_finished").locator("input.select-run").check()
    page.locator("tr", has_text="exp/run_restarted").locator("input.select-run").check()
    page.click("#compare-selected")
    page.locator("#compare-charts .chart-panel canvas").nth(1).wait_for()
    assert page.locator("#compare-runs tbody tr").count() == 2
    assert page.locator("#compare-charts .chart-panel[data-metric=loss] .u-legend .u-series").count() >= 3
    make.screenshot(page, "compare")

    # a failed run: its error and traceback
    page.goto(server.url + "/#/runs")
    page.locator("a", has_text="exp/run_failed").click()
    page.wait_for_selector("#run-error")
    assert "loss is NaN at step 25" in page.locator("#run-error").inner_text()
    assert "ValueError: loss is NaN" in page.locator("#run-error pre.traceback").inner_text()

    # a run with everything: charts, timeline, workers, checkpoints, logs, settings, export
    page.goto(server.url + "/#/runs")
    page.locator("a", has_text="exp/run_restarted").click()
    page.wait_for_selector(".chart-panel[data-metric=loss] canvas")
    page.wait_for_selector("#timeline .tl-marker[data-kind=worker_failed]")
    expect(page.locator("#checkpoints-table tbody tr[data-name]")).to_have_count(4)
    expect(page.locator("#log-view")).to_contain_text("resumed")
    page.select_option("#x-axis", "time")
    expect(page.locator("#export-csv")).to_have_attribute("href", re.compile("x=time"))
    page.select_option("#ranks", "all")
    expect(page.locator(".chart-panel[data-metric=loss] .u-legend .u-series")).to_have_count(3)
    page.fill("#smoothing", "0.6")
    page.check("#log-scale")
    page.click("#metric-picker summary")
    page.locator("#metric-picker label", has_text="grad_norm").locator("input").check()
    page.wait_for_selector(".chart-panel[data-metric=grad_norm] canvas")
    page.click("#metric-picker summary")
    assert "rank 0 · attempt 2" in page.locator("#log-select option:checked").inner_text()
    page.select_option("#log-select", index=3)
    expect(page.locator("#log-view")).to_contain_text("resumed at iteration 10")
    page.fill("#log-search", "iteration")
    page.press("#log-search", "Enter")
    page.wait_for_selector("#log-view mark")
    page.click("#settings summary")
    assert "run_config.name" in page.locator("#settings").inner_text()
    with page.expect_download() as download:
        page.click("#export-csv")
    assert download.value.suggested_filename
    page.goto(server.url + "/#/runs")
    page.locator("a", has_text="old_run_no_events").click()
    page.wait_for_selector(".chart-panel canvas")
    assert "No events recorded" in page.locator("#timeline").inner_text()

    assert w.foreign(server.url) == [], "requests to another host"
    assert w.failed == [] and w.errors == [] and w.dialogs == []
    assert any("/static/vendor/uplot/uPlot.iife.min.js" in u for u in w.requests)


def test_user_text_is_shown_as_text(tmp_path, serve, open_page, make):
    """A metric, a setting, a log line, an event message and a run name holding markup are shown
    as the characters they are: no element made of them, no script run, no dialog."""
    t0 = time.time() - 100
    make.run(tmp_path, "<b onmouseover=alert(2)>bold", metrics=lambda it, rank: {XSS: it * 0.5, "loss": 1 / it},
              settings={"note": XSS}, logs={0: make.log_header(0, 1000, t0) + XSS + "\n"},
              events=[make.event("worker_failed", t0 + 5, rank=0, pid=1000, host="vm-test", error_type=XSS, message=XSS,
                            died=False),
                      make.event("run_failed", t0 + 6, error_type="RuntimeError", message=XSS, traceback=XSS)],
              status="ERRORED", t0=t0)
    server = serve(tmp_path)
    w = open_page(server.url + "/")
    page = w.page
    page.wait_for_selector("#runs-table td.name a")
    assert page.locator("#runs-table td.name a").inner_text() == "<b onmouseover=alert(2)>bold"
    page.locator("#runs-table td.name a").hover()
    page.locator("#runs-table td.name a").click()
    page.wait_for_selector("#run-error")
    page.click("#metric-picker summary")
    page.locator("#metric-picker label", has_text=XSS).locator("input").check()
    page.wait_for_selector(".chart-panel canvas")
    expect(page.locator("#log-view")).to_contain_text("onerror")
    page.click("#settings summary")
    page.locator("#timeline .tl-marker").first.click()
    titles = page.locator(".chart-title").all_text_contents()
    assert XSS in titles
    assert page.locator("#run-name").inner_text().startswith("<b onmouseover=alert(2)>bold")
    for where in ("#run-error", "#log-view", "#settings", "#events-table", "#metric-picker"):
        assert XSS in page.locator(where).inner_text(), where
    assert page.locator("img").count() == 0 and page.locator("b").count() == 0
    assert w.dialogs == [] and w.errors == []


def test_a_restart_shows_on_the_timeline_and_in_the_worker_table(tmp_path, serve, open_page, make):
    """Rank 1 killed (pid 1001), restarted with pid 2001: the timeline has the failure, the
    restart and both attempts; the events table names the new pid; the worker table shows it."""
    _failed_run(make, tmp_path)
    server = serve(tmp_path)
    w = open_page(f"{server.url}/#/run/{server.run_id('exp/run_restarted')}")
    page = w.page
    page.wait_for_selector(".chart-panel[data-metric=loss] canvas")
    timeline = page.locator("#timeline")
    expect(timeline.locator(".tl-marker[data-kind=worker_failed]")).to_have_count(1)
    expect(timeline.locator(".tl-marker[data-kind=restart]")).to_have_count(1)
    expect(timeline.locator(".tl-marker[data-kind=attempt_started]")).to_have_count(2)
    expect(timeline.locator(".tl-span")).to_have_count(2)
    title = timeline.locator(".tl-marker[data-kind=worker_failed]").get_attribute("title")
    assert "rank 1 (pid 1001 on vm-test) died" in title
    failed = page.locator("#events-table tr[data-kind=worker_failed]")
    assert "ActorDiedError" in failed.inner_text()
    second = page.locator("#events-table tr[data-kind=attempt_started]").nth(1)
    assert "rank 1: pid 2001" in second.inner_text() and "checkpoint_000010" in second.inner_text()
    expect(page.locator("#workers-table tbody tr[data-rank='1']")).to_have_attribute("data-pid", "2001")
    # a marker picked on the timeline is the row lit in the events table
    timeline.locator(".tl-marker[data-kind=restart]").click()
    expect(page.locator("#events-table tr.picked")).to_have_attribute("data-kind", "restart")
    page.set_viewport_size({"width": 1440, "height": 1500})
    page.locator("#metric-picker summary").click()
    page.locator("#metric-picker label", has_text="grad_norm").locator("input").check()
    page.locator("#metric-picker summary").click()
    page.wait_for_selector(".chart-panel[data-metric=grad_norm] canvas")
    page.select_option("#ranks", "all")
    expect(page.locator(".chart-panel[data-metric=grad_norm] .u-legend .u-series")).to_have_count(3)
    page.mouse.move(400, 400)
    make.screenshot(page, "run")
    assert w.foreign(server.url) == [] and w.failed == [] and w.errors == []


def test_a_token_is_asked_once_then_kept_in_a_cookie(tmp_path, serve, open_page, make):
    """With a token, the page opened once with ?token= works whole (its API calls and its event
    stream carry the cookie); a browser without it is refused."""
    make.run(tmp_path, "live", status="RUNNING", iterations=5)
    token = "3f1c9a7e5b2d4c6a8e0f1b3d5c7a9e2f"
    server = serve(tmp_path, token=token)
    w = open_page(f"{server.url}/?token={token}")
    w.page.locator("#runs-table td.name a").click()
    w.page.wait_for_selector(".chart-panel[data-metric=loss] canvas")
    expect(w.page.locator("#live")).to_be_visible()
    assert w.failed == [] and w.errors == []
    stranger = open_page(f"{server.url}/")
    assert stranger.failed and stranger.failed[0].startswith("403 ")
    assert "token" in stranger.page.locator("body").inner_text()


def test_stacks_only_when_allowed_and_shown_as_text(tmp_path, serve, open_page, make):
    """The Stacks button is there only with allow_stacks and a running run; pressing it writes the
    request file (the test answers as the driver would) and shows the answer."""
    from sgd_testing import wait_for

    run = make.run(tmp_path, "live", status="RUNNING", iterations=5)
    plain = serve(tmp_path)
    w = open_page(f"{plain.url}/#/run/{plain.run_id('live')}")
    w.page.wait_for_selector(".chart-panel canvas")
    expect(w.page.locator("#stacks")).to_have_count(0)

    server = serve(tmp_path, allow_stacks=True)
    w = open_page(f"{server.url}/#/run/{server.run_id('live')}")
    w.page.locator("#stacks").click()
    ask = wait_for(lambda: (run / "stacks.request").is_file() and (run / "stacks.request").read_text(), timeout=15,
                   message="the page's request made no stacks.request")
    (run / "stacks.txt").write_text(ask + "\n=== rank 0 (pid 1000 on vm-test) ===\n  File \"train.py\", line 7, in "
                                    + XSS + "\n")
    expect(w.page.locator("#stacks-out")).to_contain_text('File "train.py", line 7', timeout=15_000)
    assert XSS in w.page.locator("#stacks-out").inner_text()
    assert w.failed == [] and w.errors == [] and w.dialogs == []


def test_the_page_functions_take_any_shape_of_event_and_series(tmp_path, serve, open_page):
    """The page's own modules, called in the browser: an event of each kind with no fields, with
    fields of the wrong type, of a kind this page does not know, becomes a sentence (never an
    exception); smoothing keeps gaps; a restart's repeated iterations are ordered, later wins."""
    server = serve(tmp_path)
    w = open_page(server.url + "/")
    got = w.page.evaluate("""async () => {
        const ev = await import('/static/js/events.js');
        const ch = await import('/static/js/charts.js');
        const kinds = ['run_started', 'attempt_started', 'worker_failed', 'host_lost', 'drain_notice', 'resize',
            'reformed', 'restart', 'checkpoint_persisted', 'checkpoint_deleted', 'checkpoint_rejected', 'hang',
            'run_finished', 'run_failed', 'run_stopped', 'run_interrupted', 'driver_died', 'from_the_future'];
        const bare = kinds.map((k) => ev.describe({event: k}));
        const odd = kinds.map((k) => ev.describe({event: k, workers: 'x', survivors: 5, hosts: null, ranks: 'r',
            stragglers: {}, rank: {a: 1}}));
        return {bare, odd, none: ev.describe({}), lane: ev.laneOf('from_the_future'),
            ema: ch.ema([1, null, 3, 3], 0.5), ordered: ch.ordered([1, 2, 3, 2, 3, 4], [10, 20, 30, 21, 31, 41], true),
            byTime: ch.ordered([5, 5, 6], [1, 2, 3], false), joined: ch.join([[[1, 2], [7, null]], [[2, 3], [8, 9]]]),
            clean: ch.clean([1, 'nan', Infinity, null, -1, 0], true)};
    }""")
    assert all(isinstance(t, str) and t for t in got["bare"] + got["odd"])
    assert got["bare"][2].startswith("rank ? (pid ? on ?)") and got["bare"][-1].startswith("from_the_future")
    assert got["none"].startswith("unknown") and got["lane"] == "other"
    assert got["ema"][1] is None and got["ema"][0] == 1 and 1 < got["ema"][2] < 3
    assert got["ordered"] == [[1, 2, 3, 4], [10, 21, 31, 41]]
    assert got["byTime"] == [[5, 5, 6], [1, 2, 3]]
    assert got["joined"][0] == [1, 2, 3] and got["joined"][1][1] is None and got["joined"][2][2] == 9
    assert got["clean"] == [1, None, None, None, None, None]
    assert w.errors == []
