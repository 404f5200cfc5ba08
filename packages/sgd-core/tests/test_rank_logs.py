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
