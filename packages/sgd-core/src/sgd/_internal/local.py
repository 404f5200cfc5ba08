"""Local mode: ``Trainer(num_workers=0)`` runs the training function in the driver's process.

No actors, no placement group, no backend setup (no process group): the function runs in a
thread of this process (``sgd-train``), so ``breakpoint()``, a debugger's breakpoints and
print-debugging work as in any script. Everything else is the ordinary run engine: the same
:class:`~sgd._worker.session.Session` (rank 0, world size 1), the same
:class:`~sgd._internal.controller.ActiveRun` (results.jsonl, checkpoints, callbacks, Tune),
fed by :class:`LocalCollector` instead of the actor-polling ``RoundCollector``.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Tuple

from sgd._common.protocol import RemoteError, decode_round
from sgd._internal.controller import ActiveRun, RunSpec
from sgd._internal.rounds import POLL_BATCH, raise_remote
from sgd._worker.session import STATE, Session, WorkerContext
from sgd.backend import BackendConfig
from sgd.data import shard_datasets

logger = logging.getLogger("sgd")


class LocalCollector:
    """The interface of ``RoundCollector`` over one :class:`Session` in this process."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._items: Deque[Tuple[str, Any]] = deque()
        self._done = False
        self._error: Optional[RemoteError] = None
        self.returns: List[Any] = [None]
        self.tick: Optional[Callable[[], None]] = None
        self.hang_timeout_s: Optional[float] = None  # one process: a hang is in front of you
        self.on_hang: Optional[Callable[[List[int]], None]] = None

    def next_round(self) -> Any:
        while True:
            if self._items:
                kind, data = self._items.popleft()
                return decode_round(kind, [data])
            if self._done:
                if self._error is not None:
                    raise_remote(self._error)
                return None
            batch, finished, value, error = self._session.poll(POLL_BATCH)
            self._items.extend(batch)
            if finished:
                self._done, self._error, self.returns = True, error, [value]


class LocalExecutor:
    """What the run engine uses of a ``BackendExecutor``, for the driver's own process."""

    worker_group = None
    num_workers = 1

    def __init__(self, backend_config: BackendConfig, hook: Any, gpus: int = 0) -> None:
        self.backend_config = backend_config
        self.backend = backend_config.backend_cls()
        self.hook = hook
        self.gpus = gpus
        self.session: Optional[Session] = None
        self._context: Optional[WorkerContext] = None

    def start(self, initialization_hook: Optional[Callable[[], Any]] = None) -> None:
        if initialization_hook is not None:
            initialization_hook()

    def start_training(self, spec: RunSpec, checkpoint: Optional[dict], start_iteration: int) -> LocalCollector:
        info = dict(spec.worker_run_info)
        context = WorkerContext(world_rank=0, local_rank=0, world_size=1, node_rank=0, local_world_size=1,
                                local_gpus=tuple(range(self.gpus)),
                                **{k: v for k, v in info.items() if k in _CONTEXT_FIELDS})
        shards = shard_datasets(spec.dataset, 1, spec.dataset_config)
        backend_cls = type(self.backend)
        self._context = STATE.context
        session = Session(spec.train_func, context, backend_cls.encode_data, checkpoint,
                          shards[0] if shards else None, start_iteration=start_iteration,
                          encode_checkpoint=backend_cls.encode_checkpoint)
        STATE.context, STATE.session = context, session
        self.session = session
        session.start()
        return LocalCollector(session)

    def decode_checkpoint(self, state: Any) -> Any:
        return self.backend.decode_checkpoint(state)

    def _forget(self) -> None:
        if STATE.session is self.session:
            STATE.session, STATE.context = None, self._context

    def end_training(self, ok: bool, error: Optional[BaseException] = None) -> None:
        session = self.session
        if session is not None and not session.finished:
            session.request_stop()
            session.join_for(5.0)
        self._forget()

    def stop_training(self, patience_s: float) -> bool:
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


_CONTEXT_FIELDS = ("experiment_name", "trial_dir", "trial_name", "trial_id")


class LocalRun(ActiveRun):
    """An :class:`ActiveRun` whose one "worker" is a thread of the driver's process."""

    def _start(self, checkpoint: Optional[dict], start_iteration: int) -> Any:
        executor: LocalExecutor = self._executor  # type: ignore[assignment]
        self._position = start_iteration
        return executor.start_training(self._spec, checkpoint, start_iteration)

    def _after_checkpoint(self) -> None:
        return None  # one process: nothing to resize


class LocalController:
    """``RunController`` for ``num_workers=0``."""

    def __init__(self, backend_config: BackendConfig, hook: Any, gpus: int = 0) -> None:
        self.executor = LocalExecutor(backend_config, hook, gpus)
        self.max_retries = 0  # no worker process can die: an error is the function's own
        self.hang_timeout_s: Optional[float] = None

    @property
    def worker_group(self) -> None:
        return None

    def start(self, initialization_hook: Optional[Callable[[], Any]] = None) -> None:
        self.executor.start(initialization_hook)

    def begin(self, spec: RunSpec) -> ActiveRun:
        return LocalRun(self, spec)  # type: ignore[arg-type]

    def shutdown(self) -> None:
        self.executor.shutdown()


def check_local(use_gpu: bool) -> None:
    """Whether ``num_workers=0`` can run this: it runs in this process, with this process's
    devices; GPUs are not reserved from Ray (say so), and no backend is set up."""
    if use_gpu and os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        raise ValueError("num_workers=0 with use_gpu=True runs the function in this process, which sees no GPU "
                         "(CUDA_VISIBLE_DEVICES is empty); use num_workers=1 for a worker with a GPU of its own")


__all__: Tuple[str, ...] = ("LocalController", "LocalRun", "check_local")
