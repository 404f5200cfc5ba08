"""Backends: what turns N Ray actors into one training job.

A backend package provides a :class:`BackendConfig` dataclass (what the user
configures) whose :attr:`~BackendConfig.backend_cls` names a :class:`Backend`
(the lifecycle run on the driver), and declares it with the
:func:`~sgd.hookspecs.sgd_backends` hook.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, List, Optional, Protocol, Sequence, Tuple, Type

from sgd._common.run_hooks import INTERRUPT_HOOKS, RESET_HOOKS, RUN_CONTEXTS, RUN_END_HOOKS, RUN_ERROR_HOOKS


class Workers(Protocol):
    """What a :class:`Backend` (and a backend hook) may use of its worker group.

    :class:`sgd.WorkerGroup` is the implementation; backends are written against this
    protocol, so the backend layer does not depend on how the actors are placed.
    """

    @property
    def metadata(self) -> Sequence[Any]:
        """One record per worker, in world-rank order: ``node_id``, ``node_ip``, ``gpu_ids``, ``pid``..."""
        ...

    @property
    def contexts(self) -> Sequence[Any]:
        """One worker context per worker (ranks, world size), in world-rank order."""
        ...

    @property
    def num_gpus_per_worker(self) -> float: ...

    @property
    def run_notes(self) -> Sequence[Optional[Dict[str, Any]]]:
        """What each worker's run-end hooks (:func:`on_worker_run_end`) said when the group's
        last run ended cleanly, in world-rank order (a dict by hook key); empty, or ``None`` for
        a worker, when there is nothing to tell: no run yet, the last one failed or was stopped,
        the worker is new. Read it in :meth:`Backend.on_training_start` to skip a per-run call
        to every worker (one round trip of N calls) when the last run left them as they should be."""
        ...

    def __len__(self) -> int: ...

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[Any]: ...

    def execute_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[Any]: ...

    def execute_single(self, index: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def execute_single_async(self, index: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def preload(self, modules: Tuple[str, ...]) -> None: ...


class Backend:
    """Lifecycle of one distributed framework, run on the driver.

    Each method receives the started group (a :class:`~sgd.WorkerGroup`, seen as
    :class:`Workers`; world-rank order) and runs code on the workers with ``worker_group.execute``.
    The defaults do nothing.
    """

    #: Name of the registered checkpoint codec that writes dict checkpoints to disk: ``"sgd"``
    #: (sgd-core's safe format: plain data and numpy arrays, pickle only behind ``trusted=True``),
    #: ``"pickle"``, or one a plugin registers with the ``sgd_checkpoint_codecs`` hook
    #: (``"torch"``, ``"tensorflow"``). The name is recorded in each checkpoint.
    checkpoint_codec: str = "sgd"

    #: Modules each worker starts importing in the background as soon as its process
    #: exists, while the driver is still placing and ranking the group (a framework's
    #: import is most of a cold start).
    preload_modules: tuple = ()

    #: Ray Train's switch: when true and the workers have GPUs, sgd-core sets
    #: ``CUDA_VISIBLE_DEVICES`` on every worker to all the GPUs of the group's workers on its
    #: node (NCCL's peer-to-peer needs them visible) before :meth:`on_start`, on every
    #: (re)start, and ``SGD_OWN_GPU_IDS`` to the worker's own ones
    #: (see :func:`share_cuda_visible_devices`).
    share_cuda_visible_devices: bool = False

    def on_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        """Set the framework up on every worker (after ranks are assigned)."""

    def on_training_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        """Called before each ``Trainer.run``."""

    def on_shutdown(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        """Tear the framework down while the workers are still alive."""

    def on_failure(
        self, worker_group: Workers, backend_config: BackendConfig, error: BaseException
    ) -> None:
        """Called when the group failed, before it is torn down and restarted."""

    def keeps_survivors(self, worker_group: Workers, backend_config: BackendConfig) -> bool:
        """Whether a restart after a worker death may keep the workers that survived.

        When true, sgd replaces only the workers that died (or did not end their run within a
        few seconds of being asked to), runs the ``initialization_hook`` on the new ones only,
        and then :meth:`on_start` on the whole group again: ``on_start`` must then set the
        framework up in processes where it was set up before (for torch: destroy the old
        process group, build a new one). When false (the default for subclasses), every worker
        is replaced, as a framework whose state cannot be rebuilt in a live process needs.

        The no-op ``"base"`` backend keeps survivors; sgd-torch does with gloo (not NCCL,
        whose communicators cannot be torn down safely after a peer died).
        """
        return type(self) is Backend

    def reuses_processes(self, backend_config: BackendConfig) -> bool:
        """Whether a worker process this backend was set up in can serve another group of the
        same backend after :meth:`on_shutdown` (:func:`sgd.keep_workers`): ``on_shutdown`` must
        leave nothing of the framework that the next :meth:`on_start` cannot set up again. Only
        groups of CPU workers (at most 1 CPU each) are ever kept.

        The no-op ``"base"`` backend says yes; so do sgd-torch (it destroys its process group at
        shutdown), sgd-horovod (``hvd.shutdown()`` at shutdown, a new rendezvous at the next start)
        and sgd-xgboost's XGBoost and LightGBM backends. The default for subclasses is
        no: a framework that reads its configuration once per process (TensorFlow's
        ``TF_CONFIG``) cannot be set up a second time there.
        """
        return type(self) is Backend

    def reforms_in_place(self, worker_group: Workers, backend_config: BackendConfig) -> bool:
        """Whether the group can re-form in place after a loss (:mod:`sgd.elastic`): the
        survivors' processes are kept, :meth:`on_start` runs on the new group (survivors and
        new workers; it must tear down what the old group set up in a live process and build
        it for the new size), and the training functions go on. A backend that says so should
        register an interrupt hook (:func:`on_worker_interrupt`) that makes a collective
        blocked on a lost peer fail at once.

        The default: whatever :meth:`keeps_survivors` says.
        """
        return self.keeps_survivors(worker_group, backend_config)

    @staticmethod
    def encode_data(data: Any) -> Any:
        """Turn a worker-side value (a report, a checkpoint, a return value) into
        something the driver can load without the worker's devices. Runs on the
        worker; the default returns ``data`` unchanged."""
        return data

    @classmethod
    def encode_checkpoint(cls, state: Any) -> Any:
        """A transport form of a checkpoint state (on the worker). sgd itself no longer sends
        checkpoint states: each worker writes its checkpoint (after :meth:`encode_data`) with
        :attr:`checkpoint_codec` into the run's checkpoint folder and only the folder's path
        travels (:mod:`sgd.storage.staging`). Kept for backends and callers that use it."""
        return cls.encode_data(state)

    @staticmethod
    def decode_checkpoint(state: Any) -> Any:
        """Undo :meth:`encode_checkpoint` (see there: sgd itself does not call it)."""
        return state


def on_worker_run_error(hook: Callable[[], None]) -> None:
    """On a worker (call it from code the backend runs there, e.g. in :meth:`Backend.on_start`
    through ``worker_group.execute``): run ``hook()`` in the training thread whenever a
    training function on this worker raises, before the driver learns that the run ended.

    For a backend to release what the failed run holds, so that the other workers do not wait
    for it. sgd-torch destroys a gloo process group there: peers blocked in a collective with
    this worker then fail at once (their connections to it close) instead of at the
    collective's timeout, and a failure spreads through the group in milliseconds. A hook
    registered twice runs once; one that raises is logged and the run's own error is kept.
    """

    if hook not in RUN_ERROR_HOOKS:
        RUN_ERROR_HOOKS.append(hook)


def on_worker_interrupt(hook: Callable[[], None]) -> None:
    """On a worker (from code the backend runs there): run ``hook()`` when a run in
    :func:`sgd.elastic.run` is interrupted because a peer was lost, so that a collective
    blocked on that peer fails now instead of at its timeout. Called from a control thread
    while the training thread may be blocked in the collective, or from the training thread
    that caught the failure first; it may run more than once per reset. sgd-torch shuts the
    process group's connections down there. A hook registered twice runs once.
    """

    if hook not in INTERRUPT_HOOKS:
        INTERRUPT_HOOKS.append(hook)


def on_worker_reset(hook: Callable[[], None]) -> None:
    """On a worker (from code the backend runs there): run ``hook()`` in the training thread each
    time a run in :func:`sgd.elastic.run` goes on in a re-formed group, after the driver told
    it its new place (the environment the backend's :meth:`Backend.on_start` set is there)
    and before the run's state is tied to the new group. For a framework whose setup the
    training code owns: sgd-torch builds again there a process group the script created
    itself (``TorchConfig(init_process_group=False)``, as under ``sgd run``). A hook registered
    twice runs once.
    """

    if hook not in RESET_HOOKS:
        RESET_HOOKS.append(hook)


def on_worker_run_end(key: str, hook: Callable[[], Any]) -> None:
    """On a worker (from code the backend runs there): run ``hook()`` in the training thread each
    time a training function on this worker returned (not when it raised or was stopped); what it
    returns travels to the driver with the run's end, at no extra call, and the next run's
    :meth:`Backend.on_training_start` finds it in ``worker_group.run_notes[rank][key]``.

    For a backend that would otherwise ask every worker at the start of each run whether the
    last run left its framework as set up: sgd-torch notes whether the process group is still
    there (a training function may have destroyed it) and checks only when one is not. The
    value must pickle; keep it small. A hook that raises is logged and its key left out.
    Registering another hook under the same key replaces it.
    """

    RUN_END_HOOKS[key] = hook


def on_worker_run(context: Callable[[], ContextManager[Any]]) -> None:
    """On a worker (call it from code the backend runs there, e.g. in :meth:`Backend.on_start`
    through ``worker_group.execute``): run every training function started on this worker from
    now on inside ``with context():``, in the training thread (Ray Train's
    ``BackendConfig.train_func_context``).

    For a framework whose communicator belongs to the thread that set it up: sgd-xgboost enters
    XGBoost's ``CommunicatorContext`` this way, so that ``xgboost.train`` in a training function
    is one distributed job. ``context`` is called once per run; an exception of the training
    function passes through its ``__exit__`` (which may act on it, e.g. tell the peers) before
    the run-error hooks run. Contexts registered earlier are entered first; one registered twice
    is entered once. :func:`remove_worker_run` takes it away again.
    """

    if context not in RUN_CONTEXTS:
        RUN_CONTEXTS.append(context)


def remove_worker_run(context: Callable[[], ContextManager[Any]]) -> None:
    """On a worker: undo :func:`on_worker_run` (nothing happens if ``context`` is not registered)."""

    if context in RUN_CONTEXTS:
        RUN_CONTEXTS.remove(context)


def _set_env(env: Dict[str, str]) -> None:
    import os

    os.environ.update(env)


def share_cuda_visible_devices(worker_group: Workers) -> None:
    """Let the workers on one node see each other's GPUs: each worker's
    ``CUDA_VISIBLE_DEVICES`` becomes the GPU ids Ray gave to all of the group's workers on
    its node (sorted), and ``SGD_OWN_GPU_IDS`` the ids Ray gave to it alone, so it can still
    pick its own device (``sgd_torch.get_device`` does). Does nothing when no worker has a GPU.

    sgd-core calls it for a backend whose :attr:`Backend.share_cuda_visible_devices` is true;
    call it yourself on a group you set up another way.
    """
    import ray

    if not any(meta.gpu_ids for meta in worker_group.metadata):
        return
    per_node: Dict[str, List[str]] = {}
    for meta in worker_group.metadata:
        per_node.setdefault(meta.node_id, []).extend(meta.gpu_ids)
    refs = []
    for rank, meta in enumerate(worker_group.metadata):
        ids = sorted(set(per_node[meta.node_id]), key=lambda g: (len(g), g))
        env = {"CUDA_VISIBLE_DEVICES": ",".join(ids), "SGD_OWN_GPU_IDS": ",".join(meta.gpu_ids)}
        refs.append(worker_group.execute_single_async(rank, _set_env, env))
    ray.get(refs)


def free_address() -> Tuple[str, int]:
    """``(node IP, free TCP port)`` of the process it runs in: run it on a worker
    (``worker_group.execute_single(rank, free_address)``) to find a rendezvous address."""
    import socket

    import ray

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return ray.util.get_node_ip_address(), s.getsockname()[1]


@dataclass
class BackendConfig:
    """Base class of every backend's configuration (a dataclass).

    Subclasses override :attr:`backend_cls` and :attr:`name`.
    """

    @property
    def backend_cls(self) -> Type[Backend]:
        return Backend

    @property
    def name(self) -> str:
        """The registered backend name (``"torch"``...); ``"base"`` for the no-op backend."""
        return "base"

    def to_dict(self) -> Dict[str, Any]:
        """The configuration's fields as a dict (Ray Train's ``BackendConfig.to_dict``)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class BackendSpec:
    """A backend declared by a plugin through :func:`~sgd.hookspecs.sgd_backends`.

    :param name: the name users pass as ``Trainer(backend=name)``.
    :param config_cls: the :class:`BackendConfig` subclass; ``config_cls()`` must work.
    :param provider: the distribution that provides it (for messages).
    """

    name: str
    config_cls: Type[BackendConfig]
    provider: Optional[str] = None
