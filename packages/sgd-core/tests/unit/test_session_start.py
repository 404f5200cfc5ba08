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
