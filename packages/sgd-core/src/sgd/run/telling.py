"""What the run controller tells the run's event log (``events.jsonl``,
:mod:`sgd.storage.events`) where it decides: each method writes one kind of event, with the
workers' ranks, hosts and pids as the group last knew them. Nothing here runs per report round:
only when something happens to the run (a start, a failure, a restart, a resize, the end).
"""

from __future__ import annotations

import os
import socket
from typing import Any, Dict, List, Optional

from sgd.errors import TrainingHangError, WorkerDiedError
from sgd.group.status import Barrier
from sgd.run.states import RunState
from sgd.storage.events import EventLog, error_fields
from sgd.storage.reading import sgd_version

#: The event written when a run ends, by how it ended.
_END_EVENTS = {RunState.FINISHED: "run_finished", RunState.ERRORED: "run_failed", RunState.STOPPED: "run_stopped"}


class RunEvents:
    """One run's writer of events, over its :class:`~sgd.storage.events.EventLog`.

    :param log: the run folder's event log.
    :param group: the run's worker group (read for its workers' ranks, hosts and pids).
    """

    def __init__(self, log: EventLog, group: Any):
        self.log = log
        self._group = group
        self._starts = 0

    # --- where the workers are -----------------------------------------------------------------

    def workers(self) -> List[Dict[str, Any]]:
        """Each worker's rank, pid, host, node IP and node id, as the group last knew them (an
        empty list for a group that keeps no such record)."""
        metadata = getattr(getattr(self._group, "worker_group", None), "metadata", None) or []
        out = []
        for rank, m in enumerate(metadata):
            out.append({"rank": rank, "pid": getattr(m, "pid", None), "host": getattr(m, "hostname", None),
                        "node_ip": getattr(m, "node_ip", None), "node_id": getattr(m, "node_id", None)})
        return out

    def _where(self, rank: Optional[int]) -> Dict[str, Any]:
        if rank is None or rank < 0:
            return {"rank": rank, "host": None, "pid": None}
        known = self.workers()
        worker = known[rank] if rank < len(known) else {}
        return {"rank": rank, "host": worker.get("host"), "pid": worker.get("pid"), "node_ip": worker.get("node_ip")}

    # --- the run -------------------------------------------------------------------------------

    def run_started(self, driver_attempt: int, num_workers: int, resumed_iteration: int,
                    previous: Optional[Dict[str, Any]]) -> None:
        """A driver took the run. ``previous``: the status the last driver left (a resumed run):
        when it never closed the run, a ``driver_died`` event for it comes first."""
        if previous and previous.get("status") in ("RUNNING", "DRIVER_DIED"):
            self.log.write("driver_died", pid=previous.get("pid"), host=previous.get("host"),
                           driver_attempt=previous.get("attempt"), since=previous.get("time"))
        self.log.write("run_started", driver_attempt=driver_attempt, pid=os.getpid(), host=socket.gethostname(),
                       num_workers=num_workers, resumed_iteration=resumed_iteration, sgd_version=sgd_version())

    def attempt_started(self, iteration: int, checkpoint: Optional[str]) -> None:
        """The training functions started (again): on which workers, from which report and checkpoint."""
        workers = self.workers()
        self.log.write("attempt_started", attempt=self._starts, num_workers=len(workers) or self._num_workers(),
                       iteration=iteration, checkpoint=checkpoint, workers=workers)
        self._starts += 1

    def ended(self, kind: RunState, error: Optional[BaseException], interrupted: bool) -> None:
        if interrupted:
            self.log.write("run_interrupted", **(error_fields(error) if error is not None else {}))
        elif kind is RunState.ERRORED and error is not None:
            self.log.write("run_failed", **error_fields(error))
        else:
            self.log.write(_END_EVENTS.get(kind, "run_finished"))

    # --- failures and recoveries ------------------------------------------------------------------

    def worker_failed(self, error: BaseException, phase: str) -> None:
        """A worker's failure (its death or its exception), before the policy decides."""
        self.log.write("worker_failed", **self._where(_rank_of(error)), phase=phase,
                       died=isinstance(error, WorkerDiedError), **error_fields(error))

    def hang(self, error: TrainingHangError, timeout_s: float) -> None:
        """The hang watchdog fired: no worker sent anything for ``timeout_s``."""
        self.log.write("hang", timeout_s=timeout_s, stragglers=list(error.stragglers))

    def barrier_failures(self, barrier: Barrier) -> None:
        """The workers out of the group at an in-place reset (sgd.elastic)."""
        for index, error in sorted(barrier.gone.items()):
            fields = dict(self._where(index), phase="training", died=isinstance(error, WorkerDiedError))
            self.log.write("worker_failed", **fields, **error_fields(error))

    def host_lost(self, error: BaseException) -> None:
        """Ray declared a worker's host dead."""
        where = self._where(_rank_of(error))
        self.log.write("host_lost", node_ip=where.get("node_ip"), host=where.get("host"), ranks=[where["rank"]],
                       message=str(error).splitlines()[0] if str(error) else "")

    def hosts_lost(self, lost: Dict[str, Any], ranks: List[int]) -> None:
        """A restart found hosts gone (their raylets do not answer) and places the group without them."""
        for node_id, node in lost.items():
            self.log.write("host_lost", node_id=node_id, node_ip=getattr(node, "ip", None), ranks=ranks)

    def drain_notice(self, draining: Dict[str, Any]) -> None:
        self.log.write("drain_notice", hosts=[{"node_id": node_id, "node_ip": getattr(n, "ip", None),
                                                "deadline": _finite(getattr(n, "drain_deadline", None))}
                                               for node_id, n in draining.items()])

    def resize(self, to: int, reason: str) -> None:
        self.log.write("resize", **{"from": self._num_workers(), "to": to, "reason": reason})

    def restart(self, attempt: Optional[int], max_failures: int, checkpoint: Optional[str], iteration: int,
                num_workers: int) -> None:
        self.log.write("restart", attempt=attempt, max_failures=max_failures, checkpoint=checkpoint,
                       iteration=iteration, num_workers=num_workers)

    def reformed(self, before: List[Dict[str, Any]], attempt: int) -> None:
        """The group re-formed in place: who is in it now (survivors keep their pids), and who was before."""
        after = self.workers()
        before_pids = {w.get("pid") for w in before}
        self.log.write("reformed", **{"from": len(before) or None, "to": len(after) or self._num_workers()},
                       attempt=attempt,
                       survivors=[{"rank": w["rank"], "pid": w["pid"]} for w in after if w.get("pid") in before_pids],
                       joined=[{"rank": w["rank"], "pid": w["pid"], "host": w["host"]}
                               for w in after if w.get("pid") not in before_pids])

    def _num_workers(self) -> int:
        return int(getattr(self._group, "num_workers", 0) or 0)


def _rank_of(error: BaseException) -> Optional[int]:
    for candidate in (error, error.__cause__):
        for name in ("world_rank", "sgd_world_rank"):
            rank = getattr(candidate, name, None)
            if isinstance(rank, int):
                return rank
    return None


def _finite(value: Optional[float]) -> Optional[float]:
    return value if isinstance(value, (int, float)) and value not in (float("inf"), float("-inf")) else None


__all__ = ["RunEvents"]
