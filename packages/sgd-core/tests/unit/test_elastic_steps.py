"""In-place recovery (sgd.elastic) without Ray: the controller's decisions at a reset barrier,
the keys that keep a redone step from being reported twice, and the State API's edges."""

import threading

import pytest

from sgd import elastic
from sgd._worker.resets import Arrival, ResetInterrupt, ResetLink, Resume
from sgd._worker.session import STATE, Session, WorkerContext
from sgd.errors import TrainingFailedError
from sgd.run.controller import Reforming, RunState
from sgd_testing import FakeGroup, fake_trainer_run, rounds_of

S = RunState


def _losses(rounds):
    return [r[0]["loss"] for r in rounds]


# --- the controller at a reset barrier ----------------------------------------------------------


def test_a_loss_in_elastic_run_reforms_in_place_and_counts_as_a_retry(tmp_path):
    group = FakeGroup(3).report({"loss": 1.0}).lose_in_place(rank=2, commits=1).report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=1)
    assert _losses(rounds_of(run)) == [1.0, 0.5]
    assert run.transitions == [S.STARTING, S.RUNNING, S.REFORMING, S.RUNNING, S.FINISHED]
    reforming = next(h for h in run.history if isinstance(h, Reforming))
    assert reforming.attempt == 1 and sorted(reforming.barrier.gone) == [2]
    assert group.reforms == 1 and group.restarts == 0
    # told how many reports were delivered, so the survivors' next one is the second
    assert [d for name, d in group.calls if name == "reform"] == [{"gone": [2], "iteration": 1}]


def test_in_place_recoveries_run_out_at_max_retries(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).lose_in_place(rank=1).lose_in_place(rank=1).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=1)
    with pytest.raises(TrainingFailedError, match="max_retries=1") as info:
        rounds_of(run)
    assert "worker rank 1 died" in str(info.value.__cause__)
    assert group.reforms == 1
    assert run.transitions[-2:] == [S.FAILING, S.ERRORED]


def test_a_failed_reform_falls_back_to_a_restart_from_the_checkpoint_without_counting_twice(tmp_path):
    group = FakeGroup(2).save({"step": 1}).report({"loss": 1.0}).lose_in_place(rank=0)
    group.outcome("reform", RuntimeError("no room for the workers needed"))
    group.report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=1)
    assert _losses(rounds_of(run)) == [1.0, 0.5]
    assert run.transitions == [S.STARTING, S.RUNNING, S.REFORMING, S.RESTARTING, S.RUNNING, S.FINISHED]
    assert group.reforms == 1 and group.restarts == 1
    assert group.started_from(-1) == {"step": 1}


def test_a_sync_reforms_without_counting_a_failure(tmp_path):
    group = FakeGroup(2).report({"loss": 1.0}).sync(commits=1).sync(commits=2).report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=0)
    assert _losses(rounds_of(run)) == [1.0, 0.5]
    assert [h.attempt for h in run.history if isinstance(h, Reforming)] == [0, 0]


def test_an_elastic_group_goes_on_smaller_when_its_survivors_are_enough(tmp_path):
    group = FakeGroup(3, min_workers=2, max_workers=3).report({"loss": 1.0}).lose_in_place(rank=0)
    group.report({"loss": 0.5}, {"loss": 0.6}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=1)
    rounds = rounds_of(run)
    assert [len(r) for r in rounds] == [3, 2] and group.num_workers == 2


# --- keys: nothing reported twice, nothing skipped -------------------------------------------------


def _link():
    sent = []
    link = ResetLink(threading.Condition(), lambda kind, data: sent.append((kind, data)))
    link.entered = True
    return link, sent


def test_commit_then_report_a_redone_step_is_reported_once():
    a, _ = _link()  # a survivor that committed and reported step 2
    for _ in range(2):
        a.committed()
        assert not a.skips()
    assert a.commits == 2 and a.sent == (2, 1)
    b, _ = _link()  # one that died (or fell behind) before its second commit
    b.committed()
    assert not b.skips()
    # The group re-forms from a's commit (the most commits); the driver delivered a's report 2.
    plan = Resume(commits=2, delivered=max(a.sent, b.sent))
    for link in (a, b):
        link._go_on(plan)
        link.committed()  # step 3
        assert not link.skips(), "the report of a step after the root's commit must be sent"


def test_report_then_commit_a_redone_step_is_not_reported_again():
    a, _ = _link()
    a.committed()  # step 1: report, then commit
    assert not a.skips()  # step 2's report
    delivered = a.sent
    # lost before step 2's commit: the group goes back to commit 1 and redoes step 2
    a._go_on(Resume(commits=1, delivered=delivered))
    assert a.skips(), "step 2 was delivered before the reset: its redone report must not be sent"
    a.committed()
    assert not a.skips(), "step 3's report is new"


def test_the_barrier_sends_its_arrival_and_returns_the_drivers_plan():
    link, sent = _link()
    link.committed()
    plan = Resume(commits=5, delivered=(5, 0), reason="sync")
    answer = threading.Timer(0.05, lambda: link.resume(plan, {"x": 1}))
    answer.start()
    got_plan, snapshot = link.barrier("sync", failed=False)
    assert (got_plan, snapshot) == (plan, {"x": 1})
    assert sent == [("elastic", Arrival(1, (1, 0), "sync", False))]
    assert link.commits == 5


def test_an_interrupt_raises_at_the_next_check_only_inside_elastic_run():
    link, _ = _link()
    link.entered = False
    assert link.interrupt(hard=False) is False  # not in elastic.run: the driver restarts instead
    link.check()
    link.entered = True
    link.interrupt(hard=False)
    with pytest.raises(ResetInterrupt):
        link.check()


def test_a_framework_loop_reads_the_request_without_sgd_raising_into_it(session):
    """sgd.elastic.reset_link(): the seam for a framework's own elastic loop (sgd-horovod's
    hvd.elastic.run). It leaves `entered` false, so a report never raises ResetInterrupt, and
    reads `requested` at its own sync points; the barrier answers it."""
    assert elastic.reset_link() is session.resets
    link = session.resets
    link.interrupt(hard=False)
    assert link.requested and not link.hard
    link.check()  # not entered: nothing raised into the framework's loop
    link.resume(Resume(commits=3), None)
    link.barrier("the group re-forms", failed=False)
    assert not link.requested and link.commits == 3


def test_no_reset_link_outside_a_training_function():
    assert elastic.reset_link() is None


# --- the State API ------------------------------------------------------------------------------


def test_object_state_commits_a_copy_and_restores_it():
    state = elastic.ObjectState(step=1, history=[1.0])
    state.commit()
    state.step, state.history = 7, state.history + [2.0]
    state.history.append(3.0)
    state.restore()
    assert (state.step, state.history) == (1, [1.0])


def test_object_state_refuses_bad_names_and_names_a_value_it_cannot_keep():
    with pytest.raises(ValueError, match="'commit'"):
        elastic.ObjectState(commit=1)
    state = elastic.ObjectState(step=0, lock=threading.Lock())
    with pytest.raises(TypeError, match="'lock'"):
        state.commit()


def test_restore_before_any_commit_says_so():
    with pytest.raises(RuntimeError, match="nothing to restore"):
        elastic.ObjectState(step=0).restore()


def test_reset_callbacks_must_be_callable_and_run_in_order():
    state = elastic.ObjectState(step=0)
    calls = []
    state.register_reset_callbacks([lambda: calls.append(1), lambda: calls.append(2)])
    state.on_reset()
    assert calls == [1, 2]
    with pytest.raises(TypeError, match="callables"):
        state.register_reset_callbacks([3])


def test_elastic_run_outside_a_training_function_says_where_to_call_it():
    @elastic.run
    def train(state):
        return state.step

    with pytest.raises(RuntimeError, match="outside a training function"):
        train(elastic.ObjectState(step=0))
    with pytest.raises(TypeError, match="State first"):
        train({"step": 0})


@pytest.fixture
def session():
    previous = STATE.session, STATE.context
    s = Session(lambda: None, WorkerContext(world_size=2), lambda d: d)
    STATE.session, STATE.context = s, s.context
    yield s
    STATE.session, STATE.context = previous


def test_elastic_run_with_a_backend_that_cannot_reform_names_what_is_missing(session):
    @elastic.run
    def train(state):
        return 1

    with pytest.raises(RuntimeError, match="cannot re-form its group in place.*drop elastic.run"):
        train(elastic.ObjectState(step=0))


def test_a_user_error_in_elastic_run_is_not_taken_for_a_lost_peer(session):
    session.resets.capable = True
    sent = []
    session.resets._put = lambda kind, data: sent.append(kind)

    @elastic.run
    def train(state):
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        train(elastic.ObjectState(step=0))
    assert sent == ["elastic"]  # the note that the run recovers in place; no barrier


def test_a_peer_failure_in_elastic_run_waits_at_the_barrier_and_calls_again_from_the_commit(session):
    session.resets.capable = True
    arrivals = []

    def put(kind, data):
        arrivals.append(data)
        if data.waits:  # the driver answers: go on, restoring your own commit
            threading.Timer(0.01, lambda: session.resets.resume(Resume(commits=data.commits, delivered=data.sent),
                                                                None)).start()

    session.resets._put = put
    calls = []

    @elastic.run
    def train(state):
        calls.append(state.step)
        state.step += 1
        state.commit()
        if len(calls) == 1:
            state.step += 10  # not committed: lost with the reset
            raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
        return state.step

    assert train(elastic.ObjectState(step=0)) == 2
    assert calls == [0, 1]
    assert [a.waits for a in arrivals] == [False, True] and arrivals[1].failed
    assert "Connection closed by peer" in arrivals[1].reason
