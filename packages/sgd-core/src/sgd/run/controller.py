"""One owner for a run's lifecycle: start the group, start training, collect rounds, decide
on failure, resize, finish.

:class:`RunController` drives a worker group (:class:`sgd.group.protocol.RunGroup`: Ray
actors, the driver's own process, or a fake in tests) for as long as its workers are up.
:meth:`RunController.start` starts the group; :meth:`RunController.begin` starts one run and
returns its :class:`ActiveRun`, a state machine with one step function
(:meth:`ActiveRun._step`)::

    Starting ──► Running ──► Finished
        │          │  ▲  └──► Failing ──► Errored      (or Stopped, by TrainingIterator.stop)
        │          ▼  │
        └──► Restarting / Resizing

The group *returns* what happened (a :class:`~sgd.group.status.Poll`, a
:class:`~sgd.group.status.Health`, a failed step's error) and every decision comes from a
policy (:mod:`sgd.run.policies`) that returns it: the :class:`FailurePolicy` (the only retry
counter) for any failure at any phase, the :class:`ScalingPolicy` for draining hosts and
elastic growth. Each state is an object that carries its data (the failure being retried,
the resize decided). Only the API's edge (:meth:`ActiveRun.next`, :meth:`RunController.start`)
raises, for the user.

What a run needs is a :class:`~sgd.run.spec.RunSpec`; starting its functions and recovering
from a failure is :mod:`sgd.run.recovery`'s part of :class:`ActiveRun`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from sgd._common.nodes import NodeInfo
from sgd._common.protocol import Round
from sgd.checkpoint import SHARDED_KEY
from sgd.group.protocol import RunGroup
from sgd.group.status import Poll, PollKind
from sgd.plugins.manager import core_only
from sgd.run.delivery import Delivery
from sgd.run.health import STACKS_CHECK_INTERVAL_S, answer_stacks_request, hang_error
from sgd.run.policies import ClusterView, Failure, FailurePolicy, Raise, Resize, ScalingPolicy, Wait
from sgd.run.recovery import _Recovery
from sgd.run.spec import RunSpec, new_run_spec
from sgd.run.states import (
    _ENDED,
    Ended,
    Failing,
    Reforming,
    Resizing,
    Restarting,
    Running,
    RunState,
    Starting,
    State,
)
from sgd.run.telling import RunEvents

logger = logging.getLogger("sgd")

#: A draining host is left this many seconds before its deadline when no checkpoint came.
DRAIN_MARGIN_S = float(os.environ.get("SGD_DRAIN_MARGIN_S", "5"))
#: How often (at most) an elastic group below its max looks for room, after a checkpoint.
GROW_CHECK_INTERVAL_S = float(os.environ.get("SGD_ELASTIC_GROW_CHECK_S", "5"))
#: The controller polls the group in slices this long (seconds): between them it reads the
#: hosts' health, the hang watchdog and ``sgd stacks`` requests, and a signal (Ctrl-C) gets through.
POLL_SLICE_S = 1.0


class RunController:
    """Owns a trainer's worker group from ``start`` to ``shutdown`` and each run on it.

    :param group: the worker group (:class:`sgd.group.protocol.RunGroup`).
    :param max_retries: deaths recovered from while the group starts (each run brings its own
        limit in its :class:`RunSpec`); ``-1``: unlimited.
    :param hang_timeout_s: the hang watchdog's timeout; ``None``: off.
    :param failure_policy: the retry counter; by default a :class:`FailurePolicy`.
    :param scaling_policy: sizes the group; by default a :class:`ScalingPolicy` over the
        group's ``[min_workers, max_workers]``.
    """

    def __init__(self, group: RunGroup, max_retries: int, hang_timeout_s: Optional[float] = None,
                 failure_policy: Optional[FailurePolicy] = None, scaling_policy: Optional[ScalingPolicy] = None):
        self.group = group
        self.hang_timeout_s = hang_timeout_s
        #: the only retry counter: every failure of the group's start and of each run is
        #: decided (and counted) here; ``attempt`` tells anyone else where it stands.
        self.failures = failure_policy if failure_policy is not None else FailurePolicy(max_retries)
        self.scaling = scaling_policy if scaling_policy is not None else ScalingPolicy(
            group.min_workers, group.max_workers)

    @property
    def executor(self) -> RunGroup:
        """The group (this attribute's name before the worker-group protocol)."""
        return self.group

    @property
    def worker_group(self) -> Any:
        return getattr(self.group, "worker_group", None)

    @property
    def attempt(self) -> int:
        """Failures retried so far in the current scope (the group's start, or the current run)."""
        return self.failures.failures

    def start(
        self,
        initialization_hook: Optional[Callable[[], Any]] = None,
        actor_cls: Optional[type] = None,
        actor_cls_args: Optional[tuple] = None,
        actor_cls_kwargs: Optional[dict] = None,
    ) -> Any:
        """Start the group (hook and backend setup included), retrying worker deaths.

        :raises TrainingFailedError: workers kept dying past ``max_retries``.
        :raises Exception: a failure the policy does not retry (a user's error in the hook).
        """
        self.failures.reset()
        while True:
            error = self.group.start(initialization_hook, actor_cls, actor_cls_args, actor_cls_kwargs)
            if error is None:
                return self.worker_group
            decision = self.failures.decide(Failure(error, "starting the workers"))
            if isinstance(decision, Raise):
                raise decision.error

    def begin(self, spec: RunSpec) -> ActiveRun:
        """Start one run. Never raises for a failure of the run itself: that comes out of
        :meth:`ActiveRun.next`."""
        self.failures.reset(spec.max_retries, retry_worker_errors=spec.retry_worker_errors)
        return ActiveRun(self, spec)

    def shutdown(self) -> None:
        self.group.shutdown()


class ActiveRun(_Recovery):
    """One run on a controller's group: rounds in, results out, failures decided."""

    def __init__(self, controller: RunController, spec: RunSpec):
        self._group = controller.group
        self._controller: RunController = controller
        self._spec = spec
        self._manager = spec.manager
        self._hook = controller.group.hook
        self._hang_timeout_s = controller.hang_timeout_s
        self._run_info = dict(spec.run_info, callbacks=list(spec.callbacks))
        self._delivery = Delivery(spec.run_dir, spec.manager, self._hand_out, self._after_checkpoint)
        #: rounds a poll handed over in one burst (:attr:`Poll.more`), not yet delivered
        self._burst: Deque[Round] = deque()
        initial = spec.checkpoint
        self._readable = [initial[SHARDED_KEY]] if isinstance(initial, dict) and SHARDED_KEY in initial else []
        # Between rounds: the drain being acted on, a resize decided after a checkpoint (done
        # before the next round), the next time an elastic group looks for room to grow.
        self._next_stacks_check = 0.0
        self._drain: Optional[Dict[str, NodeInfo]] = None
        self._drain_waits_logged = False
        self._resize: Optional[Resize] = None
        self._next_grow_check = time.monotonic() + GROW_CHECK_INTERVAL_S
        self.returns: Optional[List[Any]] = None
        #: every state the run went through, in order (tests and ``sgd`` debugging read it)
        self.transitions: List[RunState] = []
        #: the same, with each state's data
        self.history: List[State] = []
        resumed = self._delivery.delivered_iteration > 0
        #: the run's event log (events.jsonl): what happened, written where it is decided
        self.events = RunEvents(spec.run_dir.events, controller.group)
        spec.manager.events = spec.run_dir.events
        if hasattr(controller.group, "events"):
            controller.group.events = self.events
        self.events.run_started(spec.run_dir.attempt, controller.group.num_workers,
                                self._delivery.delivered_iteration, spec.run_dir.previous)
        self._before_reform: List[Dict[str, Any]] = []
        self._to(Starting())
        for cb in spec.callbacks:
            cb.start_training(logdir=str(spec.run_dir.path), config=spec.config, resumed=resumed,
                              start_iteration=self._delivery.delivered_iteration)
        try:
            error = self._launch(spec.checkpoint, self._manager.latest_iteration if spec.checkpoint else 0)
        except KeyboardInterrupt as exc:
            self.finish(error=True, exc=exc)
            raise
        self._to(Running() if error is None else Starting(error))

    @property
    def state(self) -> RunState:
        return self.transitions[-1]

    @property
    def finished(self) -> bool:
        return self.state in _ENDED

    def _to(self, state: State) -> None:
        logger.debug("run %s: %s", self._spec.run_dir.path.name, state.kind.value)
        if self.transitions and self.transitions[-1] is state.kind and state.kind is RunState.STARTING:
            self.history[-1] = state  # the start's outcome, not a new state
            return
        previous = self.transitions[-1] if self.transitions else None
        self.transitions.append(state.kind)
        self.history.append(state)
        self._tell(state, previous)
        if state.kind is not RunState.RUNNING:
            self._burst.clear()  # a restart replays those rounds; a stop or failure drops them

    def _tell(self, state: State, previous: Optional[RunState]) -> None:
        """The event log's part of a change of state: a start, a re-form, a resize, the end."""
        if isinstance(state, Running):
            if previous is RunState.REFORMING:
                reforming = self.history[-2]
                self.events.reformed(self._before_reform, getattr(reforming, "attempt", 0))
            else:
                loaded = self._manager.loaded_from if self._launched_with is not None else None
                self.events.attempt_started(self._launched_at, loaded.name if loaded is not None else None)
        elif isinstance(state, Resizing):
            self.events.resize(state.resize.num_workers, state.resize.reason)
        elif isinstance(state, Reforming):
            self._before_reform = self.events.workers()
        elif isinstance(state, Ended):
            self.events.ended(state.kind, state.error, isinstance(state.error, (KeyboardInterrupt, SystemExit)))

    # --- between rounds: hosts, hangs, room to grow -------------------------------------------

    def _between_rounds(self, poll: Poll) -> None:
        """After each poll: ``sgd stacks`` asking, the hang watchdog (after an idle poll), and
        the hosts' health (the group reads the cluster at most every few seconds): a host Ray
        declared dead fails the run now; a draining host is announced to every worker and the
        group leaves it at the next checkpoint, or shortly before its deadline."""
        now = time.monotonic()
        group = self._group
        if now >= self._next_stacks_check:
            self._next_stacks_check = now + STACKS_CHECK_INTERVAL_S
            answer_stacks_request(self._spec.run_dir.path, lambda: group.stacks(timeout_s=5.0))
        timeout = self._hang_timeout_s
        if poll.kind is PollKind.IDLE and timeout is not None and now - poll.last_progress >= timeout:
            hung = hang_error(timeout, poll.progress, group.stacks(timeout_s=5.0))
            self.events.hang(hung, timeout)
            self._fail(hung, "training")
            return
        health = group.health()
        if health.lost is not None:
            self.events.host_lost(health.lost)
            self._fail(health.lost, "training")
            return
        if not health.draining:
            self._grow_in_place(now)
            return
        if self._drain is None:
            self._drain = dict(health.draining)
            self.events.drain_notice(self._drain)
            group.announce_drain(self._drain)
        deadline = min(n.drain_deadline or math.inf for n in self._drain.values())
        if time.time() >= deadline - DRAIN_MARGIN_S:
            view = ClusterView(group.room(), self._drain, deadline_near=True)
            decision = self._controller.scaling.decide(view, group.num_workers)
            if isinstance(decision, Resize):
                self._resize = decision

    def _grow_in_place(self, now: float) -> None:
        """A run that recovers in place (sgd.elastic) grows without a restart: when an elastic
        group below its max finds room (looked for at most every ``GROW_CHECK_INTERVAL_S``), the
        new workers start while training goes on and join at the next commit."""
        group, scaling = self._group, self._controller.scaling
        if (not scaling.elastic or group.num_workers >= scaling.max_workers or now < self._next_grow_check
                or not group.recovers_in_place):
            return
        self._next_grow_check = now + GROW_CHECK_INTERVAL_S
        decision = scaling.decide(ClusterView(group.room()), group.num_workers)
        if isinstance(decision, Resize) and decision.num_workers > group.num_workers:
            failed = group.grow(decision.num_workers - group.num_workers)
            if failed is not None:
                logger.info("elastic: could not grow the group now (%s); trying again later", failed)

    def _after_checkpoint(self) -> None:
        """A checkpoint was just committed (the workers wait for its acknowledgement): ask the
        scaling policy whether to leave a draining host or grow an elastic group. A resize is
        carried out before the next round."""
        group, scaling = self._group, self._controller.scaling
        if self._drain is None:
            if not scaling.elastic or group.num_workers >= scaling.max_workers or group.recovers_in_place:
                return  # nothing could change: no need to read the cluster
            now = time.monotonic()
            if now < self._next_grow_check:
                return
            self._next_grow_check = now + GROW_CHECK_INTERVAL_S
        decision = scaling.decide(ClusterView(group.room(), self._drain or {}), group.num_workers)
        if isinstance(decision, Resize):
            self._resize = decision
        elif isinstance(decision, Wait) and not self._drain_waits_logged:
            self._drain_waits_logged = True
            logger.warning("%s", decision.reason)

    # --- the step function -----------------------------------------------------------------

    def next(self) -> Optional[List[Dict[str, Any]]]:
        """The next report round (one dict per worker), or ``None`` once the run finished.

        :raises TrainingFailedError: workers died more often than ``max_retries`` allows.
        :raises Exception: a worker's exception, with its own type (see :class:`sgd.WorkerError`):
            at once, or, in a run that retries them (``RunSpec.retry_worker_errors``), the
            last one once the retries ran out.
        """
        if self.finished:
            return None
        try:
            while True:
                results = self._step()
                if results is not None or self.finished:
                    return results
                failing = self.history[-1]
                if isinstance(failing, Failing):
                    self.finish(error=True, exc=failing.error)
                    raise failing.error
        except BaseException as exc:
            self.finish(error=True, exc=exc)
            raise

    def _step(self) -> Optional[List[Dict[str, Any]]]:
        """One step of the state machine: a delivered round's results, or ``None`` (a state
        changed, or the round had nothing to hand out)."""
        state = self.history[-1]
        if isinstance(state, Starting):
            assert state.error is not None
            self._fail(state.error, "starting the run")
        elif isinstance(state, Restarting):
            self._recover(state.failure.error)
        elif isinstance(state, Reforming):
            failed = self._group.reform(state.barrier, self._delivery.delivered_iteration)
            if failed is None:
                self._to(Running())
            else:
                # Not counted again: the same loss, now recovered the old way.
                logger.warning("re-forming the group in place failed (%s); restarting every worker from the "
                               "latest checkpoint", failed)
                self._to(Restarting(Failure(failed, "re-forming the group in place"), state.attempt))
        elif isinstance(state, Resizing):
            logger.warning("%s; restarting %d workers from the latest checkpoint (not a failure)",
                           state.resize.reason, state.resize.num_workers)
            self._recover(None, state.resize)
        elif isinstance(state, Running):
            if self._resize is not None:
                resize, self._resize = self._resize, None
                self._to(Resizing(resize))
                return None
            if self._burst:
                # The rest of a burst: delivered one round per step, flushed with its last.
                round_ = self._burst.popleft()
                return self._delivery.deliver(round_, flush=not self._burst)
            poll = self._group.poll(POLL_SLICE_S)
            if poll.kind is PollKind.ROUND:
                assert poll.round is not None
                self._burst.extend(poll.more)
                results = self._delivery.deliver(poll.round, flush=not self._burst)
            elif poll.kind is PollKind.FINISHED:
                self.returns = poll.returns
                self._delivery.commit_pending(final=True)
                self.finish(error=False)
                return None
            elif poll.kind in (PollKind.ERROR, PollKind.DIED):
                assert poll.error is not None
                self._fail(poll.error, "training")
                return None
            elif poll.kind is PollKind.RESET:
                assert poll.barrier is not None
                self._reset(poll.barrier)
                return None
            else:
                results = None
            self._between_rounds(poll)
            return results
        return None

    # --- rounds --------------------------------------------------------------------------------

    def _hand_out(self, results: List[Dict[str, Any]]) -> None:
        # The plugins' implementations, then sgd-core's, which hands the round to the callbacks.
        hook = self._hook.sgd_handle_result
        hook = core_only(hook) or hook
        hook(results=results, run_info=self._run_info)

    def checkpoint_for(self, iteration: int) -> Optional[Path]:
        """The kept checkpoint filed under report ``iteration`` (see :meth:`Delivery.file_under`)."""
        return self._manager.checkpoint_for(iteration)

    # --- the end ----------------------------------------------------------------------------------

    def stop(self, patience_s: float) -> None:
        """End the run now as ``STOPPED``: the training functions stop at their next report or
        checkpoint (workers that do not within ``patience_s`` are killed); the callbacks
        finish without error. Rounds not yet delivered are dropped."""
        if self.finished:
            return
        self._to(Ended(RunState.STOPPED))
        self._spec.run_dir.close(False, stopped=True)
        self._group.stop(patience_s)
        self._manager.remove_temporary()
        for cb in self._spec.callbacks:
            cb.finish_training(error=False)

    def finish(self, error: bool, exc: Optional[BaseException] = None) -> None:
        """End the run once: close the run directory, release or stop the workers, tell the callbacks."""
        if self.finished:
            return
        self._to(Ended(RunState.ERRORED if error else RunState.FINISHED, exc))
        # Ctrl-C, or the driver's thread told to exit (sys.exit: Ray Tune stopping the trial whose
        # thread runs fit(), from inside a callback's tune.report): the run was cut short, not failed.
        self._spec.run_dir.close(error, interrupted=isinstance(exc, (KeyboardInterrupt, SystemExit)))
        self._group.end(ok=not error, error=exc)
        self._manager.remove_temporary()
        for cb in self._spec.callbacks:
            try:
                cb.finish_training(error=error)
            except Exception:
                if not error:
                    raise
                logger.exception("callback %r failed in finish_training", cb)


__all__: Tuple[str, ...] = ("ActiveRun", "RunController", "RunSpec", "RunState", "new_run_spec")
