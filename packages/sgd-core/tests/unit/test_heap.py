"""A worker process's heap leaves the collector's full passes before its first run
(``sgd._worker.heap``): at N = 32 the workers' oldest-generation collections, all in the same
round, made one run in 20–40 take ten times as long."""

import gc
import weakref

import pytest

from sgd._worker import heap


@pytest.fixture
def fresh_process(monkeypatch):
    """This process as a worker that has not run anything yet; the heap unfrozen afterwards."""
    monkeypatch.setattr(heap, "_settled", False)
    monkeypatch.delenv("SGD_GC_FREEZE", raising=False)
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_first_run_freezes_what_the_process_holds_and_collects_its_young_garbage_first(fresh_process):
    class Cycle:
        pass

    garbage = Cycle()
    garbage.me = garbage  # a cycle only the collector can free
    gone = weakref.ref(garbage)
    del garbage
    alive = Cycle()
    alive.me = alive
    kept = weakref.ref(alive)
    assert heap.settle() is True
    assert gc.get_freeze_count() > 1000  # the modules of this process, at least
    assert gone() is None  # the young garbage was collected first, not frozen
    assert kept() is alive and alive not in gc.get_objects()  # the live object is frozen


def test_later_runs_leave_the_heap_alone(fresh_process):
    assert heap.settle() is True
    frozen = gc.get_freeze_count()
    made_since = [object() for _ in range(10)] + [[] for _ in range(1000)]
    assert heap.settle() is False
    assert gc.get_freeze_count() == frozen  # what runs make stays collectable
    assert made_since[-1] in gc.get_objects()


def test_it_is_off_with_sgd_gc_freeze_0(fresh_process, monkeypatch):
    monkeypatch.setenv("SGD_GC_FREEZE", "0")
    assert heap.settle() is False
    assert gc.get_freeze_count() == 0
