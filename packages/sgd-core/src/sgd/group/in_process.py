"""Local mode: ``Trainer(num_workers=0)`` runs the training function in the driver's process.

:class:`InProcessGroup` is the worker-group protocol (:mod:`sgd.group.protocol`) over one
"worker": a thread of this process (``sgd-train``), so ``breakpoint()``, a debugger's
breakpoints and print-debugging work as in any script. No actors, no placement group, no
backend setup (no process group). Everything else is the ordinary run engine: the same
:class:`~sgd._worker.session.Session` (rank 0, world size 1) and the same run controller
(results.jsonl, checkpoints, callbacks, Tune). No process can die, so nothing is restarted:
an error is the function's own.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from sgd._common.nodes import NodeInfo
from sgd._common.protocol import Item, decode_items
from sgd._worker.session import STATE, Session, WorkerContext
from sgd._worker.stacks import thread_stacks
from sgd.backend import BackendConfig
from sgd.data import shard_datasets
from sgd.group.protocol import RunRequest
from sgd.group.rounds import POLL_BATCH, remote_exception
from sgd.group.status import HEALTHY, Barrier, Health, Poll

logger = logging.getLogger("sgd")

_CONTEXT_FIELDS = ("experiment_name", "trial_dir", "trial_name", "trial_id")


class InProcessGroup:
    """One worker: a thread of the driver's process."""

    worker_group = None
    num_workers = min_workers = max_workers = 1
    needs_restart = False

    def __init__(self, backend_config: BackendConfig, hook: Any, gpus: int = 0) -> None:
        self.backend_config = backend_config
        self.backend = backend_config.backend_cls()
        self.hook = hook
        self.gpus = gpus
        self.session: Optional[Session] = None
        self._context: Optional[WorkerContext] = None
        self._items: Deque[Item] = deque()
        self._sent = 0
        self._last_progress = time.monotonic()

    def start(self, initialization_hook: Optional[Callable[[], Any]] = None, actor_cls: Optional[type] = None,
              actor_cls_args: Optional[tuple] = None,
              actor_cls_kwargs: Optional[dict] = None) -> Optional[BaseException]:
        if actor_cls is not None:
            raise ValueError("num_workers=0 (local mode) runs no actors: to_worker_group() needs num_workers >= 1")
        if initialization_hook is not None:
            try:
                initialization_hook()
            except Exception as exc:
                return exc
        return None

    def begin(self, request: RunRequest) -> Optional[BaseException]:
        info = dict(request.run_info)
        context = WorkerContext(world_rank=0, local_rank=0, world_size=1, node_rank=0, local_world_size=1,
                                local_gpus=tuple(range(self.gpus)),
                                **{k: v for k, v in info.items() if k in _CONTEXT_FIELDS})
        try:
            shards = shard_datasets(request.dataset, 1, request.dataset_config)
        except Exception as exc:
            return exc
        backend_cls = type(self.backend)
        self._context = STATE.context
        session = Session(request.train_func, context, backend_cls.encode_data, request.checkpoint,
                          shards[0] if shards else None, start_iteration=request.start_iteration,
                          checkpoint_target=request.checkpoint_target, hook=self.hook)
        STATE.context, STATE.session = context, session
        self.session = session
        self._items.clear()
        self._sent, self._last_progress = 0, time.monotonic()
        session.start()
        return None

    def poll(self, timeout_s: float) -> Poll:
        session = self.session
        if session is None:
            raise RuntimeError("no run is active on this group")
        deadline = time.monotonic() + timeout_s
        while not self._items:
            batch, finished, value, error = session.poll(POLL_BATCH, timeout_s=max(0.0, deadline - time.monotonic()))
            if batch or finished:
                self._last_progress = time.monotonic()
            self._items.extend(batch)
            self._sent += len(batch)
            if finished and not self._items:
                if error is not None:
                    return Poll.failed(remote_exception(error))
                return Poll.finished([value])
            if not batch and time.monotonic() >= deadline:
                return Poll.idle([self._sent], self._last_progress)
        return Poll.of_round(decode_items([self._items.popleft()]))

    def health(self) -> Health:
        return HEALTHY

    def announce_drain(self, draining: Dict[str, NodeInfo]) -> None:
        return None

    def room(self) -> int:
        return 1

    def restart(self, error: Optional[BaseException], size: Optional[int] = None,
                move: bool = False) -> Optional[BaseException]:
        return RuntimeError("local mode (num_workers=0) cannot restart its one worker: it is this process")

    def reform(self, barrier: Barrier, iteration: int) -> Optional[BaseException]:
        return RuntimeError("local mode (num_workers=0) has no group to re-form")

    @property
    def recovers_in_place(self) -> bool:
        return False

    def grow(self, count: int) -> Optional[BaseException]:
        return RuntimeError("local mode (num_workers=0) has one worker: it cannot grow")

    def stacks(self, timeout_s: float = 10.0, include_idle: bool = False) -> List[str]:
        return [thread_stacks(0, include_idle)]  # this process: the training thread is one of its own

    def _forget(self) -> None:
        if STATE.session is self.session:
            STATE.session, STATE.context = None, self._context

    def end(self, ok: bool, error: Optional[BaseException] = None) -> None:
        session = self.session
        if session is not None and not session.finished:
            session.request_stop()
            session.join_for(5.0)
        self._forget()

    def stop(self, patience_s: float) -> bool:
        session = self.session
        stopped = True
        if session is not None and not session.finished:
            session.request_stop()
            stopped = session.join_for(patience_s)
            if not stopped:
                logger.warning("the training function did not stop within %.0f s (it is not at a report or "
                               "checkpoint); its thread is left to end by itself", patience_s)
        self._forget()
        return stopped

    def shutdown(self) -> None:
        self._forget()


def check_local(use_gpu: bool) -> None:
    """Whether ``num_workers=0`` can run this: it runs in this process, with this process's
    devices; GPUs are not reserved from Ray (say so), and no backend is set up."""
    if use_gpu and os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        raise ValueError("num_workers=0 with use_gpu=True runs the function in this process, which sees no GPU "
                         "(CUDA_VISIBLE_DEVICES is empty); use num_workers=1 for a worker with a GPU of its own")


__all__: Tuple[str, ...] = ("InProcessGroup", "check_local")
