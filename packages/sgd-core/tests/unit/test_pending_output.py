"""What a worker on another host keeps of its output for the driver's copy of its rank log."""

import time

from sgd._worker import rank_logs
from sgd._worker.rank_logs import FLUSH_BYTES, FLUSH_S, PendingOutput


def test_output_waits_at_most_the_flush_period_or_goes_at_once_when_large():
    out = PendingOutput()
    assert out.due_in(time.monotonic()) is None and out.take() is None
    assert out.add(b"a\n") is False
    now = time.monotonic()
    assert 0 < out.due_in(now) <= FLUSH_S and out.due_in(now + FLUSH_S) <= 0
    assert out.add(b"x" * FLUSH_BYTES) is True and out.due_in(now) == 0.0
    assert out.take() == b"a\n" + b"x" * FLUSH_BYTES and out.take() is None


def test_beyond_the_cap_the_oldest_output_is_dropped_and_the_log_says_how_much(monkeypatch):
    monkeypatch.setattr(rank_logs, "MAX_LOG_BYTES", 10)
    out = PendingOutput()
    for chunk in (b"1234", b"5678", b"abcd"):
        out.add(chunk)
    assert out.take() == b"[sgd: 4 bytes of output dropped: the driver did not take them in time]\n5678abcd"
    out.add(b"z")
    assert out.take() == b"z"  # the count starts again
