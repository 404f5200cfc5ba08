"""Running training functions on real Ray workers with the no-op backend."""

import os
import threading
import time

import pytest
import ray

import sgd
from sgd_testing import wait_for


class Recorder(sgd.TrainingCallback):
    def __init__(self):
        self.events = []

    def start_training(self, logdir, config, **info):
        self.events.append(("start", logdir, config))

    def handle_result(self, results, **info):
        self.events.append(("result", results))

    def finish_training(self, error=False, **info):
        self.events.append(("finish", error))

    @property
    def rounds(self):
        return [e[1] for e in self.events if e[0] == "result"]


@pytest.fixture(scope="module")
def trainer_2(base_trainer):
    return base_trainer


def test_returns_in_rank_order_and_config_default(trainer_2):
    assert trainer_2.run(lambda: sgd.world_rank()) == [0, 1]
    assert trainer_2.run(lambda config: config) == [{}, {}]
    assert trainer_2.run(lambda config: config["x"], config={"x": 3}) == [3, 3]


def test_reports_autofill_and_callbacks_in_order(trainer_2):
    def train_func(config):
        for i in range(config["n"]):
            sgd.report(step=i, rank=sgd.world_rank())
        return "done"

    rec = Recorder()
    assert trainer_2.run(train_func, config={"n": 4}, callbacks=[rec]) == ["done", "done"]
    assert rec.events[0] == ("start", str(trainer_2.latest_run_dir), {"n": 4})
    assert rec.events[-1] == ("finish", False)
    rounds = rec.rounds
    assert len(rounds) == 4
    for i, results in enumerate(rounds):
        assert [r["rank"] for r in results] == [0, 1]
        for r in results:
            assert r["step"] == i
            assert r["_training_iteration"] == i + 1
            assert isinstance(r["_timestamp"], int) and abs(r["_timestamp"] - time.time()) < 60
            assert r["_time_this_iter_s"] >= 0
            assert "_pid" not in r


def test_report_accepts_a_dict(trainer_2):
    def train_func():
        sgd.report({"a": 1}, b=2)

    rec = Recorder()
    trainer_2.run(train_func, callbacks=[rec])
    assert rec.rounds[0][0]["a"] == 1 and rec.rounds[0][0]["b"] == 2


def test_detailed_autofilled_metrics(monkeypatch):
    monkeypatch.setenv("SGD_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "1")
    import sgd_testing.fixtures as f

    f._start_local_ray()
    # The variable is read on the workers, so it must be there before they start.
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=1)
    trainer.start(initialization_hook=lambda: os.environ.__setitem__(
        "SGD_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "1"))
    try:
        rec = Recorder()
        trainer.run(lambda: sgd.report(x=1), callbacks=[rec])
        r = rec.rounds[0][0]
        for key in ("_date", "_time_total_s", "_pid", "_hostname", "_node_ip"):
            assert key in r, key
        assert r["_pid"] != os.getpid()
    finally:
        trainer.shutdown()


def test_run_iterator_yields_same_rounds(trainer_2):
    def train_func():
        for i in range(3):
            sgd.report(i=i)
        return sgd.world_rank() * 10

    rec = Recorder()
    it = trainer_2.run_iterator(train_func, callbacks=[rec])
    assert not it.is_finished()
    assert it.get_final_results() is None
    seen = [[r["i"] for r in round_] for round_ in it]
    assert seen == [[0, 0], [1, 1], [2, 2]]
    assert it.is_finished()
    assert it.get_final_results() == [0, 10]
    assert len(rec.rounds) == 3


def test_get_final_results_force_drains(trainer_2):
    def train_func():
        for i in range(5):
            sgd.report(i=i)
        return "end"

    rec = Recorder()
    it = trainer_2.run_iterator(train_func, callbacks=[rec])
    first = next(it)
    assert [r["i"] for r in first] == [0, 0]
    assert it.get_final_results(force=True) == ["end", "end"]
    assert it.is_finished()
    assert len(rec.rounds) == 5  # the drained rounds went to callbacks too
    with pytest.raises(StopIteration):
        next(it)


def test_mismatched_report_counts_raise_not_hang(trainer_2):
    def train_func():
        for i in range(3 + sgd.world_rank()):
            sgd.report(i=i)

    rec = Recorder()
    with pytest.raises(RuntimeError, match="different number of times") as info:
        trainer_2.run(train_func, callbacks=[rec])
    assert "rank 0" in str(info.value) and "rank 1" in str(info.value)
    assert rec.events[-1] == ("finish", True)
    assert trainer_2.run(lambda: sgd.world_rank()) == [0, 1]


def test_report_and_checkpoint_out_of_step_raise(trainer_2):
    def train_func():
        if sgd.world_rank() == 0:
            sgd.save_checkpoint(step=1)
        else:
            sgd.report(step=1)

    with pytest.raises(RuntimeError, match="out of step"):
        trainer_2.run(train_func)


def test_user_exception_type_rank_and_traceback(trainer_2):
    def train_func():
        if sgd.world_rank() == 1:
            raise ZeroDivisionError("rank one divides by zero")
        sgd.report(ok=True)

    with pytest.raises(ZeroDivisionError, match="rank one divides by zero") as info:
        trainer_2.run(train_func)
    exc = info.value
    assert exc.sgd_world_rank == 1
    cause = exc.__cause__
    assert isinstance(cause, sgd.WorkerError)
    assert cause.world_rank == 1
    assert "train_func" in cause.remote_traceback and "ZeroDivisionError" in cause.remote_traceback
    assert any("rank 1" in note for note in exc.__notes__)


def test_unpicklable_exception_becomes_worker_error(trainer_2):
    def train_func():
        class Local(Exception):
            def __reduce__(self):
                raise TypeError("cannot pickle")

        raise Local("odd")

    with pytest.raises(sgd.WorkerError, match="Local: odd"):
        trainer_2.run(train_func)


def test_other_workers_stopped_promptly(trainer_2):
    """Rank 1 fails while rank 0 blocks forever: run() must raise quickly, not wait for rank 0."""

    def train_func():
        if sgd.world_rank() == 1:
            raise ValueError("stop")
        threading.Event().wait()  # stands in for a collective the failed peer never joins

    start = time.monotonic()
    with pytest.raises(ValueError):
        trainer_2.run(train_func)
    assert time.monotonic() - start < 10
    assert trainer_2.run(lambda: sgd.world_rank()) == [0, 1]


class _CtrlC(sgd.TrainingCallback):
    """Raises KeyboardInterrupt in the driver at the first round, as Ctrl-C would."""

    def handle_result(self, results, **info):
        raise KeyboardInterrupt


def test_ctrl_c_in_the_driver_marks_the_run_interrupted_and_the_trainer_goes_on(trainer_2):
    import json

    from sgd import runs

    def endless():
        while True:
            sgd.report(x=1)

    with pytest.raises(KeyboardInterrupt):
        trainer_2.run(endless, callbacks=[_CtrlC()])
    interrupted = trainer_2.latest_run_dir
    assert json.loads((interrupted / "status.json").read_text())["status"] == "INTERRUPTED"
    assert runs.run_info(interrupted).status == "INTERRUPTED"
    assert trainer_2.run(lambda: sgd.world_rank()) == [0, 1]  # the workers were stopped, not left running
    assert json.loads((trainer_2.latest_run_dir / "status.json").read_text())["status"] == "FINISHED"


def test_workers_run_ahead_by_a_bounded_number(trainer_2):
    """The driver does not consume; workers may buffer at most max_pending reports."""

    def train_func():
        for i in range(50):
            sgd.report(i=i)
        return "finished"

    limit = trainer_2._controller.executor.max_pending
    trainer_2._controller.executor.max_pending = 5
    try:
        it = trainer_2.run_iterator(train_func)

        # Until the driver pulls, each worker's training thread stops after 5 reports.
        def buffered():
            return trainer_2._controller.worker_group.execute(_buffered_count)

        counts = wait_for(lambda: (c := buffered()) and all(n == 5 for n in c) and c, timeout=20)
        assert counts == [5, 5]
        assert [r["i"] for r in next(it)] == [0, 0]
        assert it.get_final_results(force=True) == ["finished", "finished"]
    finally:
        trainer_2._controller.executor.max_pending = limit


def _buffered_count():
    from sgd._worker.session import STATE

    return len(STATE.session._items)


def test_checkpoint_is_a_sync_point(trainer_2):
    def train_func():
        sgd.save_checkpoint(epoch=1, rank=sgd.world_rank())
        assert sgd.load_checkpoint()["epoch"] == 1
        sgd.report(after=True)

    rec = Recorder()
    trainer_2.run(train_func, callbacks=[rec])
    assert trainer_2.latest_checkpoint == {"epoch": 1, "rank": 0}  # rank 0's state is kept
    assert len(rec.rounds) == 1


def test_load_checkpoint_passed_to_run(trainer_2):
    assert trainer_2.run(lambda: sgd.load_checkpoint(), checkpoint={"w": 3}) == [{"w": 3}, {"w": 3}]
    assert trainer_2.run(lambda: sgd.load_checkpoint()) == [None, None]


def test_context_and_ranks(trainer_2):
    def train_func():
        ctx = sgd.get_context()
        return (ctx.get_world_rank(), ctx.get_local_rank(), ctx.get_world_size(), ctx.get_node_rank(),
                sgd.local_world_size())

    assert trainer_2.run(train_func) == [(0, 0, 2, 0, 2), (1, 1, 2, 0, 2)]


def test_context_tells_which_run_this_is(trainer_2):
    def train_func():
        ctx = sgd.get_context()
        return ctx.get_experiment_name(), ctx.get_trial_dir(), ctx.get_trial_name(), ctx.get_trial_id()

    first = trainer_2.run(train_func)
    assert first == [(trainer_2.logdir.name, str(trainer_2.latest_run_dir), None, None)] * 2
    second = trainer_2.run(train_func)
    assert second[0][1] == str(trainer_2.latest_run_dir) != first[0][1]  # each run its own directory


def test_dataset_argument(trainer_2):
    assert trainer_2.run(lambda: sgd.get_dataset_shard(), dataset=[1, 2]) == [[1, 2], [1, 2]]
    assert trainer_2.run(lambda: sgd.get_dataset_shard("b"), dataset={"a": 1, "b": 2}) == [2, 2]
    with pytest.raises(RuntimeError, match="get_dataset_shard"):
        trainer_2.run(lambda: sgd.get_dataset_shard(), dataset={"a": 1, "b": 2})

    def no_dataset():
        import warnings

        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            return sgd.get_dataset_shard(), [str(x.message) for x in w]

    shard, warnings_seen = trainer_2.run(no_dataset)[0]
    assert shard is None and any("no dataset" in m for m in warnings_seen)


def test_several_runs_and_restart_after_shutdown(ray_cluster):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2)
    trainer.start()
    with pytest.raises(RuntimeError, match="already started"):
        trainer.start()
    first = trainer.latest_run_dir
    assert trainer.run(lambda: 1) == [1, 1]
    assert trainer.run(lambda: 2) == [2, 2]
    assert trainer.latest_run_dir.name == "run_002" and first is None
    trainer.shutdown()
    with pytest.raises(RuntimeError):
        trainer.run(lambda: 1)
    trainer.start()
    assert trainer.run(lambda: 3) == [3, 3]
    assert trainer.latest_run_dir.name == "run_003"
    trainer.shutdown()


def test_shutdown_returns_resources(ray_cluster):
    # Other tests' trainers may still be releasing; wait for the cluster to be idle first.
    total = ray.cluster_resources()["CPU"]
    wait_for(lambda: ray.available_resources().get("CPU", 0) >= total - 2, timeout=30)
    before = ray.available_resources().get("CPU", 0)
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2)
    trainer.start()
    wait_for(lambda: ray.available_resources().get("CPU", 0) <= before - 2, timeout=10)
    trainer.run(lambda: None)
    trainer.shutdown()
    wait_for(lambda: ray.available_resources().get("CPU", 0) == before, timeout=20,
             message="CPUs were not given back after shutdown")


def test_initialization_hook_runs_on_every_worker(ray_cluster):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2)
    trainer.start(initialization_hook=lambda: os.environ.__setitem__("SGD_TEST_HOOK", "yes"))
    try:
        assert trainer.run(lambda: os.environ.get("SGD_TEST_HOOK")) == ["yes", "yes"]
    finally:
        trainer.shutdown()


def test_impossible_resources_fail_fast(ray_cluster):
    trainer = sgd.Trainer(backend=sgd.BackendConfig(), num_workers=2, resources_per_worker={"CPU": 64})
    start = time.monotonic()
    with pytest.raises(sgd.ResourcesUnavailableError, match="64"):
        trainer.start()
    assert time.monotonic() - start < 30
    # Nothing is left reserved.
    total = ray.cluster_resources()["CPU"]
    wait_for(lambda: ray.available_resources().get("CPU", 0) >= total - 2, timeout=20)


def test_session_api_outside_training_function():
    with pytest.raises(RuntimeError, match="outside a training function"):
        sgd.report(x=1)
    with pytest.raises(RuntimeError, match="outside"):
        sgd.save_checkpoint(x=1)
    with pytest.raises(RuntimeError, match="outside"):
        sgd.load_checkpoint()
    with pytest.raises(RuntimeError, match="outside"):
        sgd.get_dataset_shard()
    with pytest.warns(RuntimeWarning, match="outside an sgd worker"):
        assert (sgd.world_rank(), sgd.local_rank(), sgd.world_size(), sgd.node_rank()) == (0, 0, 1, 0)


def test_report_rejects_non_dict(trainer_2):
    with pytest.raises(TypeError, match="dict"):
        trainer_2.run(lambda: sgd.report([1, 2]))


def test_reports_made_before_an_error_reach_callbacks(trainer_2):
    def train_func():
        for i in range(3):
            sgd.report(i=i)
        if sgd.world_rank() == 1:
            raise ValueError("after three reports")
        threading.Event().wait()  # rank 0 never ends on its own

    rec = Recorder()
    with pytest.raises(ValueError, match="after three reports"):
        trainer_2.run(train_func, callbacks=[rec])
    assert [[r["i"] for r in results] for results in rec.rounds] == [[0, 0], [1, 1], [2, 2]]
    assert rec.events[-1] == ("finish", True)


def _checkpoint_and_rank():
    return sgd.load_checkpoint()["w"], sgd.world_rank()


def _holds_data(blob):
    def train():
        return len(blob), sgd.world_rank()

    return train


def test_a_large_start_request_is_put_once_and_a_small_one_travels_in_each_call(ray_cluster, monkeypatch):
    """A run's start request (its function, the backend's encoders, the checkpoint, the run's
    settings) is pickled once per run. Small, it travels in every start call; with a checkpoint,
    or larger than ``INLINE_CODE_BYTES`` (a function that holds data), it is put in the object
    store once and every call holds a reference. Every worker runs the run's own function with
    the run's own checkpoint either way."""
    import ray

    from sgd.group.starts import INLINE_CODE_BYTES

    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **kw: puts.append(type(value).__name__) or real_put(value, **kw))
    n = 4
    # A quarter of a CPU each: the module's shared trainer (base_trainer) may hold 2 of the
    # cluster's 4 CPUs while this test runs.
    trainer = sgd.Trainer(backend="base", num_workers=n, resources_per_worker={"CPU": 0.25})
    trainer.start()
    try:
        puts.clear()
        assert trainer.run(_checkpoint_and_rank, checkpoint={"w": 1}) == [(1, r) for r in range(n)]
        assert trainer.run(_checkpoint_and_rank, checkpoint={"w": 2}) == [(2, r) for r in range(n)]
        assert puts == ["StartRequest", "StartRequest"]  # once per run, not once per worker
        puts.clear()
        big = 2 * INLINE_CODE_BYTES
        assert trainer.run(_holds_data(b"x" * big)) == [(big, r) for r in range(n)]
        assert puts == ["bytes"]
        puts.clear()
        assert trainer.run(_holds_data(b"x" * 10)) == [(10, r) for r in range(n)]
        assert puts == []  # small: in each call
    finally:
        trainer.shutdown()
