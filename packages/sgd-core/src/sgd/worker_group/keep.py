"""Idle worker processes kept by this driver for its next worker group of the same kind.

Starting a worker costs a Ray worker process (about 0.7 CPU-seconds here) and its framework's
import (torch: about 1.5 more); a notebook or a test suite that starts many small trainers one
after the other pays it every time. With :func:`keep_workers` on, a trainer's clean shutdown
parks its workers' processes here instead of killing them, and the next trainer of the same
backend on the same nodes takes them: its start is a few Ray calls.

What makes that safe:

- Only groups whose owner gives a *tag* are kept (a :class:`sgd.Trainer`'s group, when its
  backend says :meth:`sgd.Backend.reuses_processes`), and only a group with the same tag takes
  them. A bare :class:`sgd.WorkerGroup` is never kept, nor a group with GPUs, custom resources,
  more than 1 CPU per worker, an ``actor_cls`` or a placement group that is not its own.
- A kept group's actors reserve no resources of their own (``num_cpus=0``, pinned to the node
  of their bundle): the group's placement group does, as always, and is removed at shutdown.
  Parked processes therefore hold nothing another job could want, only memory.
- A worker is parked only after the backend's ``on_shutdown`` ran, after its last training
  function ended, and after it forgot its run (context, session, the hooks its backend set:
  :func:`sgd._common.run_hooks.clear`). A group whose last run failed, or was stopped mid-run,
  is killed. One that replaced or added workers (after a death, an elastic re-form) takes kept
  processes for them and is kept like any other: each of its processes forgot its run.
- A process that died while parked is noticed when a group takes it and replaced by a new one.
- Parked processes belong to one Ray session: a ``ray.shutdown()`` ends them with the driver's
  connection, and a later cluster never sees them.

State a training function leaves in its process (module globals, environment variables it set)
stays there: that is the price, and why this is opt-in.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sgd._common.waits import wait

logger = logging.getLogger("sgd")

#: ``SGD_KEEP_WORKERS``: how many idle worker processes a driver keeps at most (0: none, the default).
ENV = "SGD_KEEP_WORKERS"


def _limit_from_env() -> int:
    raw = os.environ.get(ENV, "0").strip() or "0"
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: expected a whole number of idle workers to keep (0: none)") from None
    if value < 0:
        raise ValueError(f"{ENV}={raw!r}: expected 0 or more idle workers to keep")
    return value


class Parked(NamedTuple):
    """A parked process: its actor, the node it runs on, and the pid and host name it reported
    when parked (what :func:`end_kept_workers` waits on; ``None`` where unknown)."""

    actor: Any
    node: str
    pid: Optional[int] = None
    host: Optional[str] = None


class _Kept:
    """The parked processes: by (Ray session, tag), oldest first."""

    def __init__(self) -> None:
        self.limit: Optional[int] = None  # None: read ENV on first use
        self._lock = threading.Lock()
        self._parked: OrderedDict[Tuple[str, str], List[Parked]] = OrderedDict()

    def max_idle(self) -> int:
        if self.limit is None:
            self.limit = _limit_from_env()
        return self.limit

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._parked.values())

    def take(self, tag: str, node_id: str) -> Optional[Any]:
        """A parked process with ``tag`` on ``node_id`` (removed from the pool), or ``None``."""
        session = _ray_session()
        with self._lock:
            self._forget_other_sessions(session)
            parked = self._parked.get((session, tag), [])
            for i, entry in enumerate(parked):
                if entry.node == node_id:
                    del parked[i]
                    return entry.actor
        return None

    def park(self, tag: str, entries: List[Parked]) -> List[Parked]:
        """Keep ``entries`` under ``tag``; returns those over the limit, to kill (the oldest parked
        go first)."""
        session = _ray_session()
        with self._lock:
            self._forget_other_sessions(session)
            self._parked.setdefault((session, tag), []).extend(entries)
            self._parked.move_to_end((session, tag))
        return self.trim()

    def trim(self) -> List[Parked]:
        """The oldest parked processes over the limit, removed from the pool (to kill)."""
        with self._lock:
            over = sum(len(v) for v in self._parked.values()) - self.max_idle()
            evicted: List[Parked] = []
            for parked in self._parked.values():
                while over > 0 and parked:
                    evicted.append(parked.pop(0))
                    over -= 1
            return evicted

    def drain(self) -> List[Parked]:
        """Every parked process of this Ray session, removed from the pool (to kill)."""
        with self._lock:
            session = _ray_session() if ray.is_initialized() else None
            entries = [e for (s, _), parked in self._parked.items() if s == session for e in parked]
            self._parked.clear()
            return entries

    def _forget_other_sessions(self, session: str) -> None:
        # Their processes ended with the driver's connection to that cluster.
        for key in [k for k in self._parked if k[0] != session]:
            del self._parked[key]


KEPT = _Kept()


def _ray_session() -> str:
    """This driver's Ray connection: a cluster's session and the job, both new after a re-init."""
    # Ray's private name for the session, else the control store's address: the job id alone
    # repeats in a new cluster.
    driver: Any = getattr(getattr(getattr(ray, "_private", None), "worker", None), "global_worker", None)
    session = getattr(getattr(driver, "node", None), "session_name", None) or ray.get_runtime_context().gcs_address
    return f"{session}/{ray.get_runtime_context().get_job_id()}"


def keep_workers(count: int) -> None:
    """Keep up to ``count`` idle worker processes in this driver for the next trainers.

    A trainer's clean shutdown then parks its workers instead of ending them, and the next
    trainer of the same backend takes them, so it starts without new processes or framework
    imports (a 2-worker torch trainer: about 2.7 s to start and stop, 5 CPU-seconds, without;
    a fraction with). Only groups of CPU workers (at most 1 CPU each) whose backend says its
    processes can be reused are kept (:meth:`sgd.Backend.reuses_processes`: sgd-core's no-op
    backend, sgd-torch, sgd-horovod, sgd-xgboost's XGBoost and LightGBM), and never one that failed.
    ``0`` (the default, or the ``SGD_KEEP_WORKERS`` environment variable) keeps none and ends the
    processes kept so far, waiting up to 5 s until they exited (their ``atexit`` handlers ran):
    call it before a ``ray.shutdown()`` of your own, which would kill them.

    :raises ValueError: ``count`` is negative or not a whole number.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"keep_workers(count): expected a whole number >= 0 of idle workers, got {count!r}")
    KEPT.limit = count
    if count == 0:
        end_kept_workers()
    else:
        for entry in KEPT.trim():  # over the new limit
            end_kept(entry.actor)


def kept_workers() -> int:
    """How many idle worker processes this driver keeps now."""
    return KEPT.count()


def end_kept_workers(patience_s: float = 5.0) -> None:
    """End every idle worker process this driver keeps (the limit stays as it is), and wait up to
    ``patience_s`` seconds for them to exit: before a ``ray.shutdown()``, which would kill them.

    Ray answers the exit call before the process has run its ``atexit`` handlers (a coverage
    measurement is written there), so the processes on this machine are waited for by pid until
    they are gone; those on other machines until Ray answers."""
    deadline = time.monotonic() + patience_s
    entries = KEPT.drain()
    here = socket.gethostname()
    pids = [e.pid for e in entries if e.pid is not None and e.host == here]
    refs = [ref for ref in (end_kept(e.actor) for e in entries) if ref is not None]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=patience_s)
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if _alive(pid)]
        if pids:
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process reuses the pid: ours is gone
        return False
    return True


def end_kept(actor: Any) -> Any:
    """Ask a parked process to exit, as a finished actor does (its ``atexit`` handlers run: a
    coverage measurement is saved); it is idle, so it does at once. Its exit's reference."""
    try:
        return actor.__ray_terminate__.remote()
    except Exception:  # already gone with its cluster
        logger.debug("could not end a kept worker", exc_info=True)
        return None


def new_kept_actor(remote_cls: Any, node_id: str) -> Any:
    """A worker actor of a kept group on ``node_id``: no resources of its own (the group's
    placement group holds them while it runs), so a parked process holds nothing."""
    return remote_cls.options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote()


def park(tag: str, workers: List[Any], node_ids: List[str], patience_s: float) -> None:
    """Keep the ``workers`` (their backend already shut down) that forget their run within
    ``patience_s`` (at least 1 s) under ``tag``; kill the others (still busy, or gone)."""
    refs = [w._sgd_park.remote() for w in workers]
    ready, _ = wait(refs, timeout=max(patience_s, 1.0))
    parked: List[Parked] = []
    for w, node, ref in zip(workers, node_ids, refs):
        where = None
        if ref in ready:
            try:
                where = ray.get(ref)
            except Exception:
                logger.debug("a worker could not be parked", exc_info=True)
        if where:
            pid, host = where
            parked.append(Parked(w, node, pid, host))
        else:
            ray.kill(w, no_restart=True)
    for entry in KEPT.park(tag, parked):  # over the limit: idle, they exit at once
        end_kept(entry.actor)


def tag_for(bundle: Dict[str, float], backend_tag: Optional[str]) -> Optional[str]:
    """The tag a group with ``bundle`` per worker parks its workers under, or ``None`` when it is
    not kept: off, no owner's tag, a bundle with more than CPUs (GPUs come with devices, and
    custom resources with whatever the worker was meant to find), or more than 1 CPU per worker
    (Ray sizes a process's thread pools, ``OMP_NUM_THREADS``, from its CPUs when it starts; a
    kept process reserves none itself, so it gets 1, as a 1-CPU worker does)."""
    if backend_tag is None or KEPT.max_idle() == 0:
        return None
    if set(bundle) - {"CPU"} or bundle.get("CPU", 0) > 1:
        return None
    return backend_tag
