"""A run's first items travel with each worker's start call (issue 35, item 7): the start call
waits up to ``sgd.group.starts.FIRST_REPLY_S`` for what the run makes first, then up to
``FIRST_LINGER_S`` more for the run's end, and answers with both, so a short run costs one call
per worker instead of a start and its polls. What the workers make after that, or a run slower
than the wait, is polled as before. The waits are set here to an hour (the start call always
answers) or to nothing (the start call answers nothing: every item comes with a poll), so that
no case depends on how fast the machine is."""

import pytest

import sgd
import sgd.group.starts

HOUR = 3600.0


@pytest.fixture
def first_wait(monkeypatch):
    def set_wait(seconds, linger=0.0):
        monkeypatch.setattr(sgd.group.starts, "FIRST_REPLY_S", seconds)
        monkeypatch.setattr(sgd.group.starts, "FIRST_LINGER_S", linger)

    return set_wait


def _rank():
    return sgd.world_rank()


def _reports(config):
    for step in range(config["steps"]):
        sgd.report(step=step, rank=sgd.world_rank())
    return sgd.world_rank() * 10


def _one_report():
    sgd.report(rank=sgd.world_rank())
    return sgd.world_rank()


@pytest.mark.parametrize("func", [_rank, _one_report], ids=["no-report", "one-report"])
def test_a_run_that_ends_within_the_wait_costs_one_call_per_worker(base_trainer, actor_calls, first_wait, func):
    first_wait(HOUR, linger=HOUR)  # the end always comes with the first items
    for _ in range(2):
        actor_calls.clear()
        assert base_trainer.run(func) == [0, 1]
        assert dict(actor_calls) == {"_sgd_start_training": 2}  # no poll, no watch


def test_without_the_linger_a_run_ends_the_same_whichever_call_brings_its_end(base_trainer, actor_calls, first_wait):
    first_wait(HOUR, linger=0.0)
    rounds = []

    class Rounds(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            rounds.append(sorted(r["rank"] for r in results))

    assert base_trainer.run(_one_report, callbacks=[Rounds()]) == [0, 1]
    assert rounds == [[0, 1]]
    assert actor_calls["_sgd_start_training"] == 2


@pytest.mark.parametrize("wait", [HOUR, 0.0], ids=["answered-by-start", "polled"])
def test_every_round_arrives_in_order_whichever_call_carries_it(base_trainer, actor_calls, first_wait, wait):
    first_wait(wait)
    rounds = []

    class Rounds(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            rounds.append([(r["step"], r["rank"]) for r in results])

    assert base_trainer.run(_reports, config={"steps": 50}, callbacks=[Rounds()]) == [0, 10]
    assert rounds == [[(step, 0), (step, 1)] for step in range(50)]
    if wait == 0.0:
        assert actor_calls["_sgd_poll"] >= 2  # no wait: the start calls answer nothing


def _fails_at_once():
    raise ValueError(f"rank {sgd.world_rank()} has bad data")


def test_an_error_in_the_first_reply_is_the_runs_error(base_trainer, actor_calls, first_wait):
    first_wait(HOUR)
    with pytest.raises(ValueError, match=r"rank \d has bad data"):
        base_trainer.run(_fails_at_once)
    assert actor_calls["_sgd_poll"] == 0  # it came with the start calls' replies
    assert base_trainer.run(_rank) == [0, 1]  # and the trainer goes on
