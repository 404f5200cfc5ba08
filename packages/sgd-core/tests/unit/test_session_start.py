"""A worker's session as the driver's control calls see it while the start call is still making
it: the actor's start call assigns the session before its training thread starts, and the driver's
watch (on another of the actor's threads) can join it in between. That happened when one rank
failed at once and the driver asked the others, still starting, whether their runs ended: the
join raised ("cannot join thread before it is started"), the worker counted as dead, and every
process was killed. The race is forced here: the join comes first."""

import threading

from sgd._worker.session import Session, WorkerContext


def _session():
    return Session(lambda: 7, WorkerContext(world_size=2), lambda d: d)


def test_a_join_before_the_thread_starts_waits_for_the_run_to_start_and_end():
    session = _session()
    outcome = []

    def watch():
        try:
            session.join()
            outcome.append("ended")
        except Exception as exc:  # what Thread.join raises on a thread not yet started
            outcome.append(repr(exc))

    watcher = threading.Thread(target=watch)
    watcher.start()
    watcher.join(timeout=0.2)  # the watch is waiting, not failing, while the start call goes on
    assert outcome == [] and watcher.is_alive()
    session.start()
    watcher.join(timeout=30)
    assert outcome == ["ended"] and session.finished


def test_join_for_counts_the_wait_for_the_start_too():
    session = _session()
    assert session.join_for(0.05) is False  # not started: its run has not ended
    session.start()
    assert session.join_for(30) is True


def test_the_start_calls_linger_for_the_end_stops_at_an_item_the_driver_must_see_now():
    """The start call answers with the run's first items and waits up to ``linger_s`` more for
    its end. An item the driver must see at once ends that wait: a reset-barrier item (the driver
    must know the run recovers in place before it sees a worker die) or a checkpoint the worker
    waits on. A report does not."""
    import time

    from sgd._common.protocol import ELASTIC
    from sgd._worker.session import STATE, _Item

    held = threading.Event()

    def train():
        import sgd

        sgd.report(step=1)
        STATE.session._put(_Item(ELASTIC, "enter"))  # what sgd.elastic.run announces
        held.wait(60)

    session = Session(train, WorkerContext(world_size=2), lambda d: d)
    STATE.session = session
    try:
        session.start()
        t = time.monotonic()
        batch, finished, _, _ = session.poll(10, timeout_s=30, linger_s=30)
        assert time.monotonic() - t < 15 and not finished
        assert [item[0] for item in batch] == ["report", ELASTIC]
    finally:
        held.set()
        session.join()
        STATE.session = None


def test_a_lingering_start_call_is_not_woken_by_each_report():
    """Each report after the first gives the lingering poll the chance to wake (the training
    thread waits for one more wait of the poll, 0.5 s at most): it must not take it."""
    from sgd._worker.session import STATE

    waits = []
    waited = threading.Condition()

    def train():
        import sgd

        sgd.report(step=1)
        for step in range(2, 5):
            with waited:
                seen = len(waits)
                waited.wait_for(lambda seen=seen: len(waits) > seen, timeout=0.5)
            sgd.report(step=step)

    session = Session(train, WorkerContext(world_size=2), lambda d: d)
    real_wait = session._cv.wait

    def counting_wait(timeout=None):
        with waited:
            waits.append(timeout)
            waited.notify_all()
        return real_wait(timeout)

    session._cv.wait = counting_wait
    STATE.session = session
    try:
        session.start()
        batch, finished, _, _ = session.poll(10, timeout_s=30, linger_s=30)
        assert finished and [item[1]["step"] for item in batch] == [1, 2, 3, 4]
        assert len(waits) <= 2  # the first item, then the linger until the end: no wake per report
    finally:
        session.join()
        STATE.session = None
