"""Ray actors as the run controller's worker group (:class:`ActorGroup`).

:class:`ActorGroup` places the group, runs the ``initialization_hook`` and the backend setup
hooks, starts a training function on every worker (its rounds are collected by a
:class:`~sgd.group.rounds.RoundCollector`), reports the hosts' health, replaces the group
after a failure and tears it down. It makes one attempt at each step and returns the failure
(a :class:`~sgd.errors.WorkerDiedError` for a death, never a raw Ray exception): what to do
about it is the run controller's (:mod:`sgd.run.controller`) decision.

What a group can keep across runs it makes once: the file server on the driver's host that
workers elsewhere write the run directory through is started by the first run that needs it
and stopped with the group.

How the group is placed is :mod:`sgd.group.placing`'s job; growing and re-forming it in place
while a run goes on, :mod:`sgd.group.in_place`'s.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import ray

from sgd._common.nodes import NODE_CHECK_INTERVAL_S, NodeInfo, NodeWatch
from sgd._worker.rank_logs import RankLogFiles
from sgd._worker.session import DEFAULT_MAX_PENDING
from sgd.backend import Backend, BackendConfig
from sgd.group.deaths import deaths_as_errors, idle_survivors
from sgd.group.hosts import announce_drain, read_health
from sgd.group.in_place import _InPlace
from sgd.group.inputs import RunInputs
from sgd.group.placing import ELASTIC_ATTEMPT_S as ELASTIC_ATTEMPT_S
from sgd.group.placing import _Placing
from sgd.group.protocol import RunRequest
from sgd.group.rounds import RoundCollector
from sgd.group.starts import StartArgs, start_calls
from sgd.group.status import HEALTHY, Health, Poll
from sgd.plugins import get_plugin_manager, run_backend_teardown
from sgd.worker_group import WorkerGroup

logger = logging.getLogger("sgd")


class ActorGroup(_Placing, _InPlace):
    """A group of Ray actors with one backend: the run controller's worker group
    (:class:`sgd.group.protocol.RunGroup`).

    The :class:`~sgd.Backend` object is created when the group starts and kept until it is
    shut down: every lifecycle hook of the group (``on_start``, each ``on_training_start``,
    ``on_failure``, a restart's ``on_start``, ``on_shutdown``) gets the same object.
    """

    def __init__(
        self,
        backend_config: BackendConfig,
        num_workers: int,
        resources_per_worker: Dict[str, float],
        max_pending: int = DEFAULT_MAX_PENDING,
        min_workers: Optional[int] = None,
        placement_strategy: str = "PACK",
        placement_timeout_s: Optional[float] = None,
        hook: Any = None,
    ):
        #: The hooks this group's lifecycle calls: its trainer's plugin manager's
        #: (:func:`sgd.plugins.plugin_manager_for`), by default the process-wide one's.
        self.hook = hook if hook is not None else get_plugin_manager().hook
        self.backend_config = backend_config
        self.placement_strategy = placement_strategy
        #: How many workers the group may have (equal for a fixed-size group).
        self.min_workers = num_workers if min_workers is None else min_workers
        self.max_workers = num_workers
        if not 1 <= self.min_workers <= self.max_workers:
            raise ValueError(f"need 1 <= min_workers <= max_workers, got {self.min_workers}, {self.max_workers}")
        #: The group's size now (for an elastic group: what the last placement got).
        self.num_workers = num_workers
        self.resources_per_worker = dict(resources_per_worker)
        self.max_pending = max_pending
        #: How long a (re)start waits for the cluster to place the group; ``None``: the
        #: ``SGD_PLACEMENT_TIMEOUT_S`` default (see :func:`sgd.worker_group.placement_timeout_s`).
        self.placement_timeout_s = placement_timeout_s
        #: Hosts found lost (before Ray declares them dead) and draining: placements avoid them.
        self.nodes = NodeWatch()
        #: the current run's event log writer (:class:`sgd.run.telling.RunEvents`), set by its controller
        self.events: Optional[Any] = None
        self.worker_group: Optional[WorkerGroup] = None
        #: The group's backend; ``None`` while no group is up.
        self.backend: Optional[Backend] = None
        self._initialization_hook: Optional[Callable[[], Any]] = None
        self._actor_cls: tuple = (None, None, None)
        # Whether the group must be replaced before its next run: a run that did not end
        # cleanly leaves the framework (a process group, a collective) in an unknown state.
        self._dirty = False
        # end() saw every run of a failed run end: the processes are as after a clean run, and
        # the restart before the next run only sets the backend up again (no second check).
        self._runs_ended = False
        #: the current run's rounds (between begin and end)
        self._rounds: Optional[RoundCollector] = None
        # The current run's dataset shards and the driver's file server (sgd.group.inputs).
        self._inputs = RunInputs()
        self._health = HEALTHY
        self._next_health_check = 0.0
        # The current run: its request, what its workers are told, whether the backend can
        # re-form the group in place (sgd.elastic).
        self._request: Optional[RunRequest] = None
        self._run_info: Dict[str, Any] = {}
        self._reforms = False
        # Workers started to grow the current in-place run, not yet in the group (slots, actors, metadata).
        self._joining: Optional[tuple] = None
        # Per worker process (actor id): the run info sent to it once (SENT_ONCE: the driver's node,
        # the file server), left out of its later runs' start calls while it stays the same.
        self._sent_once: Dict[Any, tuple] = {}
        # Where the workers' output goes on the driver's disk: (run directory, its RankLogFiles).
        self._log_files: Optional[Tuple[str, RankLogFiles]] = None

    @property
    def needs_restart(self) -> bool:
        return self._dirty and self.worker_group is not None

    def _hook_kwargs(self) -> Dict[str, Any]:
        return {"worker_group": self.worker_group, "backend_config": self.backend_config, "backend": self.backend}

    # --- start ----------------------------------------------------------------------------

    def start(
        self,
        initialization_hook: Optional[Callable[[], Any]] = None,
        actor_cls: Optional[type] = None,
        actor_cls_args: Optional[tuple] = None,
        actor_cls_kwargs: Optional[dict] = None,
    ) -> Optional[BaseException]:
        """Place the group, run ``initialization_hook`` on every worker, set the backend up.

        One attempt: on any failure nothing is left running (no actors, no reservation), and
        the failure is returned (a death as :class:`WorkerDiedError`); ``None`` when started.
        """
        if self.worker_group is not None:
            raise RuntimeError("the worker group is already started")
        self._initialization_hook = initialization_hook
        self._actor_cls = (actor_cls, actor_cls_args, actor_cls_kwargs)
        self.backend = self.backend_config.backend_cls()
        try:
            with deaths_as_errors(None, "starting"):
                self.worker_group = self._new_worker_group()
            # Its process starts while the backend is set up (a trainer's first runs need it).
            self._inputs.start_file_server(self.worker_group, ray.get_runtime_context().get_node_id())
            self._inputs.start_collective()
            self._setup()
        except BaseException as exc:
            self._inputs.shutdown()
            if self.worker_group is not None:
                self.worker_group.shutdown(patience_s=0)  # no teardown hook is registered yet
            self.worker_group, self.backend = None, None
            if not isinstance(exc, Exception):
                raise  # Ctrl-C, SystemExit: not a failure to decide on
            return exc
        wg = self.worker_group
        assert wg is not None
        wg.backend = self.backend
        wg.add_shutdown_hook(self._teardown)
        return None

    def _setup(self, new: Optional[List[int]] = None) -> None:
        """The initialization hook (on the workers at indices ``new``, or on all) and the
        backend setup hooks (on all), on the current group."""
        wg = self.worker_group
        assert wg is not None
        with deaths_as_errors(wg, "setting the worker group up"):
            if self._initialization_hook is not None:
                if new is None:
                    wg.execute(self._initialization_hook)
                else:
                    ray.get([wg.execute_single_async(i, self._initialization_hook) for i in new])
            self.hook.sgd_backend_setup(**self._hook_kwargs())
        self._dirty = self._runs_ended = False

    def _teardown(self, worker_group: WorkerGroup) -> None:
        if self._dirty:
            return  # the framework is in an unknown state; killing the actors cleans up
        assert self.backend is not None
        run_backend_teardown(worker_group, self.backend_config, self.backend, hook=self.hook)

    # --- failure and restart ------------------------------------------------------------------

    def handle_failure(self, error: Optional[BaseException]) -> None:
        """Tell the backend the group failed (``on_failure``); the group is replaced before its next run."""
        self._dirty = True
        if self.worker_group is None:
            return
        try:
            self.hook.sgd_backend_handle_failure(**self._hook_kwargs(), error=error)
        except Exception:
            logger.exception("backend failure handler raised")

    def restart(self, error: Optional[BaseException] = None, size: Optional[int] = None,
                move: bool = False) -> Optional[BaseException]:
        """Replace every worker (after ``error``) and set the same backend object up again.

        With ``move``, the group is placed anew (off draining hosts; an elastic group at
        ``size``, as the scaling policy decided, or at the size that fits now) rather than
        replacing only the workers that failed.

        :returns: the failure to do so (a death of a new worker while it was set up, a
            placement that timed out), or ``None``.
        """
        self._end_rounds()
        if self.worker_group is not None:
            self.worker_group.run_notes = []  # new workers have told nothing
        try:
            self._restart(error, size, move)
        except Exception as exc:
            return exc
        self._inputs.restarted()
        return None

    def _restart(self, error: Optional[BaseException], size: Optional[int], move: bool) -> None:
        runs_ended, self._runs_ended = self._runs_ended and error is None, False
        if error is not None:
            self.handle_failure(error)
        self._dirty = True
        old = self.worker_group
        assert old is not None
        replaced: Optional[List[int]] = None
        begun = time.monotonic()
        with deaths_as_errors(None, "restarting"):
            # A lost host takes its bundles with it: Ray keeps offering its resources (and
            # keeps the old reservation there) until it declares the host dead, ~15 s later.
            lost = self.nodes.lost({m.node_id for m in old.metadata}) if error is not None else {}
            if lost:
                where = ", ".join(n.describe() for n in lost.values())
                ranks = [i for i, m in enumerate(old.metadata) if m.node_id in lost]
                logger.warning("host lost: %s (ranks %s); placing the group again without it", where, ranks)
                if self.events is not None:
                    self.events.hosts_lost(lost, ranks)
            if self.min_workers == self.max_workers and not lost and not move:
                if runs_ended:
                    logger.info("restart: every run ended after the failure; keeping all %d workers", len(old))
                    replaced = []
                else:
                    replaced = self._replace_failed(old)
            else:
                # Re-place: count what fits with our old reservation released (on the hosts
                # that are still there), release it, place anew off the lost hosts.
                # Counted before the release: Ray's view may show it released a moment later
                # (or already), and counting ours on top of that would ask for too many.
                elastic = self.min_workers != self.max_workers
                count = size if size is not None else self.room() if elastic else None
                old.stop_actors()
                # Not waiting for Ray to show the reservation free: what fits was counted above,
                # and a lost host's bundles never show free again (that wait took its 2 s whole).
                old.shutdown(patience_s=0, await_freed=False)
                self.worker_group = self._new_worker_group(restarting=True, count=count)
                self.worker_group.backend = self.backend
                self.worker_group.add_shutdown_hook(self._teardown)
        placed = time.monotonic()
        self._setup(replaced)
        logger.info("restart: %.2fs to stop the runs and place the new workers, %.2fs to set the backend up",
                    placed - begun, time.monotonic() - placed)

    def _replace_failed(self, wg: WorkerGroup) -> Optional[List[int]]:
        """Replace the workers of a fixed-size group after a failure: only the ones that died
        or did not end their run within :data:`SURVIVOR_PATIENCE_S` of being asked to, when
        the backend allows it (:meth:`sgd.Backend.keeps_survivors`), else all of them.

        :returns: the indices of the new workers, or ``None`` when all were replaced.
        """
        assert self.backend is not None
        survivors: List[int] = []
        begun = time.monotonic()
        if wg.workers and self.backend.keeps_survivors(wg, self.backend_config):
            survivors = idle_survivors(wg, SURVIVOR_PATIENCE_S, extend=True)
            logger.info("restart: %d of %d runs ended within %.2fs", len(survivors), len(wg),
                        time.monotonic() - begun)
        if not survivors:
            logger.info("restarting %d workers", self.num_workers)
            wg.restart_actors()
            return None
        failed = [i for i in range(len(wg)) if i not in set(survivors)]
        logger.info("restarting %d of %d workers (ranks %s); keeping the others", len(failed), len(wg), failed)
        wg.replace_workers(failed)
        return failed

    # --- runs ------------------------------------------------------------------------------

    def begin(self, request: RunRequest) -> Optional[BaseException]:
        """Start ``request.train_func`` on every worker; the failure to start it, or ``None``.

        A worker that dies before its training function started shows up as a death from
        the first :meth:`poll`: the start calls are waited on with the rounds.
        """
        if self.worker_group is None:
            raise RuntimeError("the trainer is not started; call trainer.start() first")
        try:
            self._begin(request)
        except Exception as exc:
            return exc
        return None

    def _begin(self, request: RunRequest) -> None:
        wg = self.worker_group
        assert wg is not None and self.backend is not None
        shards = self._inputs.shards(request, wg)
        driver_node = ray.get_runtime_context().get_node_id()
        run_info: Dict[str, Any] = dict(request.run_info, driver_node_id=driver_node)
        # Workers on other hosts write the run directory (their checkpoints too) through it.
        run_info["driver_files"], run_info["driver_files_told"] = self._inputs.file_server(request, wg, driver_node)
        run_info["collective"], run_info["collective_run"] = self._inputs.collective()
        with deaths_as_errors(wg, "starting the training function"):
            self.hook.sgd_backend_training_start(**self._hook_kwargs())
        wg.run_notes = []  # they told of the last run; this one tells its own when it ends cleanly
        self._request, self._run_info = request, run_info
        live = {w._actor_id for w in wg.workers}  # forget replaced workers (and the handles told them)
        self._sent_once = {a: told for a, told in self._sent_once.items() if a in live}
        self._reforms = self.backend.reforms_in_place(wg, self.backend_config)
        refs = self._start_training(list(range(len(wg))), shards or [None] * len(wg), request.start_iteration)
        # Until the run ends cleanly, assume it did not.
        self._dirty = True
        # Not waited for here: the collector waits on these with the rounds, so that a worker
        # whose run failed at once is seen even while another one's start has not returned.
        self._rounds = RoundCollector(wg.workers, starts=refs, lost_hosts=self.on_lost_hosts, on_log=self.write_log)

    def write_log(self, rank: int, data: bytes) -> None:
        """What the worker of ``rank`` on another host printed, to its log in the run directory."""
        run_dir = self._run_info.get("trial_dir")
        if not run_dir:
            return
        if self._log_files is None or self._log_files[0] != run_dir:
            self._log_files = (run_dir, RankLogFiles(run_dir))
        self._log_files[1].append(rank, data)

    def on_lost_hosts(self, indices: List[int]) -> List[int]:
        """Which of the workers at ``indices`` run on a host that is gone (its raylet does not
        answer): a reset in place leaves them out without waiting for Ray to fail their calls."""
        wg = self.worker_group
        if wg is None:
            return []
        lost = self.nodes.lost({wg.metadata[i].node_id for i in indices})
        return [i for i in indices if wg.metadata[i].node_id in lost]

    def _start_training(self, ranks: List[int], shards: List[Any], start_iteration: int,
                        join: Any = None, snapshot: Any = None) -> List[Any]:
        """Start the current run's function on the workers at ``ranks``; the start calls.
        ``join`` (with the ``snapshot`` reference): they join a group that re-formed in place."""
        wg, request = self.worker_group, self._request
        assert wg is not None and self.backend is not None and request is not None
        return start_calls(wg, ranks, request, type(self.backend), self._run_info, self._sent_once,
                           StartArgs(shards, self.max_pending, start_iteration, self._reforms, join, snapshot))

    def poll(self, timeout_s: float) -> Poll:
        """The run's next round, its end, a failure, or idle after ``timeout_s``."""
        if self._rounds is None:
            raise RuntimeError("no run is active on this group")
        return self._rounds.poll(timeout_s)

    def health(self) -> Health:
        """The group's hosts, read at most every :data:`NODE_CHECK_INTERVAL_S`."""
        now = time.monotonic()
        if now >= self._next_health_check:
            self._next_health_check = now + NODE_CHECK_INTERVAL_S
            self._health = read_health(self.worker_group)
        return self._health

    def announce_drain(self, draining: Dict[str, NodeInfo]) -> None:
        if self.worker_group is not None:
            announce_drain(self.worker_group, draining)

    def stacks(self, timeout_s: float = 10.0, include_idle: bool = False) -> List[str]:
        if self.worker_group is None:
            return ["(no workers are running)\n"]
        return self.worker_group.stacks(timeout_s, include_idle)

    def end(self, ok: bool, error: Optional[BaseException] = None) -> None:
        """Close a run: on success just forget it (keeping what its workers noted at the end, for
        the backend's next ``on_training_start``). On failure, keep the workers if every run
        ends within :data:`FAILED_RUN_PATIENCE_S` and the backend keeps survivors; else stop
        every worker at once."""
        if ok and self._rounds is not None and self.worker_group is not None:
            if len(self._rounds.notes) == len(self.worker_group):
                self.worker_group.run_notes = list(self._rounds.notes)
        self._end_rounds()
        self._inputs.run_ended()
        if self.worker_group is None:
            return
        if ok:
            self._dirty = False
            return
        self.handle_failure(error)
        if isinstance(error, Exception) and self._every_run_ends_within(FAILED_RUN_PATIENCE_S):
            # The failing worker's run ended, the others' at their next report: the processes
            # stay (no new process, no framework import); the next run first sets the backend
            # up on them again, as a restart that keeps survivors does.
            self._runs_ended = True
            return
        # A worker may be blocked in a collective its failed peer will never
        # join; only killing the processes stops it. Fresh actors start lazily.
        self.worker_group.stop_actors(patience_s=0)

    def _every_run_ends_within(self, patience_s: float) -> bool:
        """Whether every worker is alive and its run ended within ``patience_s`` of being asked
        to stop, for a backend that can be set up again in live processes
        (:meth:`sgd.Backend.keeps_survivors`)."""
        wg = self.worker_group
        if patience_s <= 0 or wg is None or not wg.workers or self.backend is None:
            return False
        if not self.backend.keeps_survivors(wg, self.backend_config):
            return False
        begun = time.monotonic()
        ended = len(idle_survivors(wg, patience_s))
        if ended < len(wg.workers):
            logger.info("after the failed run, %d of %d workers ended their run within %.2fs; ending every worker "
                        "process", ended, len(wg.workers), time.monotonic() - begun)
        return ended == len(wg.workers)

    def stop(self, patience_s: float) -> bool:
        """Stop a running training function on every worker at its next report or checkpoint,
        keeping the workers. Workers that do not stop within ``patience_s`` seconds (a long
        step, a collective a stopped peer will not join) are killed; fresh ones start before
        the next run.

        :returns: whether the workers stopped by themselves (and are kept).
        """
        self._end_rounds()
        self._inputs.run_ended()
        wg = self.worker_group
        if wg is None:
            return True
        stopped = len(idle_survivors(wg, patience_s)) == len(wg.workers)
        if stopped:
            self._dirty = False
            return True
        logger.warning("the training function did not stop within %.3gs; killing the workers "
                       "(fresh ones start before the next run)", patience_s)
        self._dirty = True
        wg.stop_actors(patience_s=0)
        return False

    def shutdown(self) -> None:
        self._end_rounds()
        self._inputs.shutdown()
        self._sent_once.clear()
        if self.worker_group is not None:
            wg, self.worker_group = self.worker_group, None
            # A group that failed, or was stopped mid-run, is never kept for another.
            wg.shutdown(keep=not self._dirty)
        self.backend = None


#: The name of this class before it implemented the worker-group protocol.
BackendExecutor = ActorGroup



#: After a worker died, how long the others get to end their run (they are asked to stop at
#: their next report; one whose collective lost its peer fails at once) before they are
#: replaced too; each run that ends meanwhile gives the rest this long again, since a failure
#: spreads through a process group one rank at a time (see sgd.backend.on_worker_run_error).
#: Only for backends that keep survivors (:meth:`sgd.Backend.keeps_survivors`).
SURVIVOR_PATIENCE_S = float(os.environ.get("SGD_SURVIVOR_PATIENCE_S", "5"))
#: After a run failed (an error in a training function), how long the other workers get to end
#: their run (they are asked to stop at their next report) before every worker is killed. If all
#: end in time, and the backend keeps survivors, the processes serve the next run. Runs end within
#: milliseconds on an idle machine; 0.5 s was too short on a loaded one (the peer of a failed
#: torch rank left its collective later), and the wait is paid only when some run does not end.
FAILED_RUN_PATIENCE_S = float(os.environ.get("SGD_FAILED_RUN_PATIENCE_S", "2"))
