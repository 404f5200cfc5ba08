"""A worker group without Ray, scripted by a test: step sgd's run controller through reports,
checkpoints, deaths, drains and hangs in milliseconds.

:class:`FakeGroup` implements the worker-group protocol (:class:`sgd.group.protocol.RunGroup`)
the run controller drives. A test queues what the workers "do" (:meth:`FakeGroup.report`,
:meth:`FakeGroup.die`, ...) and what each step of the group's lifecycle returns, runs the
controller (:func:`fake_trainer_run`, or :class:`sgd.run.controller.RunController` itself), and
asserts on the results, the states the run went through, and :attr:`FakeGroup.calls`::

    from sgd_testing import FakeGroup, fake_trainer_run

    group = FakeGroup(num_workers=2)
    group.report({"loss": 1.0}).die(rank=1).report({"loss": 0.5}).finish()
    run = fake_trainer_run(group, tmp_path, max_retries=1)
    assert [r[0]["loss"] for r in run] == [1.0, 0.5]
    assert group.restarts == 1
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from sgd.checkpoint.encoded import decoded
from sgd.errors import WorkerDiedError, WorkerError
from sgd.group.protocol import RunRequest
from sgd.group.status import HEALTHY, Arrival, Barrier, Health, NodeInfo, Poll, checkpoint_round, report_round
from sgd.storage.staging import stage_state


@dataclass
class _Idle:
    """Poll idle this many times, with no progress since ``since_s`` seconds before now."""

    times: int
    since_s: float


class FakeGroup:
    """A scripted worker group (see the module docstring).

    :param num_workers: the group's size now; ``min_workers`` / ``max_workers`` (both default
        to it) make it elastic.
    :param hook: the plugin hooks (``sgd_handle_result`` is called with each round); by
        default sgd's process-wide plugin manager's, which hands rounds to the callbacks.
    """

    def __init__(self, num_workers: int = 2, min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 hook: Any = None):
        if hook is None:
            from sgd.plugins import get_plugin_manager

            hook = get_plugin_manager().hook
        self.hook = hook
        self.num_workers = num_workers
        self.min_workers = num_workers if min_workers is None else min_workers
        self.max_workers = num_workers if max_workers is None else max_workers
        #: every call the controller made, in order: ``(method, details)``
        self.calls: List[Tuple[str, Dict[str, Any]]] = []
        #: what the workers do, per run attempt; consumed by :meth:`poll`
        self._events: Deque[Any] = deque()
        self._outcomes: Dict[str, Deque[Optional[BaseException]]] = {"start": deque(), "begin": deque(),
                                                                       "restart": deque(), "reform": deque(),
                                                                       "grow": deque()}
        self._iteration = 0
        self._progress = [0] * num_workers
        self._last_progress = time.monotonic()
        #: what :meth:`health` returns now (set it, or :meth:`drain`)
        self.health_now: Health = HEALTHY
        #: what :meth:`room` returns now
        self.room_now = num_workers
        self._dirty = False
        self.started = False
        #: the requests the run's starts got (the checkpoint and iteration each began from)
        self.requests: List[RunRequest] = []
        #: what :attr:`recovers_in_place` says (the run is in ``sgd.elastic.run``)
        self.in_place = False
        #: each worker's process id, by rank: new ones after a restart, the survivors' kept by a re-form
        self.pids: List[int] = []
        self._next_pid = 1000
        self._new_pids()

    # --- scripting -------------------------------------------------------------------------

    def report(self, *metrics: Dict[str, Any], checkpoint: Optional[Dict[str, Any]] = None) -> FakeGroup:
        """Every worker reports; ``metrics`` per rank (one dict: the same for all ranks).
        ``checkpoint``: rank 0 passes it with its report (``sgd.report(m, checkpoint=...)``)."""
        per_rank = list(metrics) if len(metrics) > 1 else [metrics[0] if metrics else {}] * self.num_workers
        self._events.append(("report", per_rank, checkpoint))
        return self

    def save(self, state: Dict[str, Any]) -> FakeGroup:
        """Every worker calls ``sgd.save_checkpoint``; rank 0's ``state`` is kept."""
        self._events.append(("save", state))
        return self

    def die(self, rank: int = 0, message: str = "SIGKILL") -> FakeGroup:
        """Worker ``rank``'s process dies (a :class:`~sgd.errors.WorkerDiedError`)."""
        self._events.append(("fail", WorkerDiedError(f"worker rank {rank} died: {message}", rank)))
        return self

    def raise_(self, error: BaseException, rank: Optional[int] = 0) -> FakeGroup:
        """Worker ``rank``'s training function raises ``error``: it arrives as the real group
        hands it over, its ``__cause__`` a :class:`~sgd.errors.WorkerError` naming the rank
        (retried only by a run with ``retry_worker_errors``). ``rank=None``: an error of the
        driver's own (never retried), ``error`` as it is."""
        if rank is not None and error.__cause__ is None:
            error.__cause__ = WorkerError(f"worker rank {rank} (pid 0 on fake) raised {type(error).__name__}: "
                                          f"{error}\n\nRemote traceback:\n(fake)", rank, "(fake)")
        self._events.append(("fail", error))
        return self

    def lose_in_place(self, rank: int = 1, commits: int = 0, message: str = "SIGKILL") -> FakeGroup:
        """Worker ``rank`` dies in a run in ``sgd.elastic.run``: the others wait at the reset
        barrier (after ``commits`` commits), and the group polls ``RESET`` (the controller
        re-forms it in place: :meth:`reform`)."""
        death = WorkerDiedError(f"worker rank {rank} died: {message}", rank)
        self._events.append(("reset", {rank: death}, commits, True))
        return self

    def sync(self, commits: int = 0) -> FakeGroup:
        """Every worker calls ``state.sync()`` (a reset barrier with nothing lost)."""
        self._events.append(("reset", {}, commits, False))
        return self

    def idle(self, times: int = 1, since_s: float = 0.0) -> FakeGroup:
        """Nothing arrives for ``times`` polls; the last progress was ``since_s`` seconds ago
        (a hang once it exceeds the controller's ``hang_timeout_s``)."""
        self._events.append(_Idle(times, since_s))
        return self

    def call(self, action: Callable[[FakeGroup], Any]) -> FakeGroup:
        """Run ``action(group)`` when the controller's polls get here (change the health, say)."""
        self._events.append(("call", action))
        return self

    def finish(self, returns: Optional[Sequence[Any]] = None) -> FakeGroup:
        """Every worker's function returns (``returns`` per rank, default ``None``)."""
        self._events.append(("finish", list(returns) if returns is not None else None))
        return self

    def outcome(self, step: str, *errors: Optional[BaseException]) -> FakeGroup:
        """What the next calls of ``step`` (``"start"``, ``"begin"``, ``"restart"``) return, in
        order: ``None`` for success, or the failure."""
        self._outcomes[step].extend(errors)
        return self

    def drain(self, node_id: str = "node-b", deadline_in_s: Optional[float] = None) -> None:
        """From now on, a host of the group is draining (a preemption notice)."""
        deadline = math.inf if deadline_in_s is None else time.time() + deadline_in_s
        info = NodeInfo(node_id=node_id, ip="127.0.0.2", alive=True, port=0, drain_deadline=deadline)
        self.health_now = Health(None, {node_id: info})

    def lose_host(self, rank: int = 1) -> None:
        """From now on, worker ``rank``'s host is declared dead."""
        self.health_now = Health(WorkerDiedError(f"worker rank {rank} is gone: its host was declared dead", rank))

    @property
    def restarts(self) -> int:
        return sum(1 for name, _ in self.calls if name == "restart")

    @property
    def reforms(self) -> int:
        return sum(1 for name, _ in self.calls if name == "reform")

    def _record(self, name: str, **details: Any) -> Optional[BaseException]:
        self.calls.append((name, details))
        queue = self._outcomes.get(name)
        return queue.popleft() if queue else None

    # --- the protocol -------------------------------------------------------------------------

    @property
    def worker_group(self) -> Any:
        return self if self.started else None

    @property
    def metadata(self) -> List[Any]:
        """Where each worker runs, by rank, as the real group's workers tell it (pid, host name,
        node IP and id): ranks alternate between two fake hosts, ``host-a`` and ``host-b``."""
        from types import SimpleNamespace

        return [SimpleNamespace(pid=pid, hostname=f"host-{'ab'[rank % 2]}", node_ip=f"10.0.0.{rank % 2 + 1}",
                                node_id=f"node-{'ab'[rank % 2]}") for rank, pid in enumerate(self.pids)]

    def _new_pids(self, keep: Sequence[int] = ()) -> None:
        self.pids = list(keep)
        while len(self.pids) < self.num_workers:
            self.pids.append(self._next_pid)
            self._next_pid += 1

    def start(self, initialization_hook: Optional[Callable[[], Any]] = None, actor_cls: Optional[type] = None,
              actor_cls_args: Optional[tuple] = None,
              actor_cls_kwargs: Optional[dict] = None) -> Optional[BaseException]:
        error = self._record("start")
        self.started = error is None
        return error

    def started_from(self, attempt: int = -1) -> Any:
        """The checkpoint state the workers of run attempt ``attempt`` (an index into
        :attr:`requests`) start from, as ``sgd.load_checkpoint()`` gives it to them: a
        restart's checkpoint travels encoded (the workers decode it) and is decoded here."""
        return decoded(self.requests[attempt].checkpoint)

    def begin(self, request: RunRequest) -> Optional[BaseException]:
        error = self._record("begin", checkpoint=request.checkpoint, start_iteration=request.start_iteration)
        self.requests.append(request)
        self._iteration = request.start_iteration
        self._progress = [0] * self.num_workers
        self._last_progress = time.monotonic()
        if error is None:
            self._dirty = True
        return error

    def poll(self, timeout_s: float) -> Poll:
        self.calls.append(("poll", {}))
        while self._events:
            event = self._events[0]
            if isinstance(event, _Idle):
                event.times -= 1
                if event.times <= 0:
                    self._events.popleft()
                return Poll.idle(self._progress, time.monotonic() - event.since_s)
            self._events.popleft()
            kind = event[0]
            if kind == "call":
                event[1](self)
                continue
            if kind == "fail":
                return Poll.failed(event[1])
            if kind == "reset":
                _, gone, commits, failed = event
                arrivals = {i: Arrival(commits, (commits, 1), "peer failed" if failed else "sync", failed)
                            for i in range(self.num_workers) if i not in gone}
                return Poll.reset(Barrier(arrivals, dict(gone)))
            if kind == "finish":
                return Poll.finished(event[1] if event[1] is not None else [None] * self.num_workers)
            self._progress = [p + 1 for p in self._progress]
            self._last_progress = time.monotonic()
            if kind == "save":
                return Poll.of_round(checkpoint_round(self._write(event[1]), self.num_workers))
            _, per_rank, checkpoint = event
            self._iteration += 1
            return Poll.of_round(report_round([dict(m, _training_iteration=self._iteration) for m in per_rank],
                                              None if checkpoint is None else self._write(checkpoint)))
        raise AssertionError("the fake group's script ran out: end it with .finish() (or a failure)")

    def _write(self, state: Dict[str, Any]) -> Any:
        """Rank 0 writes its checkpoint into the run's checkpoint folder, as a worker does: the
        round carries the folder's path."""
        target = self.requests[-1].checkpoint_target if self.requests else None
        if target is None:
            raise AssertionError("the fake group's run has no checkpoint folder (begin it with a RunRequest "
                                 "that has a checkpoint_target, as the run controller does)")
        return stage_state(target, dict(state), hook=self.hook)

    def health(self) -> Health:
        return self.health_now

    def announce_drain(self, draining: Dict[str, NodeInfo]) -> None:
        self.calls.append(("announce_drain", {"nodes": sorted(draining)}))

    def room(self) -> int:
        return self.room_now

    @property
    def needs_restart(self) -> bool:
        return self._dirty

    def restart(self, error: Optional[BaseException], size: Optional[int] = None,
                move: bool = False) -> Optional[BaseException]:
        failed = self._record("restart", error=error, size=size, move=move)
        if failed is None:
            self._dirty = False
            if size is not None:
                self.num_workers = size
            self._new_pids()
        return failed

    def reform(self, barrier: Barrier, iteration: int) -> Optional[BaseException]:
        failed = self._record("reform", gone=sorted(barrier.gone), iteration=iteration)
        if failed is None and self.min_workers != self.max_workers:
            self.num_workers = max(self.min_workers, len(barrier.arrivals))
        if failed is None:
            survivors = [pid for rank, pid in enumerate(self.pids) if rank not in barrier.gone]
            self._new_pids(survivors[:self.num_workers])
        return failed

    @property
    def recovers_in_place(self) -> bool:
        return self.in_place

    def grow(self, count: int) -> Optional[BaseException]:
        return self._record("grow", count=count)

    def stacks(self, timeout_s: float = 10.0, include_idle: bool = False) -> List[str]:
        return [f"rank {i}: (a fake worker)\n" for i in range(self.num_workers)]

    def end(self, ok: bool, error: Optional[BaseException] = None) -> None:
        self.calls.append(("end", {"ok": ok, "error": error}))
        self._dirty = not ok

    def stop(self, patience_s: float) -> bool:
        self.calls.append(("stop", {"patience_s": patience_s}))
        self._dirty = False
        return True

    def shutdown(self) -> None:
        self.calls.append(("shutdown", {}))
        self.started = False


def fake_trainer_run(group: FakeGroup, logdir: Path, max_retries: int = 0, hang_timeout_s: Optional[float] = None,
                     checkpoint: Optional[dict] = None, callbacks: Sequence[Any] = (),
                     num_to_keep: Optional[int] = None, controller: Any = None,
                     retry_worker_errors: bool = False) -> Any:
    """Start ``group`` under a run controller and begin one run writing to ``logdir``; return
    the run (:class:`sgd.run.controller.ActiveRun`): iterate ``run.next()`` until ``None``,
    read ``run.transitions`` / ``run.history``, ``run.returns``. ``retry_worker_errors``: the
    run retries a training function's exception too (what the AIR/v2 trainers' runs do)."""
    from sgd.checkpoint import CheckpointStrategy
    from sgd.run.controller import RunController, new_run_spec
    from sgd.storage.manager import CheckpointManager

    if controller is None:
        controller = RunController(group, max_retries, hang_timeout_s=hang_timeout_s)
        controller.start()
    run_dir = Path(logdir) / f"run_{len(list(Path(logdir).glob('run_*'))) + 1:03d}"
    manager = CheckpointManager(run_dir / "checkpoints", CheckpointStrategy(num_to_keep=num_to_keep), "pickle")
    spec = new_run_spec(run_dir, lambda: None, manager=manager, max_retries=max_retries, callbacks=list(callbacks),
                        checkpoint=checkpoint, retry_worker_errors=retry_worker_errors)
    return controller.begin(spec)


def rounds_of(run: Any) -> List[List[Dict[str, Any]]]:
    """Every round the run delivers, until it ends (its error, if any, is raised)."""
    out: List[List[Dict[str, Any]]] = []
    while True:
        results = run.next()
        if results is None:
            return out
        out.append(results)


__all__ = ["FakeGroup", "fake_trainer_run", "rounds_of"]
