"""A run's events (``events.jsonl``, sgd.storage.events): what the controller writes at each
decision, stepped over sgd_testing's FakeGroup without Ray, and what the public reader
(``sgd.runs.read_events``) makes of a file being written or damaged."""

import json
import os

import pytest

import sgd
from sgd import runs
from sgd.errors import TrainingFailedError
from sgd.run.telling import RunEvents
from sgd.storage.events import MAX_TEXT, EventLog, error_fields
from sgd_testing import FakeGroup, fake_trainer_run, rounds_of


def _events(run_dir):
    read = runs.read_events(run_dir)
    assert read.bad_lines == []
    return read.events


def _kinds(run_dir):
    return [e["event"] for e in _events(run_dir)]


def _one(run_dir, kind):
    found = [e for e in _events(run_dir) if e["event"] == kind]
    assert len(found) == 1, (kind, _kinds(run_dir))
    return found[0]


# --- what the controller writes -----------------------------------------------------------------


def test_a_run_that_goes_well_writes_its_start_its_checkpoints_and_its_end(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).save({"epoch": 1}).report({"loss": 0.5}).finish()
    rounds_of(fake_trainer_run(group, tmp_path))
    run_dir = tmp_path / "run_001"
    assert _kinds(run_dir) == ["run_started", "attempt_started", "checkpoint_persisted", "run_finished"]
    events = _events(run_dir)
    assert all(e["v"] == runs.EVENTS_FORMAT_VERSION for e in events)
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    started = _one(run_dir, "run_started")
    assert started["driver_attempt"] == 1 and started["pid"] == os.getpid() and started["num_workers"] == 2
    attempt = _one(run_dir, "attempt_started")
    assert attempt["attempt"] == 0 and attempt["iteration"] == 0 and attempt["checkpoint"] is None
    assert [(w["rank"], w["pid"], w["host"]) for w in attempt["workers"]] == [(0, 1000, "host-a"), (1, 1001, "host-b")]
    persisted = _one(run_dir, "checkpoint_persisted")
    assert persisted["checkpoint"] == "checkpoint_000001" and persisted["iteration"] == 1
    assert persisted["bytes"] == sum(f.stat().st_size for f in (run_dir / "checkpoints" / "checkpoint_000001").iterdir()
                                     if f.name != ".metadata.json" and not f.name.startswith(".sgd"))


def test_a_death_writes_the_failed_rank_where_it_ran_the_restart_and_the_new_processes(tmp_path):
    group = FakeGroup(2)
    group.report({"loss": 1.0}).save({"epoch": 1}).report({"loss": 0.9}).die(rank=1)
    group.report({"loss": 0.9}).report({"loss": 0.8}).finish()
    rounds_of(fake_trainer_run(group, tmp_path, max_retries=1))
    run_dir = tmp_path / "run_001"
    assert _kinds(run_dir) == ["run_started", "attempt_started", "checkpoint_persisted", "worker_failed", "restart",
                               "attempt_started", "run_finished"]
    failed = _one(run_dir, "worker_failed")
    assert (failed["rank"], failed["pid"], failed["host"], failed["died"]) == (1, 1001, "host-b", True)
    assert failed["error_type"] == "WorkerDiedError" and failed["phase"] == "training"
    restart = _one(run_dir, "restart")
    assert restart == {**restart, "attempt": 1, "max_failures": 1, "checkpoint": "checkpoint_000001", "iteration": 1}
    second = [e for e in _events(run_dir) if e["event"] == "attempt_started"][1]
    assert second["attempt"] == 1 and second["checkpoint"] == "checkpoint_000001" and second["iteration"] == 1
    assert [w["pid"] for w in second["workers"]] == [1002, 1003]  # new processes


def test_a_user_error_writes_its_type_message_and_traceback_and_the_failed_end(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).raise_(ValueError("bad batch"), rank=0)
    with pytest.raises(ValueError):
        rounds_of(fake_trainer_run(group, tmp_path))
    run_dir = tmp_path / "run_001"
    assert _kinds(run_dir)[-2:] == ["worker_failed", "run_failed"]
    failed = _one(run_dir, "worker_failed")
    assert failed["died"] is False and failed["error_type"] == "ValueError" and failed["message"] == "bad batch"
    end = _one(run_dir, "run_failed")
    # The worker's own traceback (the fake group's is "(fake)"), not the driver's re-raise.
    assert (end["error_type"], end["message"], end["traceback"]) == ("ValueError", "bad batch", "(fake)")
    assert failed["rank"] == 0 and failed["pid"] == 1000 and failed["host"] == "host-a"


def test_a_lost_host_a_drain_and_a_hang_are_each_written_where_they_are_decided(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).call(lambda g: g.lose_host(rank=1)).idle()
    group.call(lambda g: setattr(g, "health_now", sgd.group.status.HEALTHY))
    group.report({"loss": 1.0}).call(lambda g: g.drain("node-b", deadline_in_s=1.0)).idle()
    group.call(lambda g: setattr(g, "health_now", sgd.group.status.HEALTHY)).report({"loss": 0.5})
    group.idle(since_s=11).report({"loss": 0.5}).finish()
    rounds_of(fake_trainer_run(group, tmp_path, max_retries=2, hang_timeout_s=10))
    run_dir = tmp_path / "run_001"
    kinds = _kinds(run_dir)
    assert kinds.count("attempt_started") == 4 and kinds[-1] == "run_finished"
    lost = _one(run_dir, "host_lost")
    assert lost["ranks"] == [1] and lost["host"] == "host-b" and lost["node_ip"] == "10.0.0.2"
    assert kinds.index("host_lost") < kinds.index("worker_failed") < kinds.index("restart")
    drain = _one(run_dir, "drain_notice")
    assert [h["node_id"] for h in drain["hosts"]] == ["node-b"] and drain["hosts"][0]["deadline"] > 0
    resize = _one(run_dir, "resize")
    assert (resize["from"], resize["to"]) == (2, 2)
    restarts = [e for e in _events(run_dir) if e["event"] == "restart"]
    assert [r["attempt"] for r in restarts] == [1, None, 2]  # a resize is not a failure
    hang = _one(run_dir, "hang")
    assert hang["timeout_s"] == 10 and isinstance(hang["stragglers"], list)
    assert [e["error_type"] for e in _events(run_dir) if e["event"] == "worker_failed"] == [
        "WorkerDiedError", "TrainingHangError"]


def test_an_in_place_reform_writes_the_lost_rank_and_the_survivors_with_their_pids(tmp_path):
    group = FakeGroup(3, min_workers=2, max_workers=3).report({"loss": 1.0})
    group.lose_in_place(rank=2, commits=1).report({"loss": 0.5}).finish()
    rounds_of(fake_trainer_run(group, tmp_path, max_retries=1))
    run_dir = tmp_path / "run_001"
    assert _kinds(run_dir) == ["run_started", "attempt_started", "worker_failed", "reformed", "run_finished"]
    assert _one(run_dir, "worker_failed")["rank"] == 2 and _one(run_dir, "worker_failed")["pid"] == 1002
    reformed = _one(run_dir, "reformed")
    assert (reformed["from"], reformed["to"], reformed["attempt"]) == (3, 2, 1)
    assert reformed["survivors"] == [{"rank": 0, "pid": 1000}, {"rank": 1, "pid": 1001}] and reformed["joined"] == []


def test_retries_running_out_end_the_log_with_the_failure(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).die(rank=0).die(rank=1)
    with pytest.raises(TrainingFailedError):
        rounds_of(fake_trainer_run(group, tmp_path, max_retries=1))
    kinds = _kinds(tmp_path / "run_001")
    assert kinds.count("worker_failed") == 2 and kinds.count("restart") == 1 and kinds[-1] == "run_failed"


def test_a_stop_and_ctrl_c_end_the_log_as_such(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path)
    run.next()
    run.stop(patience_s=1.0)
    assert _kinds(tmp_path / "run_001")[-1] == "run_stopped"

    def interrupt(group):
        raise KeyboardInterrupt

    group = FakeGroup(1).report({"loss": 1.0}).call(interrupt)
    with pytest.raises(KeyboardInterrupt):
        rounds_of(fake_trainer_run(group, tmp_path / "second"))
    assert _kinds(tmp_path / "second" / "run_001")[-1] == "run_interrupted"


def test_kept_checkpoints_pushed_out_and_a_damaged_one_passed_over_are_written(tmp_path):
    group = FakeGroup(1).save({"e": 1}).save({"e": 2}).save({"e": 3}).report({"loss": 1.0})
    group.call(lambda g: _damage(tmp_path / "run_001" / "checkpoints" / "checkpoint_000003")).die(rank=0)
    group.report({"loss": 1.0}).finish()
    rounds_of(fake_trainer_run(group, tmp_path, max_retries=1, num_to_keep=2))
    run_dir = tmp_path / "run_001"
    assert [e["checkpoint"] for e in _events(run_dir) if e["event"] == "checkpoint_deleted"] == ["checkpoint_000001"]
    rejected = _one(run_dir, "checkpoint_rejected")
    assert rejected["checkpoint"] == "checkpoint_000003" and "checkpoint_000003" in rejected["reason"]
    assert _one(run_dir, "restart")["checkpoint"] == "checkpoint_000002"


def _damage(folder):
    for f in folder.iterdir():
        if not f.name.startswith("."):
            f.write_bytes(b"damaged")


def test_a_resumed_run_whose_driver_died_says_so_before_its_new_start(tmp_path):
    log = EventLog(tmp_path)
    events = RunEvents(log, FakeGroup(2))
    events.run_started(2, 2, 7, {"status": "DRIVER_DIED", "pid": 4242, "host": "laptop", "attempt": 1, "time": 5.0})
    log.close()
    died, started = _events(tmp_path)
    assert died["event"] == "driver_died" and (died["pid"], died["host"], died["driver_attempt"]) == (4242, "laptop", 1)
    assert started["event"] == "run_started" and started["driver_attempt"] == 2 and started["resumed_iteration"] == 7


def test_the_log_is_not_written_per_report_round(tmp_path):
    group = FakeGroup(2)
    for i in range(200):
        group.report({"loss": float(i)})
    rounds_of(fake_trainer_run(group.finish(), tmp_path))
    assert _kinds(tmp_path / "run_001") == ["run_started", "attempt_started", "run_finished"]


# --- the text an event keeps --------------------------------------------------------------------


def test_secrets_in_an_error_are_masked_and_a_long_traceback_is_cut_keeping_its_end():
    try:
        raise RuntimeError("could not log in with api_key=sk-123456 to wandb, token: abc")
    except RuntimeError as exc:
        fields = error_fields(exc)
    assert fields["message"] == "could not log in with api_key=*** to wandb, token: ***"
    assert "sk-123456" not in fields["traceback"] and "api_key=***" in fields["traceback"]
    try:
        raise RuntimeError("x" * (3 * MAX_TEXT) + " the end")
    except RuntimeError as exc:
        fields = error_fields(exc)
    for text in (fields["message"], fields["traceback"]):
        assert len(text) <= MAX_TEXT + 20 and text.startswith("[... cut ...]") and text.rstrip().endswith("the end")


def test_event_fields_that_name_secrets_are_left_out_and_odd_values_written_as_text(tmp_path):
    log = EventLog(tmp_path)
    log.write("resize", reason="x", wandb_api_key="secret", where={1, 2}, score=float("nan"))
    log.close()
    (event,) = _events(tmp_path)
    assert "wandb_api_key" not in event and event["where"] == "{1, 2}" and event["score"] == "NaN"


# --- reading ------------------------------------------------------------------------------------


def test_the_reader_follows_a_growing_file_by_offset_and_leaves_a_half_written_line(tmp_path):
    log = EventLog(tmp_path)
    log.write("run_started", driver_attempt=1)
    first = runs.read_events(tmp_path)
    assert [e["event"] for e in first.events] == ["run_started"]
    with open(tmp_path / runs.EVENTS_FILE, "a") as f:
        f.write('{"v": 1, "time": 2.0, "event": "run_fini')  # the writer is mid-line
    again = runs.read_events(tmp_path, first.offset)
    assert again.events == [] and again.offset == first.offset
    with open(tmp_path / runs.EVENTS_FILE, "a") as f:
        f.write('shed"}\n')
    done = runs.read_events(tmp_path, again.offset)
    assert [e["event"] for e in done.events] == ["run_finished"]
    assert done.offset == (tmp_path / runs.EVENTS_FILE).stat().st_size


def test_the_reader_reads_past_damaged_lines_and_names_where_they_are(tmp_path):
    good = json.dumps({"v": 1, "time": 1.0, "event": "run_started"})
    text = f"{good}\nnot json\n[1, 2]\n{{\"v\": 1, \"event\": \"no time\"}}\n{good}\n\n"
    (tmp_path / runs.EVENTS_FILE).write_text(text)
    read = runs.read_events(tmp_path)
    assert [e["event"] for e in read.events] == ["run_started", "run_started"]
    assert read.bad_lines == [len(good) + 1, len(good) + 10, len(good) + 17]


def test_a_run_written_before_events_reads_as_none(tmp_path):
    read = runs.read_events(tmp_path)
    assert read.events == [] and read.offset == 0 and read.bad_lines == []
    assert runs.read_events(tmp_path / "missing").events == []


def test_every_kind_is_documented():
    documented = set(runs.EVENT_KINDS)
    doc = (os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "docs", "events.md"))
    text = open(doc).read()
    assert all(f"`{kind}`" in text for kind in documented), [k for k in documented if f"`{k}`" not in text]
