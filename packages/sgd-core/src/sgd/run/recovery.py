"""Starting a run's training functions, and recovering when that or the run fails.

Each failure goes to the controller's :class:`~sgd.run.policies.FailurePolicy`, whose decision is
the run's next state: ``Restarting`` (the group replaced, the run started again from the latest
checkpoint), ``Reforming`` (in place, :mod:`sgd.elastic`) or ``Failing``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Protocol

from sgd._common.nodes import NodeInfo
from sgd._common.protocol import CheckpointTarget
from sgd.errors import ResourcesUnavailableError, TrainingFailedError
from sgd.group.protocol import RunGroup, RunRequest
from sgd.group.status import Barrier
from sgd.run.delivery import Delivery
from sgd.run.policies import Failure, FailurePolicy, Raise, Resize
from sgd.run.spec import RunSpec
from sgd.run.states import Failing, Reforming, Restarting, Running, State
from sgd.run.telling import RunEvents
from sgd.storage.manager import CheckpointManager


class _Controller(Protocol):
    """What recovering asks of the run's controller: its failure policy."""

    failures: FailurePolicy


class _Recovery:
    """The starting and recovering part of :class:`sgd.run.controller.ActiveRun` (a mixin: the
    run's ``__init__`` sets these)."""

    _group: RunGroup
    _controller: _Controller
    _spec: RunSpec
    _manager: CheckpointManager
    _delivery: Delivery
    _readable: List[str]
    _drain: Optional[Dict[str, NodeInfo]]
    _drain_waits_logged: bool
    events: RunEvents
    #: the checkpoint state the training functions were last started from (``None``: none)
    _launched_with: Optional[dict] = None
    #: the report count the training functions were last started at
    _launched_at: int = 0

    if TYPE_CHECKING:
        def _to(self, state: State) -> None: ...

    def _launch(self, checkpoint: Optional[dict], start_iteration: int) -> Optional[BaseException]:
        """Start the training functions (replacing the group first when its last run did not
        end cleanly); the failure to, or ``None``."""
        group, spec = self._group, self._spec
        if group.needs_restart:
            error = group.restart(None)
            if error is not None:
                return error
        # Every worker writes its checkpoints into the run's checkpoint folder and sends the path.
        target = CheckpointTarget(str(self._manager.checkpoint_dir), self._manager.codec,
                                  self._manager.strategy.checkpoint_score_attribute,
                                  durable=self._manager.strategy.num_to_keep != 0)
        self._delivery.restarted(start_iteration)
        self._drain, self._drain_waits_logged = None, False
        self._launched_with, self._launched_at = checkpoint, start_iteration
        return group.begin(RunRequest(
            train_func=spec.train_func, checkpoint=checkpoint, dataset=spec.dataset,
            dataset_config=spec.dataset_config, start_iteration=start_iteration, checkpoint_target=target,
            run_info=dict(spec.worker_run_info), writable=[str(spec.run_dir.path)], readable=self._readable,
        ))

    def _fail(self, error: BaseException, phase: str) -> None:
        """Tell the callbacks, ask the failure policy; the next state is its decision:
        Restarting or Failing."""
        self._tell_failure(error, phase)
        failure = Failure(error, phase)
        decision = self._controller.failures.decide(failure)
        if isinstance(decision, Raise):
            self._to(Failing(decision.error))
        else:
            self._to(Restarting(failure, decision.attempt))

    def _reset(self, barrier: Barrier) -> None:
        """Every worker left waits at the reset barrier (sgd.elastic): after a loss the failure
        policy decides (an in-place recovery counts against ``max_retries``); a sync re-forms
        at once."""
        failure = barrier.failure
        if failure is None:
            self._to(Reforming(barrier, 0))
            return
        self._tell_failure(failure, "training", barrier)
        decision = self._controller.failures.decide(Failure(failure, "training"))
        if isinstance(decision, Raise):
            self._to(Failing(decision.error))
        else:
            self._to(Reforming(barrier, decision.attempt))

    def _tell_failure(self, error: BaseException, phase: str, barrier: Optional[Barrier] = None) -> None:
        """The event log, then ``handle_failure`` of every callback that has one (Ray 2.x's
        ``after_exception`` is called from it), before the policy decides: a failure that is then
        retried is told too."""
        if barrier is not None and barrier.gone:
            self.events.barrier_failures(barrier)
        else:
            self.events.worker_failed(error, phase)
        for callback in self._spec.callbacks:
            handle = getattr(callback, "handle_failure", None)
            if handle is not None:
                handle(error, phase=phase)

    def _recover(self, error: Optional[BaseException], resize: Optional[Resize] = None) -> None:
        """Replace the group (after ``error``, or placed anew by ``resize``) and start the run
        again from the latest checkpoint; a failure on the way is decided like any other."""
        if (getattr(error, "lost_every_worker", False) and self._spec.checkpoint is None
                and self._manager.restorable(decode=False) is None):
            # A run that recovers in place (sgd.elastic) keeps its state in the workers' memory:
            # with all of them gone and no checkpoint, starting over would silently lose it all.
            given_up = TrainingFailedError(
                f"{error}; the run kept its state in the workers' memory (sgd.elastic) and saved no checkpoint "
                "to restart from. Report a checkpoint from time to time (sgd.report(metrics, checkpoint=...)) so "
                "that losing every worker at once resumes from it.")
            given_up.__cause__ = error
            self._to(Failing(given_up))
            return
        failed = self._group.restart(error, size=resize.num_workers if resize is not None else None,
                                     move=resize is not None)
        if isinstance(failed, ResourcesUnavailableError):
            wrapped = ResourcesUnavailableError(
                f"{failed} Every result and checkpoint reported so far is kept in {self._spec.run_dir.path}; "
                "resume it with sgd.Trainer.restore(run_dir) once the cluster has room.")
            wrapped.__cause__ = failed
            failed = wrapped
        if failed is None:
            self._manager.remove_temporary()  # the old workers are gone, mid-write or not
            # Read and verified, not decoded: the workers decode it (they have the framework its
            # codec needs; a cold import on the driver cost a restart 1.2 s).
            state = self._manager.restorable(decode=False)
            checkpoint = state if state is not None else self._spec.checkpoint
            iteration = self._manager.latest_iteration if state is not None else 0
            loaded = self._manager.loaded_from
            self.events.restart(
                None if error is None else self._controller.failures.failures,
                self._controller.failures.max_retries, loaded.name if state is not None and loaded else None,
                iteration, self._group.num_workers)
            failed = self._launch(checkpoint, iteration)
        if failed is not None:
            self._fail(failed, "restarting")
        else:
            self._to(Running())
