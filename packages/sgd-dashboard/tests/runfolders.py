"""Run folders for the dashboard's tests, written without Ray: the files sgd's driver writes
(``trainer.json``, ``status.json``, ``results.jsonl``, ``events.jsonl``, ``logs/rank_N.log``,
``checkpoints/checkpoint_NNNNNN/``), in the same shapes, so the server reads them as it reads a
real run's (one test in test_api_real_run.py checks that against a real run).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

T0 = 1_790_000_000.0
HOST = socket.gethostname()


def result(iteration: int, rank: int, t: float, dt: float = 0.5, pid: Optional[int] = None,
           **metrics: Any) -> Dict[str, Any]:
    """One rank's dict of a report round, with sgd's own fields."""
    return {**metrics, "_timestamp": int(t), "_time_this_iter_s": dt, "_training_iteration": iteration,
            "_date": "2026-11-29_00-00-00", "_time_total_s": dt * iteration, "_pid": pid or 1000 + rank,
            "_hostname": HOST, "_node_ip": "192.0.2.2"}


def default_metrics(iteration: int, rank: int) -> Dict[str, Any]:
    return {"loss": 1.0 / iteration + rank, "acc": min(1.0, 0.01 * iteration)}


def round_line(iteration: int, ranks: int = 2, t: Optional[float] = None,
               metrics: Callable[[int, int], Dict[str, Any]] = default_metrics,
               dt: Callable[[int, int], float] = lambda i, r: 0.5) -> str:
    """One line of ``results.jsonl`` (with its newline)."""
    t = T0 + iteration if t is None else t
    return json.dumps([result(iteration, r, t, dt(iteration, r), **metrics(iteration, r)) for r in range(ranks)]) + "\n"


def append(path: Path, text: str) -> None:
    """Append ``text`` to a file and flush it (as the driver does)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()


def event(kind: str, time: float, **fields: Any) -> str:
    """One line of ``events.jsonl``."""
    return json.dumps({"v": 1, "time": time, "event": kind, **fields}) + "\n"


def make_run(parent: Path, name: str = "run_001", *, rounds: int = 10, ranks: int = 2, status: str = "FINISHED",
             metrics: Callable[[int, int], Dict[str, Any]] = default_metrics,
             dt: Callable[[int, int], float] = lambda i, r: 0.5, events: Optional[Sequence[str]] = None,
             logs: bool = True, checkpoints: Iterable[int] = (), settings: Optional[Dict[str, Any]] = None,
             pid: Optional[int] = None, mtime: Optional[float] = None) -> Path:
    """A run folder ``parent/name`` of ``rounds`` report rounds of ``ranks`` ranks.

    :param events: the lines of ``events.jsonl``; ``None``: a run's usual ones; ``[]``: no file
        (an older sgd).
    :param checkpoints: the iterations to write a checkpoint at.
    :param pid: the driver's pid in ``status.json`` (a live run's: this process's).
    :param mtime: the time the run's files say it started.
    """
    run = Path(parent) / name
    run.mkdir(parents=True, exist_ok=True)
    trainer = {"backend": "torch", "num_workers": ranks, "use_gpu": False, "max_retries": 3,
               "run_config": {"lr": 0.1, "wandb_api_key": "REDACTED"}, "trial_id": None, "format_version": 1,
               "sgd_version": "0.1.0", **(settings or {})}
    (run / "trainer.json").write_text(json.dumps(trainer))
    (run / "status.json").write_text(json.dumps({"status": status, "time": T0 + rounds + 1,
                                                 "pid": pid or 999_999_999, "host": HOST, "attempt": 1}))
    with open(run / "results.jsonl", "w", encoding="utf-8") as f:
        for i in range(1, rounds + 1):
            f.write(round_line(i, ranks, metrics=metrics, dt=dt))
    if events is None:
        workers = [{"rank": r, "pid": 1000 + r, "host": HOST, "node_ip": "192.0.2.2", "node_id": "n1"}
                   for r in range(ranks)]
        events = [event("run_started", T0, driver_attempt=1, pid=4242, host=HOST, num_workers=ranks,
                        resumed_iteration=0, sgd_version="0.1.0"),
                  event("attempt_started", T0 + 0.5, attempt=1, num_workers=ranks, iteration=0, checkpoint=None,
                        workers=workers)]
        if status == "FINISHED":
            events.append(event("run_finished", T0 + rounds + 1))
    if events:
        (run / "events.jsonl").write_text("".join(events))
    if logs:
        (run / "logs").mkdir(exist_ok=True)
        for r in range(ranks):
            (run / "logs" / f"rank_{r}.log").write_text(
                f"=== rank {r}: pid {1000 + r} on {HOST}, 2026-11-29 00:00:00 ===\n"
                + "".join(f"rank {r} step {i}\n" for i in range(1, rounds + 1)))
    for iteration in checkpoints:
        write_checkpoint(run, iteration, score=float(iteration))
    if mtime is not None:
        for fname in ("trainer.json", "status.json"):
            os.utime(run / fname, (mtime, mtime))
    return run


def write_checkpoint(run: Path, iteration: int, score: Any = None, data: bytes = b"weights",
                     number: Optional[int] = None, metrics: Optional[Dict[str, Any]] = None) -> Path:
    """``checkpoints/checkpoint_NNNNNN`` with one file and the metadata sgd writes (sha256 and size)."""
    number = iteration if number is None else number
    folder = run / "checkpoints" / f"checkpoint_{number:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.bin").write_bytes(data)
    meta = {"format": "directory", "files": {"model.bin": {"sha256": hashlib.sha256(data).hexdigest(),
                                                           "size": len(data)}},
            "id": number, "score": score, "iteration": iteration, "timestamp": T0 + iteration,
            "metrics": metrics or {"loss": 1.0 / iteration, "_training_iteration": iteration}}
    (folder / ".sgd_checkpoint.json").write_text(json.dumps(meta))
    return folder


def many_runs(parent: Path, count: int, rounds: int = 50) -> List[Path]:
    """``count`` finished runs, ``exp_NNN/run_001``, each with ``rounds`` rounds."""
    line_cache = "".join(round_line(i) for i in range(1, rounds + 1))
    out = []
    for n in range(count):
        run = Path(parent) / f"exp_{n:04d}" / "run_001"
        run.mkdir(parents=True)
        (run / "trainer.json").write_text(json.dumps({"backend": "torch", "num_workers": 2, "trial_id": None}))
        (run / "status.json").write_text(json.dumps({"status": "FINISHED", "time": T0 + n + rounds, "pid": 1,
                                                     "host": HOST, "attempt": 1}))
        (run / "results.jsonl").write_text(line_cache)
        out.append(run)
    return out
