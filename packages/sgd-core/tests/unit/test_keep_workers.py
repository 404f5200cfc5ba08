"""The kept worker processes' book-keeping (sgd.worker_group.keep), without Ray: which process a
group takes, which are ended over the limit, what another Ray session's are worth."""

import pytest

from sgd.worker_group import keep
from sgd.worker_group.keep import Parked


@pytest.fixture
def kept(monkeypatch):
    session = {"now": "s1/01"}
    monkeypatch.setattr(keep, "_ray_session", lambda: session["now"])
    pool = keep._Kept()
    pool.limit = 3
    return pool, session


def test_a_group_takes_a_process_of_its_tag_on_the_node_it_needs(kept):
    pool, _ = kept
    assert pool.park("torch", [Parked("a", "n1"), Parked("b", "n2")]) == []
    assert pool.take("tensorflow", "n1") is None
    assert pool.take("torch", "n3") is None
    assert pool.take("torch", "n2") == "b"
    assert pool.take("torch", "n2") is None
    assert pool.count() == 1


def test_over_the_limit_the_oldest_parked_are_ended(kept):
    pool, _ = kept
    assert pool.park("torch", [Parked("a", "n1", 11, "h"), Parked("b", "n1")]) == []
    assert pool.park("base", [Parked("c", "n1"), Parked("d", "n1")]) == [Parked("a", "n1", 11, "h")]
    pool.limit = 1
    assert sorted(e.actor for e in pool.trim()) == ["b", "c"]
    assert pool.take("base", "n1") == "d"


def test_processes_of_another_ray_session_are_forgotten_not_given(kept):
    pool, session = kept
    pool.park("torch", [Parked("a", "n1")])
    session["now"] = "s2/01"  # ray.shutdown(), ray.init(): those processes ended with the old connection
    assert pool.take("torch", "n1") is None
    assert pool.count() == 0


def test_draining_gives_every_parked_process_of_this_session_with_its_pid(kept, monkeypatch):
    pool, session = kept
    monkeypatch.setattr(keep.ray, "is_initialized", lambda: True)
    pool.park("torch", [Parked("a", "n1", 11, "h1")])
    pool.park("base", [Parked("b", "n2", 12, "h2")])
    assert sorted(pool.drain()) == [Parked("a", "n1", 11, "h1"), Parked("b", "n2", 12, "h2")]
    assert pool.count() == 0 and pool.drain() == []


def test_only_cpu_groups_of_a_tagged_owner_are_kept(monkeypatch):
    monkeypatch.setattr(keep.KEPT, "limit", 2)
    assert keep.tag_for({"CPU": 1}, "torch") == "torch"
    assert keep.tag_for({"CPU": 1}, None) is None
    assert keep.tag_for({"CPU": 1, "GPU": 1}, "torch") is None
    assert keep.tag_for({"CPU": 1, "TPU": 1}, "torch") is None
    assert keep.tag_for({"CPU": 0.5}, "torch") == "torch"
    assert keep.tag_for({"CPU": 2}, "torch") is None  # its OMP_NUM_THREADS would be 1, not 2
    monkeypatch.setattr(keep.KEPT, "limit", 0)
    assert keep.tag_for({"CPU": 1}, "torch") is None


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_keep_workers_refuses_what_is_not_a_count(bad):
    with pytest.raises(ValueError, match="keep_workers"):
        keep.keep_workers(bad)


@pytest.mark.parametrize("raw", ["x", "-2"])
def test_a_bad_environment_variable_is_named(monkeypatch, raw):
    monkeypatch.setenv(keep.ENV, raw)
    with pytest.raises(ValueError, match="SGD_KEEP_WORKERS"):
        keep._limit_from_env()
