"""Driver side of training: owns the WorkerGroup and the backend lifecycle,
starts runs and turns the workers' result batches into rounds.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import ray
from ray.exceptions import RayActorError

from sgd._internal.session import CHECKPOINT, DEFAULT_MAX_PENDING, DirectWrite, RemoteError
from sgd._internal.unsendable import recover_poll
from sgd._internal.utils import ensure_ray
from sgd.backend import BackendConfig
from sgd.plugins import get_plugin_manager
from sgd.worker_group import WorkerGroup

logger = logging.getLogger("sgd")

#: Most items one poll returns.
POLL_BATCH = 4096
#: After a worker error, how long to collect the reports other workers had already made.
ERROR_DRAIN_S = 1.0
#: An error that reads like a peer's death (its collective lost the connection) is held this
#: long while the driver watches for the death itself, which restarts the group instead.
PEER_FAILURE_GRACE_S = float(os.environ.get("SGD_PEER_FAILURE_GRACE_S", "10"))
_PEER_FAILURE = re.compile(
    r"connection (reset|closed) by peer|broken pipe|connection refused|socket closed|"
    r"communicator was aborted|nccl.*(remote|abort|error)|gloo/transport|gloo.*(timed out|timeout|connect)|"
    r"DistBackendError",
    re.IGNORECASE,
)


def looks_like_peer_failure(err: RemoteError) -> bool:
    """Whether a worker's error is what a collective raises when another worker died."""
    return bool(_PEER_FAILURE.search(f"{err.type_name}: {err.message}"))


class TrainingFailedError(RuntimeError):
    """Training could not finish: a worker died, or failures outlasted ``max_retries``."""


class WorkerDiedError(TrainingFailedError):
    """A worker process died (killed, crashed, node lost) during a run."""

    def __init__(self, message: str, world_rank: int):
        super().__init__(message)
        self.world_rank = world_rank


class WorkerError(RuntimeError):
    """The remote side of a user exception: rank, process and traceback.

    Attached as ``__cause__`` of the re-raised original exception, or raised
    itself when the original could not be sent to the driver.
    """

    def __init__(self, message: str, world_rank: int, remote_traceback: str):
        super().__init__(message)
        self.world_rank = world_rank
        self.remote_traceback = remote_traceback


def _raise_remote(err: RemoteError) -> None:
    head = f"worker rank {err.world_rank} (pid {err.pid} on {err.hostname}) raised {err.type_name}: {err.message}"
    cause = WorkerError(f"{head}\n\nRemote traceback:\n{err.traceback}", err.world_rank, err.traceback)
    exc: Optional[BaseException] = None
    if err.exc_bytes is not None:
        import ray.cloudpickle as cloudpickle

        try:
            exc = cloudpickle.loads(err.exc_bytes)
        except Exception:
            exc = None
    if exc is None:
        raise cause
    if hasattr(exc, "add_note"):
        exc.add_note(f"[sgd] raised on {head.split(' raised ')[0]}; remote traceback above")
    exc.sgd_world_rank = err.world_rank  # type: ignore[attr-defined]
    raise exc from cause


class RunState:
    """Collects per-worker batches into rounds (one item per worker), in order."""

    def __init__(self, workers: List[Any]):
        n = len(workers)
        self._workers = workers
        self._pending: List[Deque[Tuple[str, Any]]] = [deque() for _ in range(n)]
        self._done = [False] * n
        self._kind_counts: List[Dict[str, int]] = [{} for _ in range(n)]
        self.returns: List[Any] = [None] * n
        self._error: Optional[RemoteError] = None
        self._drain_deadline = 0.0
        self._inflight: Dict[ray.ObjectRef, int] = {}
        # One open call per worker that errors as soon as its process dies, so a
        # death is seen even while the driver waits on another worker's poll.
        self._watches: Dict[ray.ObjectRef, int] = {w._sgd_watch.remote(): i for i, w in enumerate(workers)}

    def next_round(self) -> Optional[Tuple[str, List[Any]]]:
        """The next round as ``(kind, [data per worker])``, or ``None`` when every worker finished.

        When a worker raised, the rounds every worker had already reported are still
        returned (callbacks see them), then the error is raised.
        """
        while True:
            if all(self._pending):
                items = [p.popleft() for p in self._pending]
                kinds = {k for k, _ in items}
                if len(kinds) > 1 and self._error is None:
                    self._mismatch_kinds(items)
                return items[0][0], [d for _, d in items]
            if self._error is not None:
                self._drain_or_raise()
                continue
            if all(self._done):
                if any(self._pending):
                    self._mismatch()
                return None
            if any(self._done[i] and not self._pending[i] for i in range(len(self._pending))) and any(
                self._pending
            ):
                self._mismatch()
            for i, worker in enumerate(self._workers):
                if not self._pending[i] and not self._done[i] and i not in self._inflight.values():
                    self._inflight[worker._sgd_poll.remote(POLL_BATCH)] = i
            ready, _ = ray.wait(list(self._inflight) + list(self._watches), num_returns=1)
            for ref in ready:
                if ref in self._watches:
                    i = self._watches.pop(ref)
                    try:
                        ray.get(ref)
                    except RayActorError as exc:
                        raise WorkerDiedError(f"worker rank {i} died: {_short(exc)}", i) from exc
                    continue
                i = self._inflight.pop(ref)
                try:
                    batch, finished, value, error = ray.get(ref)
                except RayActorError as exc:
                    raise WorkerDiedError(f"worker rank {i} died: {_short(exc)}", i) from exc
                except TypeError as exc:  # a reported value that cannot be pickled
                    batch, finished, value, error = recover_poll(self._workers[i], exc)
                if error is not None and self._error is None:
                    self._error = error
                    self._drain_deadline = time.monotonic() + ERROR_DRAIN_S
                counts = self._kind_counts[i]
                for kind, _ in batch:
                    counts[kind] = counts.get(kind, 0) + 1
                self._pending[i].extend(batch)
                if finished:
                    self._done[i] = True
                    self.returns[i] = value

    def _drain_or_raise(self) -> None:
        """After a worker error: collect reports the others had already made (briefly: a
        worker blocked in a collective will make none), or raise the error."""
        assert self._error is not None
        waiting = [i for i, p in enumerate(self._pending) if not p]
        if any(self._done[i] for i in waiting):
            self._raise_error()  # a finished worker has nothing more: no round can form
        for i in waiting:
            if i not in self._inflight.values():
                self._inflight[self._workers[i]._sgd_poll.remote(POLL_BATCH)] = i
        timeout = self._drain_deadline - time.monotonic()
        ready: List[Any] = []
        if timeout > 0:
            ready, _ = ray.wait(list(self._inflight) + list(self._watches), num_returns=1, timeout=timeout)
        if not ready:
            self._raise_error()
        for ref in ready:
            if ref in self._watches:
                self._check_watch(ref)
                continue
            i = self._inflight.pop(ref)
            try:
                batch, finished, value, _ = ray.get(ref)
            except RayActorError as exc:
                raise WorkerDiedError(f"worker rank {i} died: {_short(exc)}", i) from exc
            except TypeError as exc:  # a reported value that cannot be pickled
                batch, finished, value, _ = recover_poll(self._workers[i], exc)
            self._pending[i].extend(batch)
            if finished:
                self._done[i] = True
                self.returns[i] = value

    def _check_watch(self, ref: Any) -> None:
        """A watch call returned: fine if the worker's run ended, a death otherwise."""
        i = self._watches.pop(ref)
        try:
            ray.get(ref)
        except RayActorError as exc:
            raise WorkerDiedError(f"worker rank {i} died: {_short(exc)}", i) from exc

    def _raise_error(self) -> None:
        """Raise the worker's error, unless a worker died: a peer's death makes the others'
        collectives fail ("Connection reset by peer"), and that error can reach the driver
        before the death does. Such an error waits up to ``PEER_FAILURE_GRACE_S`` for it."""
        assert self._error is not None
        grace = PEER_FAILURE_GRACE_S if looks_like_peer_failure(self._error) else 0.0
        deadline = time.monotonic() + grace
        while self._watches:
            ready, _ = ray.wait(list(self._watches), num_returns=1,
                                timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                self._check_watch(ref)
            if time.monotonic() >= deadline:
                break
        _raise_remote(self._error)

    def _describe(self) -> str:
        parts = []
        for i, counts in enumerate(self._kind_counts):
            reports = counts.get("report", 0)
            ckpts = counts.get(CHECKPOINT, 0)
            state = "finished" if self._done[i] else "running"
            parts.append(f"rank {i}: {reports} report(s), {ckpts} checkpoint(s) so far, {state}")
        return "; ".join(parts)

    def _mismatch(self) -> None:
        raise RuntimeError(
            "workers called sgd.report / sgd.save_checkpoint a different number of times "
            f"({self._describe()}). Every worker must report and checkpoint the same number of times."
        )

    def _mismatch_kinds(self, items: List[Tuple[str, Any]]) -> None:
        detail = ", ".join(
            f"rank {i} called {'save_checkpoint' if k == CHECKPOINT else 'report'}" for i, (k, _) in enumerate(items)
        )
        raise RuntimeError(
            f"workers are out of step: {detail} at the same point. Every worker must call "
            "sgd.report and sgd.save_checkpoint in the same order."
        )



def _short(exc: BaseException) -> str:
    """The first line of Ray's (long) actor-death message."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def placeable_workers(
    bundle: Dict[str, float], min_workers: int, max_workers: int, ours: Optional[Dict[str, int]] = None
) -> int:
    """How many workers of ``bundle`` fit in the cluster now, clamped to ``[min_workers, max_workers]``
    (placement then waits for ``min_workers`` if fewer fit).

    :param ours: node id → workers of ours reserved there, about to be released; they count as free.
    """
    from ray._private.state import available_resources_per_node

    need = {k: v for k, v in bundle.items() if v > 0}
    ours = ours or {}
    fit = 0
    for node_id, avail in available_resources_per_node().items():
        held = ours.get(node_id, 0)
        fit += min((int((avail.get(k, 0) + v * held + 1e-9) // v) for k, v in need.items()), default=0)
    return max(min_workers, min(max_workers, fit))


class BackendExecutor:
    """Starts the worker group, sets the backend up through the hooks, runs training."""

    def __init__(
        self,
        backend_config: BackendConfig,
        num_workers: int,
        resources_per_worker: Dict[str, float],
        max_pending: int = DEFAULT_MAX_PENDING,
        min_workers: Optional[int] = None,
        placement_strategy: str = "PACK",
    ):
        self.backend_config = backend_config
        self.placement_strategy = placement_strategy
        self.max_workers = num_workers
        self.min_workers = num_workers if min_workers is None else min_workers
        self.num_workers = num_workers
        self.resources_per_worker = dict(resources_per_worker)
        self.max_pending = max_pending
        self.worker_group: Optional[WorkerGroup] = None
        self._initialization_hook: Optional[Callable[[], Any]] = None
        self._needs_restart = False
        self._backend = backend_config.backend_cls()

    @property
    def hook(self):
        return get_plugin_manager().hook

    def start(
        self,
        initialization_hook: Optional[Callable[[], Any]] = None,
        actor_cls: Optional[type] = None,
        actor_cls_args: Optional[tuple] = None,
        actor_cls_kwargs: Optional[dict] = None,
    ) -> WorkerGroup:
        self._initialization_hook = initialization_hook
        self._actor_cls = (actor_cls, actor_cls_args, actor_cls_kwargs)
        self.worker_group = self._new_worker_group()
        try:
            self._setup()
        except BaseException:
            self.worker_group.shutdown(patience_s=0)
            self.worker_group = None
            raise
        self.worker_group.add_shutdown_hook(self._teardown)
        return self.worker_group

    def _new_worker_group(self, ours: Optional[Dict[str, int]] = None) -> WorkerGroup:
        res = dict(self.resources_per_worker)
        cpus = res.pop("CPU", 0)
        gpus = res.pop("GPU", 0)
        actor_cls, actor_cls_args, actor_cls_kwargs = self._actor_cls
        if self.min_workers != self.max_workers:
            ensure_ray()
            self.num_workers = placeable_workers(self.resources_per_worker, self.min_workers, self.max_workers, ours)
            logger.info("elastic: starting %d workers (min %d, max %d)", self.num_workers,
                        self.min_workers, self.max_workers)
        return WorkerGroup(
            num_workers=self.num_workers,
            num_cpus_per_worker=cpus,
            num_gpus_per_worker=gpus,
            additional_resources_per_worker=res,
            actor_cls=actor_cls,
            actor_cls_args=actor_cls_args,
            actor_cls_kwargs=actor_cls_kwargs,
            preload_modules=tuple(self._backend.preload_modules),
            placement_strategy=self.placement_strategy,
        )

    def _setup(self) -> None:
        assert self.worker_group is not None
        if self._initialization_hook is not None:
            self.worker_group.execute(self._initialization_hook)
        self.hook.sgd_backend_setup(worker_group=self.worker_group, backend_config=self.backend_config)
        self._needs_restart = False

    def _teardown(self, worker_group: WorkerGroup) -> None:
        if self._needs_restart:
            return  # the process group is in an unknown state; killing the actors cleans up
        # Every implementation runs even if one fails: the workers must always be released.
        for impl in reversed(self.hook.sgd_backend_teardown.get_hookimpls()):
            kwargs = {"worker_group": worker_group, "backend_config": self.backend_config}
            try:
                impl.function(**{name: kwargs[name] for name in impl.argnames})
            except Exception:
                logger.exception("sgd_backend_teardown of plugin %r failed", impl.plugin_name)

    def _restart(self) -> None:
        assert self.worker_group is not None
        if self.min_workers == self.max_workers:
            logger.info("restarting %d workers", self.num_workers)
            self.worker_group.restart_actors()
        else:
            # Resize: count what fits with our old reservation released, release it, place anew.
            old = self.worker_group
            ours: Dict[str, int] = {}
            for meta in old.metadata:
                ours[meta.node_id] = ours.get(meta.node_id, 0) + 1
            old.stop_actors()
            old.shutdown(patience_s=0)
            self.worker_group = self._new_worker_group(ours)
            self.worker_group.add_shutdown_hook(self._teardown)
        self._setup()

    def restart(self, error: Optional[BaseException] = None) -> None:
        """Replace every worker (after ``error``) and set the backend up again."""
        self._needs_restart = True
        if error is not None and self.worker_group is not None:
            try:
                self.hook.sgd_backend_handle_failure(
                    worker_group=self.worker_group, backend_config=self.backend_config, error=error
                )
            except Exception:
                logger.exception("backend failure handler raised")
        self._restart()

    def start_training(
        self,
        train_func: Callable[[], Any],
        checkpoint: Optional[dict] = None,
        dataset_shards: Optional[List[Any]] = None,
        start_iteration: int = 0,
        direct_write: Optional[DirectWrite] = None,
        run_info: Optional[Dict[str, Optional[str]]] = None,
    ) -> RunState:
        if self.worker_group is None:
            raise RuntimeError("the trainer is not started; call trainer.start() first")
        if self._needs_restart:
            self._restart()
        wg = self.worker_group
        self.hook.sgd_backend_training_start(worker_group=wg, backend_config=self.backend_config)
        encode = self._backend.encode_data
        encode_checkpoint = self._backend.encode_checkpoint
        shards = dataset_shards or [None] * len(wg)
        refs = [
            w._sgd_start_training.remote(
                train_func, encode, checkpoint, shard, self.max_pending, start_iteration, encode_checkpoint,
                direct_write if rank == 0 else None, run_info,
            )
            for rank, (w, shard) in enumerate(zip(wg.workers, shards))
        ]
        for rank, ref in enumerate(refs):
            try:
                ray.get(ref)
            except RayActorError as exc:
                self._needs_restart = True
                raise WorkerDiedError(f"worker rank {rank} died: {_short(exc)}", rank) from exc
        # Until the run ends cleanly, assume it did not.
        self._needs_restart = True
        return RunState(wg.workers)

    def rank0_on_driver_node(self) -> bool:
        """Whether rank 0 shares the driver's node (and so its local disk)."""
        wg = self.worker_group
        if wg is None or not wg.metadata:
            return False
        return bool(wg.metadata[0].node_id == ray.get_runtime_context().get_node_id())

    def decode_checkpoint(self, state: Any) -> Any:
        return self._backend.decode_checkpoint(state)

    def end_training(self, ok: bool, error: Optional[BaseException] = None) -> None:
        """Close a run: on success just forget it; on failure stop every worker at once."""
        if self.worker_group is None:
            return
        if ok:
            self._needs_restart = False
            return
        self._needs_restart = True
        try:
            self.hook.sgd_backend_handle_failure(
                worker_group=self.worker_group, backend_config=self.backend_config, error=error
            )
        except Exception:
            logger.exception("backend failure handler raised")
        # A worker may be blocked in a collective its failed peer will never
        # join; only killing the processes stops it. Fresh actors start lazily.
        self.worker_group.stop_actors(patience_s=0)

    def shutdown(self) -> None:
        if self.worker_group is not None:
            wg, self.worker_group = self.worker_group, None
            wg.shutdown()
