"""``sgd.collective``'s meeting point (:class:`sgd._common.rendezvous.Rendezvous`) stepped by hand,
without Ray: releases, mismatches, a rank that returned, timeouts, restarts. The Ray side is
``packages/sgd-core/tests/test_collective.py``."""

import asyncio
import pickle

import pytest

import sgd
import sgd.collective
from sgd._common.rendezvous import BARRIER, BROADCAST, Rendezvous
from sgd.collective import CollectiveMismatchError, CollectiveTimeoutError
from sgd.group.collective_actor import CollectiveActor, collective_run


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_released_once_every_rank_arrived_with_rank_zeros_payload():
    rv = Rendezvous()
    c1, decided = rv.arrive(1, 0, 1, 1, 3, BROADCAST, payload="ignored")
    assert c1.outcome is None and decided == []
    c0, decided = rv.arrive(1, 0, 1, 0, 3, BROADCAST, payload=["from rank 0"])
    assert c0 is c1 and c0.outcome is None and decided == []
    c2, decided = rv.arrive(1, 0, 1, 2, 3, BROADCAST)
    assert c2 is c1 and decided == [c1]
    assert c1.outcome == ("ok", ["from rank 0"])
    assert rv.open_count == 0
    # the next call number is a new collective
    c, _ = rv.arrive(1, 0, 2, 0, 3, BARRIER)
    assert c is not c1 and c.outcome is None and rv.open_count == 1


def test_different_calls_at_one_number_fail_for_every_rank_at_once():
    rv = Rendezvous()
    waiting, _ = rv.arrive(1, 0, 1, 0, 3, BARRIER)
    other, decided = rv.arrive(1, 0, 1, 2, 3, BROADCAST)
    assert decided == [waiting] and other is waiting
    kind, error = waiting.outcome
    assert kind == "error" and isinstance(error, CollectiveMismatchError)
    assert "ranks [0] called sgd.collective.barrier" in str(error)
    assert "ranks [2] called sgd.collective.broadcast_from_rank_zero" in str(error)
    assert error.number == 1 and error.calls == {0: BARRIER, 2: BROADCAST}
    # the rank that comes later gets the same error, without waiting
    late, _ = rv.arrive(1, 0, 1, 1, 3, BARRIER)
    assert late.outcome == ("error", error)


def test_a_rank_that_returned_with_fewer_calls_fails_the_ranks_waiting_for_it():
    rv = Rendezvous()
    rv.arrive(1, 0, 1, 0, 2, BARRIER)
    first, decided = rv.arrive(1, 0, 1, 1, 2, BARRIER)
    assert first.outcome == ("ok", None)
    second, _ = rv.arrive(1, 0, 2, 0, 2, BARRIER)
    assert second.outcome is None
    assert rv.leave(1, 0, 1, 1) == [second]
    kind, error = second.outcome
    assert isinstance(error, CollectiveMismatchError)
    assert "training function of rank 1 returned after 1 collective call," in str(error)
    assert "ranks [0] wait in call #2" in str(error)
    # a call made after the other rank left fails at once too
    third, decided = rv.arrive(1, 0, 3, 0, 2, BARRIER)
    assert decided == [third] and isinstance(third.outcome[1], CollectiveMismatchError)


def test_a_rank_that_returned_after_as_many_calls_fails_nothing():
    rv = Rendezvous()
    # rank 1's last call is still open (rank 0 comes later): it returned after it, as it may
    rv.arrive(1, 0, 1, 1, 2, BARRIER)
    assert rv.leave(1, 0, 1, 1) == []
    assert rv.arrive(1, 0, 1, 0, 2, BARRIER)[0].outcome == ("ok", None)


def test_timeout_names_the_ranks_that_never_arrived():
    clock = Clock()
    rv = Rendezvous(clock)
    waiting, _ = rv.arrive(4, 0, 7, 0, 4, BARRIER)
    rv.arrive(4, 0, 7, 2, 4, BARRIER)
    clock.now += 12.5
    assert rv.status(4, 0, 7) == (BARRIER, [0, 2], [1, 3], 12.5)
    assert rv.abort(4, 0, 7, 10.0) == [waiting]
    kind, error = waiting.outcome
    assert isinstance(error, CollectiveTimeoutError) and isinstance(error, TimeoutError)
    assert error.missing_ranks == [1, 3] and error.timeout_s == 10.0 and error.number == 7
    assert "ranks [1, 3] never arrived" in str(error) and "12.5 s" in str(error)
    assert "SGD_COLLECTIVE_TIMEOUT_S" in str(error) and "RAY_TRAIN_COLLECTIVE_TIMEOUT_S" in str(error)
    # a second rank's abort finds nothing left to fail; a straggler gets the error
    assert rv.abort(4, 0, 7, 10.0) == []
    assert rv.arrive(4, 0, 7, 1, 4, BARRIER)[0].outcome == ("error", error)
    assert rv.status(4, 0, 7) is None


def test_a_new_run_ends_what_the_old_one_left_open_and_refuses_its_stragglers():
    rv = Rendezvous()
    old, _ = rv.arrive(1, 0, 3, 0, 2, BARRIER)
    new, decided = rv.arrive(2, 0, 1, 1, 2, BARRIER)
    assert decided == [old] and old.outcome[0] == "error" and "left open" in str(old.outcome[1])
    assert new.outcome is None
    straggler, _ = rv.arrive(1, 0, 3, 1, 2, BARRIER)
    assert straggler.outcome[0] == "error" and "run that has ended" in str(straggler.outcome[1])
    assert rv.arrive(2, 0, 1, 0, 2, BARRIER)[0].outcome == ("ok", None)


def test_generations_of_a_run_count_apart():
    rv = Rendezvous()
    a, _ = rv.arrive(1, (0, 5, (0, 5)), 1, 0, 2, BARRIER)
    b, _ = rv.arrive(1, (1, 9, (1, 2)), 1, 0, 3, BARRIER)
    assert a is not b and a.outcome is None and b.outcome is None
    rv.leave(1, (0, 5, (0, 5)), 1, 0)  # a rank of the old world left: only the old world's call fails
    assert a.outcome[0] == "error" and b.outcome is None


def test_errors_pickle_with_their_fields():
    error = CollectiveTimeoutError("t", [1], 3.0, BARRIER, 2)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is CollectiveTimeoutError and back.missing_ranks == [1] and back.number == 2
    assert type(back).__module__ == "sgd.collective"
    mismatch = pickle.loads(pickle.dumps(CollectiveMismatchError("m", 3, {0: BARRIER})))
    assert mismatch.calls == {0: BARRIER} and mismatch.number == 3


def test_called_outside_a_training_function_is_a_runtime_error():
    with pytest.raises(RuntimeError, match=r"sgd.collective.barrier\(\) was called outside a training function"):
        sgd.collective.barrier()
    with pytest.raises(RuntimeError, match="broadcast_from_rank_zero.*outside a training function"):
        sgd.collective.broadcast_from_rank_zero({"a": 1})
    from sgd import collective

    assert collective is sgd.collective
    assert sorted(collective.__all__) == sorted(
        ["barrier", "broadcast_from_rank_zero", "CollectiveMismatchError", "CollectiveTimeoutError"])


def test_settings_come_from_sgds_variables_or_rays(monkeypatch):
    for name in ("SGD_COLLECTIVE_TIMEOUT_S", "RAY_TRAIN_COLLECTIVE_TIMEOUT_S", "SGD_COLLECTIVE_WARN_INTERVAL_S",
                 "RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S"):
        monkeypatch.delenv(name, raising=False)
    assert collective_run("g", 3) == ("g", 3, None, 60.0)  # Ray's defaults: no timeout, a warning a minute
    monkeypatch.setenv("RAY_TRAIN_COLLECTIVE_TIMEOUT_S", "30")
    monkeypatch.setenv("RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S", "5")
    assert collective_run("g", 4) == ("g", 4, 30.0, 5.0)
    monkeypatch.setenv("SGD_COLLECTIVE_TIMEOUT_S", "none")  # sgd's name wins
    assert collective_run("g", 5) == ("g", 5, None, 5.0)
    monkeypatch.setenv("SGD_COLLECTIVE_TIMEOUT_S", "-2")
    with pytest.raises(ValueError, match="SGD_COLLECTIVE_TIMEOUT_S must be a number of seconds > 0.*'-2'"):
        collective_run("g", 6)


def test_the_actor_keeps_groups_apart_and_wakes_the_waiting_calls():
    async def scenario():
        actor = CollectiveActor()
        first = asyncio.ensure_future(actor.arrive("g1", 1, 0, 1, 0, 2, BROADCAST, ["payload"]))
        other_group = asyncio.ensure_future(actor.arrive("g2", 1, 0, 1, 1, 2, BARRIER))
        await asyncio.sleep(0)  # both wait
        assert not first.done() and not other_group.done()
        assert await actor.status("g1", 1, 0, 1) == (BROADCAST, [0], [1], pytest.approx(0, abs=5))
        assert await actor.arrive("g1", 1, 0, 1, 1, 2, BROADCAST) == ("ok", ["payload"])
        assert await first == ("ok", ["payload"])
        assert await actor.groups() == 2
        await actor.forget("g2")  # the group shut down: its waiting call fails, its state goes
        kind, error = await other_group
        assert kind == "error" and "shut down" in str(error)
        assert await actor.groups() == 1

    asyncio.run(scenario())
