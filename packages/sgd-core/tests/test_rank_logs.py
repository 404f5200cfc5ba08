"""Every worker's stdout and stderr also go to ``run_dir/logs/rank_N.log`` (sgd._worker.rank_logs)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

import sgd


def _talks(config):
    rank = sgd.world_rank()
    print(f"print from rank {rank}")
    logging.getLogger("user.code").warning("logging from rank %d", rank)
    os.write(2, f"descriptor 2 from rank {rank}\n".encode())  # as C code writes
    subprocess.run([sys.executable, "-c", f"print('subprocess of rank {rank}')"], check=True)
    sys.stderr.write(f"no newline at the end from rank {rank}")
    sgd.report(x=1)
    if config.get("fail") and rank == 1:
        raise ValueError("boom on rank 1")


def test_each_rank_has_its_own_log_of_everything_it_printed(base_trainer):
    base_trainer.run(_talks, config={})
    logs = base_trainer.latest_run_dir / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["rank_0.log", "rank_1.log"]
    for rank in (0, 1):
        text = (logs / f"rank_{rank}.log").read_text()
        assert text.startswith(f"=== rank {rank}: pid ")
        for line in (f"print from rank {rank}", f"logging from rank {rank}", f"descriptor 2 from rank {rank}",
                     f"subprocess of rank {rank}", f"no newline at the end from rank {rank}"):
            assert line in text, (line, text)
        assert f"from rank {1 - rank}" not in text


def test_a_failed_rank_has_its_traceback_in_its_log(base_trainer):
    with pytest.raises(ValueError, match="boom on rank 1"):
        base_trainer.run(_talks, config={"fail": True})
    text = (base_trainer.latest_run_dir / "logs" / "rank_1.log").read_text()
    assert "ValueError: boom on rank 1" in text and "in _talks" in text
    assert "boom" not in (base_trainer.latest_run_dir / "logs" / "rank_0.log").read_text()


def test_a_log_on_a_full_disk_never_blocks_the_worker(capfd):
    """Writing the log fails with ENOSPC (``/dev/full``): the worker's output keeps flowing to
    the console; before, the reader thread died and the worker blocked once the pipe was full."""
    import threading

    from sgd._worker.rank_logs import RankLog

    log = RankLog(3, "/dev/full")
    line = b"x" * 1023 + b"\n"
    done = threading.Event()

    def talk() -> None:
        for _ in range(1024):  # 1 MiB, 16 times what a pipe holds
            os.write(1, line)
        done.set()

    threading.Thread(target=talk, daemon=True).start()
    finished = done.wait(timeout=30)
    log.close()
    assert finished, "the worker blocked writing to its stdout"
    out, _ = capfd.readouterr()
    assert "[rank 3] sgd: cannot write /dev/full any more" in out and "No space left on device" in out
    assert out.count("[rank 3] " + "x" * 1023) == 1024


def _silent():
    import threading

    sgd.report(x=1)
    return [t.name for t in threading.enumerate()].count("sgd-rank-log")


def test_a_run_that_prints_nothing_leaves_no_log_and_the_tee_is_made_once_per_process(base_trainer):
    readers = [base_trainer.run(_silent) for _ in range(3)]
    assert readers == [[1, 1]] * 3  # one reader thread per worker process, kept across runs
    assert not (base_trainer.latest_run_dir / "logs").exists()
    base_trainer.run(_talks, config={})  # the next run that prints has its own log, header first
    text = (base_trainer.latest_run_dir / "logs" / "rank_0.log").read_text()
    assert text.startswith("=== rank 0: pid ") and text.count("=== rank 0") == 1


def test_runs_in_one_process_each_get_their_own_output_up_to_the_last_byte(tmp_path, capfd):
    """In this process, without Ray: a run's last bytes (no newline, written at the level of
    descriptors just before it ends, more than a pipe holds) are in its log when ``close``
    returns, and the next run's log has none of them."""
    from sgd._worker.rank_logs import RankLog

    first = RankLog(0, str(tmp_path / "a" / "rank_0.log"))
    big = b"y" * (200 * 1024)
    os.write(1, b"one\n" + big)
    first.close()
    second = RankLog(0, str(tmp_path / "b" / "rank_0.log"))
    os.write(2, b"two\n")
    second.close()
    os.write(1, b"between runs\n")  # to the console only
    silent = RankLog(0, str(tmp_path / "c" / "rank_0.log"))
    silent.close()
    a = (tmp_path / "a" / "rank_0.log").read_bytes()
    b = (tmp_path / "b" / "rank_0.log").read_bytes()
    assert a.startswith(b"=== rank 0: pid ") and a.endswith(b"one\n" + big + b"\n") and b"two" not in a
    assert b.startswith(b"=== rank 0: pid ") and b.endswith(b"two\n") and b"one" not in b
    assert not (tmp_path / "c").exists()
    out, _ = capfd.readouterr()
    assert "[rank 0] one\n" in out and "[rank 0] two\n" in out and "between runs\n" in out
    assert "[rank 0] between runs" not in out
