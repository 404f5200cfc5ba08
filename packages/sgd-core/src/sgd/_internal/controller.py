"""One owner for a run's lifecycle: start the group, start training, collect rounds, decide
on failure, resize, finish.

:class:`RunController` holds a trainer's :class:`~sgd._internal.backend_executor.BackendExecutor`
for as long as its workers are up. :meth:`RunController.start` places the group with
retries; :meth:`RunController.begin` starts one run and returns its :class:`ActiveRun`.

An :class:`ActiveRun` is a state machine with one step function (:meth:`ActiveRun._step`)::

    STARTING ──► RUNNING ──► FINISHED
        │          │  ▲  └──► ERRORED          (or STOPPED, by TrainingIterator.stop)
        │          ▼  │
        └──► RESTARTING / RESIZING

Every decision comes from a policy (:mod:`sgd._internal.policies`) that returns it:
:meth:`FailurePolicy.decide` (``Retry`` or ``Raise``) for any failure at any phase (group
start, ``initialization_hook``, run start, mid-run, while restarting), and
:meth:`ScalingPolicy.decide` (``Resize``, ``Wait`` or ``NoOp``) for draining hosts and elastic
growth, asked after each committed checkpoint and when a drain deadline is near. The step
function only carries the decisions out.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import ray

from sgd._common.nodes import NODE_CHECK_INTERVAL_S, NodeInfo, cluster_nodes
from sgd._common.protocol import DirectCheckpoint, DirectWrite, Round, detailed_metrics_enabled
from sgd._internal.backend_executor import BackendExecutor
from sgd._internal.policies import ClusterView, Failure, FailurePolicy, Raise, Resize, Wait
from sgd._internal.rounds import RoundCollector
from sgd._internal.run_dir import RunDirectory
from sgd._worker.driver_files import start_server
from sgd._worker.session import PreemptionInfo
from sgd._worker.stacks import innermost_user_frame
from sgd.callbacks import TrainingCallback
from sgd.checkpoint import METADATA_FILE, SHARDED_KEY
from sgd.checkpoint.manager import CheckpointManager
from sgd.data import DatasetConfig, data_cpu_shortfall, shard_datasets, shards_survive_restart
from sgd.errors import TrainingHangError, WorkerDiedError
from sgd.runs import STACKS_FILE, STACKS_REQUEST
from sgd.worker_group import ResourcesUnavailableError, WorkerGroup

logger = logging.getLogger("sgd")

#: A draining host is left this many seconds before its deadline when no checkpoint came.
DRAIN_MARGIN_S = float(os.environ.get("SGD_DRAIN_MARGIN_S", "5"))
#: How often (at most) an elastic group below its max looks for room, after a checkpoint.
GROW_CHECK_INTERVAL_S = float(os.environ.get("SGD_ELASTIC_GROW_CHECK_S", "5"))


class RunState(enum.Enum):
    """Where an :class:`ActiveRun` is; :attr:`ActiveRun.transitions` records each change."""

    STARTING = "starting"  # the training functions are being started (a failure is pending)
    RUNNING = "running"  # rounds are being collected
    RESTARTING = "restarting"  # after a failure the policy retries: new workers, latest checkpoint
    RESIZING = "resizing"  # a scaling decision: the group is placed anew (not a failure)
    FINISHED = "finished"
    ERRORED = "errored"
    STOPPED = "stopped"


_ENDED = (RunState.FINISHED, RunState.ERRORED, RunState.STOPPED)


@dataclass
class RunSpec:
    """Everything one run needs, prepared by :meth:`sgd.Trainer.run_iterator`."""

    train_func: Callable[[], Any]
    config: Dict[str, Any]
    callbacks: List[TrainingCallback]
    checkpoint: Optional[dict]
    dataset: Any
    dataset_config: Optional[Dict[str, DatasetConfig]]
    run_dir: RunDirectory
    manager: CheckpointManager
    #: worker deaths this run recovers from (``-1``: unlimited): the trainer's ``max_retries``
    #: when the run begins (it may change between runs).
    max_retries: int
    #: what ``sgd.get_context()`` tells the workers about this run (experiment, trial...).
    worker_run_info: Dict[str, Optional[str]] = field(default_factory=dict)
    #: given to ``sgd_handle_result`` with every round.
    run_info: Dict[str, Any] = field(default_factory=dict)


class RunController:
    """Owns a trainer's worker group from ``start`` to ``shutdown`` and each run on it."""

    def __init__(self, executor: BackendExecutor, max_retries: int, hang_timeout_s: Optional[float] = None):
        self.executor = executor
        self.max_retries = max_retries
        #: the hang watchdog's timeout (see ``Trainer(hang_timeout_s=...)``), None: off
        self.hang_timeout_s = hang_timeout_s

    @property
    def worker_group(self) -> Optional[WorkerGroup]:
        return self.executor.worker_group

    def start(
        self,
        initialization_hook: Optional[Callable[[], Any]] = None,
        actor_cls: Optional[type] = None,
        actor_cls_args: Optional[tuple] = None,
        actor_cls_kwargs: Optional[dict] = None,
    ) -> WorkerGroup:
        """Start the group (hook and backend setup included), retrying worker deaths.

        :raises TrainingFailedError: workers kept dying past ``max_retries``.
        """
        policy = FailurePolicy(self.max_retries)
        while True:
            try:
                return self.executor.start(initialization_hook, actor_cls, actor_cls_args, actor_cls_kwargs)
            except WorkerDiedError as exc:
                decision = policy.decide(Failure(exc, "starting the workers"))
                if isinstance(decision, Raise):
                    raise decision.error from exc

    def begin(self, spec: RunSpec) -> ActiveRun:
        """Start one run. Never raises for a failure of the run itself: that comes out of
        :meth:`ActiveRun.next`."""
        return ActiveRun(self, spec)

    def shutdown(self) -> None:
        self.executor.shutdown()


class ActiveRun:
    """One run on a controller's group: rounds in, results out, deaths recovered."""

    def __init__(self, controller: RunController, spec: RunSpec):
        self._executor = controller.executor
        self._spec = spec
        self._manager = spec.manager
        self._policy = FailurePolicy(spec.max_retries)
        self._hook = controller.executor.hook
        self._hang_timeout_s = controller.hang_timeout_s
        self._shards: Dict[int, Optional[List[Any]]] = {}
        self._delivered_iteration = spec.run_dir.last_iteration()
        self._manager.delivered_iteration = self._delivered_iteration
        # The report the workers' stream is at (replayed ones after a restart included), and
        # whether this run saves its checkpoints before the report they go with: decided by
        # its first checkpoint (saved before any report: yes). See _file_under.
        self._position = 0
        self._save_then_report: Optional[bool] = None
        self._run_info = dict(spec.run_info, callbacks=list(spec.callbacks))
        self._rounds: Optional[RoundCollector] = None
        # Host health between rounds: the next check (monotonic), the drain being acted on,
        # a move decided after a checkpoint (done before the next round), the next time an
        # elastic group looks for room to grow.
        self._next_node_check = 0.0
        self._next_stacks_check = 0.0
        self._drain: Optional[Dict[str, NodeInfo]] = None
        self._drain_waits_logged = False
        self._next_grow_check = time.monotonic() + GROW_CHECK_INTERVAL_S
        self.returns: Optional[List[Any]] = None
        #: every state the run went through, in order (tests and ``sgd`` debugging read it)
        self.transitions: List[RunState] = []
        # What the next step acts on: the failure being retried (RESTARTING), the resize
        # decided (RESIZING, or pending until the next step while RUNNING), the failure of
        # the start (STARTING), which comes out of the first next().
        self._failure: Optional[Failure] = None
        self._resize: Optional[Resize] = None
        self._start_error: Optional[BaseException] = None
        #: asynchronously written checkpoints announced, not yet complete: (payload, iteration)
        self._pending: List[Tuple[DirectCheckpoint, int]] = []
        #: the file server on the driver's host, once a worker runs elsewhere (sgd._worker.driver_files)
        self._files: Any = None
        self._to(RunState.STARTING)
        resumed = self._delivered_iteration > 0
        for cb in spec.callbacks:
            cb.start_training(logdir=str(spec.run_dir.path), config=spec.config, resumed=resumed,
                              start_iteration=self._delivered_iteration)
        try:
            self._rounds = self._start(spec.checkpoint, self._manager.latest_iteration if spec.checkpoint else 0)
            self._to(RunState.RUNNING)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                self.finish(error=True, exc=exc)
                raise
            self._start_error = exc

    @property
    def state(self) -> RunState:
        return self.transitions[-1]

    @property
    def finished(self) -> bool:
        return self.state in _ENDED

    def _to(self, state: RunState) -> None:
        logger.debug("run %s: %s", self._spec.run_dir.path.name, state.value)
        self.transitions.append(state)

    # --- starting and recovering -----------------------------------------------------------

    def _start(self, checkpoint: Optional[dict], start_iteration: int) -> RoundCollector:
        executor, spec = self._executor, self._spec
        group = executor.worker_group
        if group is None:
            raise RuntimeError("the trainer was shut down while a run was starting")
        n = executor.num_workers
        if spec.dataset is not None and n not in self._shards:
            # Split once per group size: divided shards serve a restarted group as they are (see
            # _restart), an elastic group of another size gets parts of its own.
            shortfall = data_cpu_shortfall(spec.dataset)
            if shortfall is not None:
                raise ResourcesUnavailableError(shortfall)
            hints = [m.node_id for m in group.metadata]
            self._shards = {n: shard_datasets(spec.dataset, n, spec.dataset_config, hints, list(group.workers))}
        shards = self._shards.get(n) if spec.dataset is not None else None
        direct = None
        if self._manager.strategy.num_to_keep != 0 and executor.rank0_on_driver_node():
            # Rank 0 shares the driver's disk: it writes checkpoints itself, no transfer.
            self._manager.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            direct = DirectWrite(str(self._manager.checkpoint_dir), self._manager.codec,
                                 self._manager.strategy.checkpoint_score_attribute)
        self._position = start_iteration
        rounds = executor.start_training(spec.train_func, checkpoint, shards, start_iteration, direct,
                                         self._worker_run_info(group))
        rounds.tick = self._tick
        rounds.hang_timeout_s, rounds.on_hang = self._hang_timeout_s, self._hung
        self._drain, self._drain_waits_logged = None, False
        return rounds

    def _worker_run_info(self, group: WorkerGroup) -> Dict[str, Any]:
        """What each worker's context gets for this run: the run's names, the driver's node,
        and a file server on it when a worker's host is another one (a disk of its own)."""
        driver_node = ray.get_runtime_context().get_node_id()
        info: Dict[str, Any] = dict(self._spec.worker_run_info, driver_node_id=driver_node)
        if self._files is None and any(m.node_id != driver_node for m in group.metadata):
            initial = self._spec.checkpoint
            readable = [initial[SHARDED_KEY]] if isinstance(initial, dict) and SHARDED_KEY in initial else []
            self._files = start_server(driver_node, [str(self._spec.run_dir.path)], readable)
        info["driver_files"] = self._files
        return info

    def _stop_files(self) -> None:
        if self._files is not None:
            ray.kill(self._files, no_restart=True)
            self._files = None

    def _tick(self) -> None:
        """Between waits for the workers: the hosts' health, and ``sgd stacks`` asking."""
        self._check_hosts()
        now = time.monotonic()
        if now >= self._next_stacks_check:
            self._next_stacks_check = now + STACKS_CHECK_INTERVAL_S
            answer_stacks_request(self._spec.run_dir.path, self._executor.worker_group)

    def _hung(self, items_per_worker: List[int]) -> None:
        """The hang watchdog fired: log every worker's stack and the stragglers, then fail the
        run (:class:`TrainingHangError`, retried like a death)."""
        group = self._executor.worker_group
        stacks = group.stacks(timeout_s=5.0) if group is not None else []
        stragglers, where = stragglers_of(items_per_worker, stacks)
        timeout = self._hang_timeout_s
        message = (f"no worker sent a report, a checkpoint or its end for {timeout:g} s (hang_timeout_s / "
                   f"SGD_HANG_TIMEOUT_S): the run is taken as hung. ")
        if stragglers:
            message += f"Not where the others are: rank{'s' if len(stragglers) > 1 else ''} " \
                       f"{', '.join(map(str, stragglers))} ({where}). "
        else:
            message += "Every rank is at the same place (a step longer than the timeout, or all waiting). "
        message += "Every worker's stack is logged above, and in the error's .stacks."
        logger.error("%s\n%s", message, "\n".join(stacks))
        raise TrainingHangError(message, stragglers, stacks)

    def _fail(self, error: BaseException, phase: str) -> None:
        """Ask the failure policy; carry its decision out: RESTARTING next, or raise."""
        failure = Failure(error, phase)
        decision = self._policy.decide(failure)
        if isinstance(decision, Raise):
            if decision.error is error:
                raise error
            raise decision.error from error
        self._failure = failure
        self._to(RunState.RESTARTING)

    def _restart(self, error: Optional[BaseException], resize: Optional[Resize] = None) -> None:
        try:
            self._executor.restart(error, move=resize is not None,
                                   size=resize.num_workers if resize is not None else None)
        except ResourcesUnavailableError as exc:
            raise ResourcesUnavailableError(
                f"{exc} Every result and checkpoint reported so far is kept in {self._spec.run_dir.path}; "
                "resume it with sgd.Trainer.restore(run_dir) once the cluster has room."
            ) from exc
        self._pending.clear()  # background writes of the old workers never complete
        self._manager.remove_temporary()  # the old workers are gone, mid-write or not
        # Ray Data's streaming split (split="coordinated") counts a dead consumer that
        # had reached its epoch barrier and cannot forget it: a restarted group needs a
        # new split. Divided and materialised shards are reused as they are.
        made = next(iter(self._shards.values()), None)
        if not shards_survive_restart(self._spec.dataset, self._spec.dataset_config, made):
            self._shards = {}
        state = self._manager.restorable()
        if state is not None:
            self._rounds = self._start(state, self._manager.latest_iteration)
        else:
            self._rounds = self._start(self._spec.checkpoint, 0)

    # --- hosts: lost, draining, room to grow -----------------------------------------------

    def _check_hosts(self) -> None:
        """Between rounds, at most every :data:`NODE_CHECK_INTERVAL_S`: a host of the group
        that Ray declared dead fails the run now (not when an actor call notices); a draining
        host is announced to every worker (:func:`sgd.get_preemption_info`) and the group
        leaves it at the next checkpoint, or shortly before its deadline."""
        now = time.monotonic()
        if now < self._next_node_check:
            return
        self._next_node_check = now + NODE_CHECK_INTERVAL_S
        group = self._executor.worker_group
        if group is None or not group.metadata:
            return
        ours = {m.node_id for m in group.metadata}
        try:
            nodes = cluster_nodes()
        except Exception:  # no GCS client here (Ray Client), or the GCS is briefly away
            logger.debug("could not read the cluster's nodes", exc_info=True)
            return
        for i, meta in enumerate(group.metadata):
            info = nodes.get(meta.node_id)
            if info is not None and not info.alive:
                raise WorkerDiedError(
                    f"worker rank {i} is gone: its host {info.describe()} was declared dead by Ray", i)
        draining = {n: nodes[n] for n in ours if n in nodes and nodes[n].draining}
        if not draining:
            return
        if self._drain is None:
            self._drain = draining
            self._announce_drain(group, draining)
        deadline = min(n.drain_deadline or math.inf for n in self._drain.values())
        if time.time() >= deadline - DRAIN_MARGIN_S:
            view = ClusterView(self._executor.room(nodes), self._drain, deadline_near=True)
            decision = self._executor.scaling.decide(view, self._executor.num_workers)
            if isinstance(decision, Resize):
                raise _Relocate(decision)

    def _announce_drain(self, group: WorkerGroup, draining: Dict[str, NodeInfo]) -> None:
        from ray.exceptions import RayError

        first = min(draining.values(), key=lambda n: n.drain_deadline or math.inf)
        info = PreemptionInfo(first.drain_deadline or math.inf, first.ip, first.node_id)
        ranks = [i for i, m in enumerate(group.metadata) if m.node_id in draining]
        left = "no deadline" if info.deadline == math.inf else f"deadline in {info.seconds_left:.0f}s"
        logger.warning("host %s is draining (%s; ranks %s): the workers leave it at the next checkpoint",
                       first.describe(), left, ranks)
        # Two steps, so that every worker shows the notice from the same report on: ask each
        # how far it got (its next report waits until told), then tell all the first report
        # none of them has passed.
        def answers(refs: List[Any]) -> List[Any]:
            out = []
            for ref in refs:
                try:
                    out.append(ray.get(ref, timeout=30))
                except (RayError, TimeoutError):
                    pass  # a dead worker: its death is handled where its poll fails
            return out

        counts = answers([w._sgd_notice.remote(info) for w in group.workers])
        start = max(counts, default=0) + 1
        answers([w._sgd_notice_from.remote(start) for w in group.workers])

    def _after_checkpoint(self) -> None:
        """A checkpoint was just committed (the workers wait for its acknowledgement): ask the
        scaling policy whether to leave a draining host or grow an elastic group. A resize is
        carried out before the next round."""
        executor = self._executor
        scaling = executor.scaling
        if self._drain is None:
            if not scaling.elastic or executor.num_workers >= scaling.max_workers:
                return  # nothing could change: no need to read the cluster
            now = time.monotonic()
            if now < self._next_grow_check:
                return
            self._next_grow_check = now + GROW_CHECK_INTERVAL_S
        decision = scaling.decide(ClusterView(executor.room(), self._drain or {}), executor.num_workers)
        if isinstance(decision, Resize):
            self._resize = decision
        elif isinstance(decision, Wait) and not self._drain_waits_logged:
            self._drain_waits_logged = True
            logger.warning("%s", decision.reason)

    # --- rounds --------------------------------------------------------------------------------

    def next(self) -> Optional[List[Dict[str, Any]]]:
        """The next report round (one dict per worker), or ``None`` once the run finished.

        :raises TrainingFailedError: workers died more often than ``max_retries`` allows.
        :raises Exception: a worker's exception, with its own type (see :class:`sgd.WorkerError`).
        """
        if self.finished:
            return None
        try:
            while True:
                results = self._step()
                if results is not None or self.finished:
                    return results
        except BaseException as exc:
            self.finish(error=True, exc=exc)
            raise

    def _step(self) -> Optional[List[Dict[str, Any]]]:
        """One step of the state machine: a delivered round's results, or ``None`` (a state
        changed, or the round had nothing to hand out)."""
        state = self.state
        if state is RunState.STARTING:
            error, self._start_error = self._start_error, None
            assert error is not None
            self._fail(error, "starting the run")
        elif state is RunState.RESTARTING:
            assert self._failure is not None
            try:
                self._restart(self._failure.error)
            except WorkerDiedError as exc:  # a worker died while restarting: decided like any failure
                self._fail(exc, "restarting")
                return None
            self._failure = None
            self._to(RunState.RUNNING)
        elif state is RunState.RESIZING:
            resize, self._resize = self._resize, None
            assert resize is not None
            logger.warning("%s; restarting %d workers from the latest checkpoint (not a failure)",
                           resize.reason, resize.num_workers)
            try:
                self._restart(None, resize)
            except WorkerDiedError as exc:
                self._fail(exc, "restarting")
                return None
            self._to(RunState.RUNNING)
        elif state is RunState.RUNNING:
            if self._resize is not None:
                self._to(RunState.RESIZING)
                return None
            assert self._rounds is not None
            try:
                round_ = self._rounds.next_round()
            except WorkerDiedError as exc:
                self._fail(exc, "training")
                return None
            except _Relocate as move:
                self._resize = move.decision
                self._to(RunState.RESIZING)
                return None
            if round_ is None:
                self.returns = self._rounds.returns
                self._commit_pending(final=True)
                self.finish(error=False)
                return None
            return self._deliver(round_)
        return None

    def _deliver(self, round_: Round) -> Optional[List[Dict[str, Any]]]:
        """Persist one round and hand it to the hooks and callbacks; ``None`` when there is
        nothing to hand out (a checkpoint round, a round replayed after a restart)."""
        manager = self._manager
        if self._pending:
            self._commit_pending()
        if round_.is_checkpoint:
            state = round_.saved_state
            if isinstance(state, DirectCheckpoint) and state.pending:
                # Written in the background: committed once its metadata appears (in order).
                self._pending.append((state, self._file_under()))
                self._commit_pending()
                return None
            if isinstance(state, DirectCheckpoint):
                manager.register_written(Path(state.path), state.score_values, self._file_under())
            else:
                manager.register(self._executor.decode_checkpoint(state), self._file_under())
            self._after_checkpoint()
            return None
        iteration = round_.iteration
        self._position = iteration
        if self._save_then_report is None:
            self._save_then_report = False
        if iteration <= self._delivered_iteration:
            _discard(round_.checkpoints)
            return None  # replayed after a restart: callbacks already have it
        self._delivered_iteration = iteration
        results = round_.results
        self._spec.run_dir.append_line(round_.json_line())
        manager.delivered(iteration)
        if round_.has_reported_checkpoint:
            # After the results line: a driver that dies in between resumes from an older
            # checkpoint and replays (de-duplicated), never skips, this round.
            first = next(i for i, c in enumerate(round_.checkpoints) if c is not None)
            manager.register_reported(round_.checkpoints, round_.full_result(first), iteration,
                                      decode=self._executor.decode_checkpoint)
            self._after_checkpoint()
        if detailed_metrics_enabled():  # persisted above in full; handed on only when asked for
            round_.add_details()
        # The plugins' implementations, then sgd-core's, which hands the round to the callbacks.
        self._hook.sgd_handle_result(results=results, run_info=self._run_info)
        return results

    def checkpoint_for(self, iteration: int) -> Optional[Path]:
        """The kept checkpoint filed under report ``iteration`` (see :meth:`_file_under`)."""
        return self._manager.checkpoint_for(iteration)

    def _file_under(self) -> int:
        """The report a checkpoint saved now goes with (what Tune files it under, what a restart
        from it counts on from). ``sgd.report(metrics, checkpoint=...)`` says it; a separate
        ``save_checkpoint`` goes with the report before it, or, in a run whose first checkpoint
        came before its first report (save, then report), with the report after it. That one
        is restored from only once its report is delivered."""
        if self._save_then_report is None:
            self._save_then_report = True
        return self._position + (1 if self._save_then_report else 0)

    def _commit_pending(self, final: bool = False) -> None:
        """Commit the asynchronously written checkpoints whose metadata file appeared, oldest
        first (a newer one waits for an older one). ``final``: the workers have finished, so
        every write that went well is complete; one that is not was abandoned."""
        while self._pending:
            state, iteration = self._pending[0]
            if not (Path(state.path) / METADATA_FILE).is_file():
                if not final:
                    return
                logger.warning("the asynchronous checkpoint %s was not completed by the workers; not committed",
                               state.path)
                self._pending.pop(0)
                continue
            self._pending.pop(0)
            self._manager.register_written(Path(state.path), state.score_values, iteration)
            self._after_checkpoint()

    # --- the end ----------------------------------------------------------------------------------

    def stop(self, patience_s: float) -> None:
        """End the run now as ``STOPPED``: the training functions stop at their next report or
        checkpoint (workers that do not within ``patience_s`` are killed); the callbacks
        finish without error. Rounds not yet delivered are dropped."""
        if self.finished:
            return
        self._to(RunState.STOPPED)
        self._spec.run_dir.close(False, stopped=True)
        self._executor.stop_training(patience_s)
        self._stop_files()
        self._manager.remove_temporary()
        for cb in self._spec.callbacks:
            cb.finish_training(error=False)

    def finish(self, error: bool, exc: Optional[BaseException] = None) -> None:
        """End the run once: close the run directory, release or stop the workers, tell the callbacks."""
        if self.finished:
            return
        self._to(RunState.ERRORED if error else RunState.FINISHED)
        self._spec.run_dir.close(error, interrupted=isinstance(exc, KeyboardInterrupt))
        self._executor.end_training(ok=not error, error=exc)
        self._stop_files()
        self._manager.remove_temporary()
        for cb in self._spec.callbacks:
            try:
                cb.finish_training(error=error)
            except Exception:
                if not error:
                    raise
                logger.exception("callback %r failed in finish_training", cb)


#: How often (seconds) a running driver looks for a request of ``sgd stacks``.
STACKS_CHECK_INTERVAL_S = 1.0


def answer_stacks_request(run_dir: Path, group: Any) -> None:
    """When ``sgd stacks`` asked (``run_dir/stacks.request``), write every worker's stacks to
    ``run_dir/stacks.txt`` (atomically; its first line is the request's text)."""
    request = run_dir / STACKS_REQUEST
    try:
        token = request.read_text()
    except OSError:
        return
    stacks = group.stacks(timeout_s=5.0) if group is not None else ["(no workers are running)\n"]
    tmp = run_dir / f".{STACKS_FILE}.tmp"
    tmp.write_text(token.strip() + "\n" + "\n".join(stacks))
    os.replace(tmp, run_dir / STACKS_FILE)
    request.unlink(missing_ok=True)


def stragglers_of(items_per_worker: List[int], stacks: List[str]) -> Tuple[List[int], str]:
    """The ranks not where the others are, and where that is: behind the most advanced ranks
    in what they sent; or, when all sent as much, at another line of the training function
    than most ranks (from each worker's innermost frame of its training thread)."""
    most = max(items_per_worker, default=0)
    behind = [i for i, n in enumerate(items_per_worker) if n < most]
    if behind:
        return behind, f"{len(behind)} of {len(items_per_worker)} ranks sent fewer reports and checkpoints " \
                       f"({min(items_per_worker)} against {most})"
    frames = [innermost_user_frame(s) for s in stacks]
    counts: Dict[Optional[str], int] = {}
    for f in frames:
        counts[f] = counts.get(f, 0) + 1
    if len(counts) < 2:
        return [], ""
    common = max(counts, key=lambda f: counts[f])
    odd = [i for i, f in enumerate(frames) if f != common]
    return odd, "; ".join(f"rank {i} at {frames[i]}" for i in odd) + f"; the others at {common}"


class _Relocate(Exception):
    """Raised by a host check inside the round loop: carry a resize out now, not as a failure."""

    def __init__(self, decision: Resize):
        super().__init__(decision)  # the one argument: it pickles like any exception
        self.decision = decision

    def __str__(self) -> str:
        return self.decision.reason


def _discard(payloads: List[Any]) -> None:
    for p in payloads:
        if isinstance(p, DirectCheckpoint):
            shutil.rmtree(p.path, ignore_errors=True)


__all__: Tuple[str, ...] = ("ActiveRun", "RunController", "RunSpec", "RunState")
