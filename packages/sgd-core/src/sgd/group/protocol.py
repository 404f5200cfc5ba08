"""The worker-group protocol: everything the run controller asks of a group of workers.

Three implementations:

- :class:`sgd.group.actors.ActorGroup`: Ray actors in a placement group (``num_workers >= 1``);
- :class:`sgd.group.in_process.InProcessGroup`: one "worker", a thread of the driver's process
  (``num_workers=0``, local mode);
- :class:`sgd_testing.FakeGroup`: a scripted group for tests, without Ray: a plugin author (or
  sgd's own unit tests) steps the controller through deaths, drains and hangs with it.

The rule that makes the controller testable: a group *returns* what happened. A step that can
fail returns the failure (``None`` when it went well); :meth:`RunGroup.poll` returns a
:class:`~sgd.group.status.Poll`; :meth:`RunGroup.health` a :class:`~sgd.group.status.Health`.
Only ``KeyboardInterrupt`` (and bugs) propagate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from sgd._common.nodes import NodeInfo
from sgd._common.protocol import CheckpointTarget
from sgd.group.status import Barrier, Health, Poll

try:
    from typing import Protocol, runtime_checkable
except ImportError:  # pragma: no cover - Python < 3.8
    from typing_extensions import Protocol, runtime_checkable  # type: ignore[assignment]


@dataclass
class RunRequest:
    """One run to start on a group (:meth:`RunGroup.begin`).

    :ivar train_func: called with no arguments on every worker.
    :ivar checkpoint: what ``sgd.get_checkpoint()`` returns on the workers.
    :ivar dataset: the run's dataset(s), split for the group's size by the group.
    :ivar start_iteration: the report the workers' count starts after (a resumed run).
    :ivar checkpoint_target: the run's checkpoint folder (and codec, score attribute) every
        worker writes its checkpoints into: directly on the driver's host, through the run's file
        server from another (:mod:`sgd.storage.staging`).
    :ivar run_info: what ``sgd.get_context()`` tells the workers about the run.
    :ivar writable: folders on the driver a worker on another host may write (the run
        directory); :ivar readable: files or folders it may read (a sharded checkpoint).
    """

    train_func: Callable[[], Any]
    checkpoint: Optional[dict] = None
    dataset: Any = None
    dataset_config: Any = None
    start_iteration: int = 0
    checkpoint_target: Optional[CheckpointTarget] = None
    run_info: Dict[str, Any] = field(default_factory=dict)
    writable: Sequence[str] = ()
    readable: Sequence[str] = ()


@runtime_checkable
class RunGroup(Protocol):
    """A group of workers that runs one training function at a time."""

    #: the trainer's plugin hooks (``pluggy``'s ``pm.hook``)
    hook: Any
    #: the group's size now, and its bounds (equal for a fixed-size group)
    num_workers: int
    min_workers: int
    max_workers: int

    def start(self, initialization_hook: Optional[Callable[[], Any]] = None, actor_cls: Optional[type] = None,
              actor_cls_args: Optional[tuple] = None,
              actor_cls_kwargs: Optional[dict] = None) -> Optional[BaseException]:
        """Start the workers, run ``initialization_hook`` on each, set the backend up. One
        attempt; on failure nothing is left running and the failure is returned."""

    def begin(self, request: RunRequest) -> Optional[BaseException]:
        """Start a training function on every worker; the failure to do so, or ``None``.
        Deaths after the start come out of :meth:`poll`."""

    def poll(self, timeout_s: float) -> Poll:
        """The run's next event: a round, the end, a failure, or idle after ``timeout_s``."""

    def health(self) -> Health:
        """The group's hosts: one declared dead, the draining ones. Cheap to call often: an
        implementation reads the cluster at most once a few seconds."""

    def announce_drain(self, draining: Dict[str, NodeInfo]) -> None:
        """Tell every worker that hosts are draining (``sgd.get_context().preemption``)."""

    def room(self) -> int:
        """How many workers fit now if the group were placed anew (its own count as free;
        lost and draining hosts left out)."""

    @property
    def needs_restart(self) -> bool:
        """Whether the last run did not end cleanly (the framework's state is unknown)."""

    def restart(self, error: Optional[BaseException], size: Optional[int] = None,
                move: bool = False) -> Optional[BaseException]:
        """Replace the workers after ``error`` (``None``: a clean replacement, as after an
        unclean end), or with ``move`` place the group anew at ``size`` (a resize). The
        failure to do so, or ``None``."""

    def reform(self, barrier: Barrier, iteration: int) -> Optional[BaseException]:
        """Re-form the group in place around the workers waiting at ``barrier`` (a
        :data:`~sgd.group.status.PollKind.RESET` poll; :mod:`sgd.elastic`): survivors keep
        their processes, the runs go on. ``iteration``: the reports delivered so far. The
        failure to do so (the controller then restarts every worker), or ``None``. A group
        that never polls ``RESET`` may return a failure."""

    @property
    def recovers_in_place(self) -> bool:
        """Whether the current run recovers in place (it entered ``sgd.elastic.run`` and the
        backend can re-form the group): a loss or growth then re-forms it (:meth:`reform`)."""

    def grow(self, count: int) -> Optional[BaseException]:
        """Start ``count`` more workers for the current in-place run; they join at its next
        reset, which the group asks for (a ``RESET`` poll follows). The failure, or ``None``."""

    def stacks(self, timeout_s: float = 10.0, include_idle: bool = False) -> List[str]:
        """Every worker's Python stacks, one string per worker in rank order."""

    def end(self, ok: bool, error: Optional[BaseException] = None) -> None:
        """Close a run. On failure, the workers stay only if every run ends at once and the
        backend can be set up again in live processes; otherwise every worker is stopped."""

    def stop(self, patience_s: float) -> bool:
        """Stop a running function at its next report; whether every worker stopped in time."""

    def shutdown(self) -> None:
        """Stop the workers for good and release what they hold."""


__all__ = ["RunGroup", "RunRequest"]
