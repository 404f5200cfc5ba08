"""The session API, called inside a training function on each worker.

``report``, ``save_checkpoint``, ``load_checkpoint`` and ``get_dataset_shard``
raise :class:`RuntimeError` outside a training function. The rank getters
work in any sgd worker (also in the methods of a class-level
:class:`~sgd.WorkerGroup`); in a process that is not an sgd worker they warn
and return the values of a single-process job (rank 0, world size 1), so a
training function can be debugged by calling it directly.
"""

from __future__ import annotations

import os
import shutil
import warnings
from typing import Any, Dict, Optional

from sgd._worker.session import STATE, PreemptionInfo, Session, WorkerContext
from sgd.checkpoint import SHARDED_KEY, Checkpoint, is_sharded

__all__ = [
    "report",
    "save_checkpoint",
    "load_checkpoint",
    "get_checkpoint",
    "world_rank",
    "local_rank",
    "world_size",
    "node_rank",
    "local_world_size",
    "get_dataset_shard",
    "get_context",
    "get_session",
    "get_preemption_info",
    "PreemptionInfo",
    # Ray AIR's session names
    "get_world_rank",
    "get_local_rank",
    "get_world_size",
    "get_node_rank",
    "get_local_world_size",
    "get_experiment_name",
    "get_trial_dir",
    "get_trial_name",
    "get_trial_id",
]


def _session(what: str) -> Session:
    session = STATE.session
    if session is None:
        raise RuntimeError(
            f"sgd.{what}() was called outside a training function. Call it inside the "
            "function passed to Trainer.run / run_iterator."
        )
    return session


def _context() -> WorkerContext:
    context = STATE.context
    if context is None:
        warnings.warn(
            "sgd rank getters called outside an sgd worker; returning the values of a "
            "single-process job (rank 0, world size 1).",
            RuntimeWarning,
            stacklevel=3,
        )
        return WorkerContext()
    return context


def report(metrics: Optional[Dict[str, Any]] = None, checkpoint: Any = None, checkpoint_dir_name: Optional[str] = None,
           checkpoint_upload_mode: Any = None, delete_local_checkpoint_after_upload: Optional[bool] = None,
           checkpoint_upload_fn: Any = None, validation: Any = False, **kwargs: Any) -> None:
    """Report metrics from this worker, optionally with a checkpoint.

    Every signature of Ray Train works:

    - ``sgd.report(loss=0.1)`` (Ray Train 1.x: the metrics as keywords);
    - ``sgd.report({"loss": 0.1})`` and ``sgd.report({"loss": 0.1}, checkpoint=ckpt)`` (AIR 2.x);
    - ``sgd.report(metrics={"loss": 0.1}, checkpoint=ckpt)`` (AIR 2.x, keywords);
    - ``sgd.report({"loss": 0.1}, ckpt)`` (Ray 2.x: the checkpoint positional).

    ``metrics`` must be a dict: anything else is a :class:`TypeError` (it is never taken for a
    metric called ``metrics``). Keywords beside a dict are added to it. Without a dict,
    ``checkpoint=`` that is not an :class:`sgd.Checkpoint` is a metric of that name (Ray 1.x's
    keyword style); with one, it is a :class:`TypeError`.

    Every worker must report the same number of times. The worker may run ahead
    of the driver by a bounded number of reports (``SGD_MAX_PENDING_RESULTS``,
    default 1024) before this call blocks.

    :param checkpoint: an :class:`sgd.Checkpoint` that goes with these metrics
        (``sgd.report(metrics, checkpoint=Checkpoint.from_directory(d))``).
        Its content is taken before ``report`` returns, so ``d`` may be deleted right
        after; the call returns once the driver has persisted it. Ranks that pass
        ``None`` add nothing; several ranks' directories are merged (lowest rank wins
        on a name clash), the metrics of the lowest rank that passed one score it.
    :param checkpoint_upload_mode: Ray 2.x's ``CheckpointUploadMode`` (or its name). ``SYNC``
        (the default) is what sgd does. ``ASYNC`` and ``NO_UPLOAD`` are taken as ``SYNC``: the
        call returns once the checkpoint is persisted (correct, not faster).
    :param delete_local_checkpoint_after_upload: delete the checkpoint's local directory once
        its content is taken (``None``: only with ``ASYNC``, as in Ray).
    :param checkpoint_dir_name: Ray 2.x's name for the checkpoint's directory; not supported
        (sgd names them ``checkpoint_NNNNNN``): :class:`ValueError`. ``checkpoint_upload_fn``
        and ``validation`` likewise.
    """
    if metrics is not None and not isinstance(metrics, dict):
        raise TypeError(
            f"sgd.report() takes the metrics as a dict (sgd.report({{'loss': 0.1}}) or sgd.report(metrics="
            f"{{'loss': 0.1}})) or as keywords (sgd.report(loss=0.1)), not a {type(metrics).__name__}")
    if checkpoint is not None and not _is_checkpoint(checkpoint):
        if metrics is not None:
            t = type(checkpoint)
            raise TypeError(f"sgd.report(checkpoint=...) takes an sgd.Checkpoint, got {t.__module__}.{t.__qualname__}")
        # ``sgd.report(checkpoint=3)``: keyword style, a metric that happens to be called so.
        kwargs["checkpoint"], checkpoint = checkpoint, None
    data = {**metrics, **kwargs} if metrics else kwargs
    if (checkpoint is None and checkpoint_upload_mode is None and checkpoint_dir_name is None
            and checkpoint_upload_fn is None and validation is False):
        _session("report").report(data, None)  # the common call: metrics only
        return
    _refuse_unsupported(checkpoint_dir_name=checkpoint_dir_name, checkpoint_upload_fn=checkpoint_upload_fn,
                        validation=validation)
    mode = str(getattr(checkpoint_upload_mode, "value", checkpoint_upload_mode) or "SYNC").upper()
    if mode not in ("SYNC", "ASYNC", "NO_UPLOAD"):
        raise ValueError(f"checkpoint_upload_mode must be SYNC, ASYNC or NO_UPLOAD, got {checkpoint_upload_mode!r}")
    _session("report").report(data, checkpoint)
    delete = delete_local_checkpoint_after_upload
    if delete is None:
        delete = mode == "ASYNC"
    if checkpoint is not None and delete and checkpoint.path is not None and os.path.isdir(checkpoint.path):
        shutil.rmtree(checkpoint.path, ignore_errors=True)


def _refuse_unsupported(**given: Any) -> None:
    for name, value in given.items():
        if value is not None and value is not False:
            raise ValueError(
                f"sgd.report({name}=...) is a Ray 2.x option sgd does not have (checkpoint directories are "
                f"named checkpoint_NNNNNN and persisted by the driver before report returns): drop the argument "
                "(docs/migration-ray-train.md)")


def _is_checkpoint(value: Any) -> bool:

    return isinstance(value, Checkpoint)


def get_checkpoint() -> Any:
    """The checkpoint to resume from, as an :class:`sgd.Checkpoint`, or ``None``.

    The latest checkpoint of this run (``sgd.report(..., checkpoint=)`` or
    ``sgd.save_checkpoint``), else the one the run was started from
    (``resume_from_checkpoint=``, ``Trainer.run(checkpoint=)``, a restart after a failure).
    A directory checkpoint is a local directory on this worker; a dict one gives its
    dict with ``to_dict()``.
    """
    return _session("get_checkpoint").get_checkpoint()


def save_checkpoint(**state: Any) -> None:
    """Save a checkpoint of this run. Every rank must call it; only rank 0's state is kept.

    Returns once the driver has received the checkpoint (a synchronisation point).
    """
    _session("save_checkpoint").save_checkpoint(state)


def load_checkpoint() -> Optional[Dict[str, Any]]:
    """The latest ``save_checkpoint`` state of this run, else the checkpoint passed to ``run``, else ``None``.

    :raises ValueError: the run started from a sharded checkpoint (each worker holds a part):
        ``sgd_torch.load_sharded_checkpoint`` loads those.
    """
    state = _session("load_checkpoint").loaded_checkpoint
    if state is not None and is_sharded(state):
        raise ValueError(
            f"this run starts from a sharded checkpoint ({state[SHARDED_KEY]}), which every worker loads its part "
            "of: call sgd_torch.load_sharded_checkpoint({'model': model, 'opt': optimizer}) on every worker "
            "instead of sgd.load_checkpoint()")
    return state


def get_dataset_shard(name: Optional[str] = None, *, dataset_name: Optional[str] = None) -> Any:
    """This worker's shard of the ``dataset`` passed to ``Trainer.run`` (``datasets=`` of an AIR trainer).

    With a dict of datasets pass its ``name`` (``dataset_name=`` is Ray's keyword for it).
    Returns ``None`` (with a warning) when no dataset was passed.
    """
    if dataset_name is not None:
        if name is not None and name != dataset_name:
            raise TypeError(f"get_dataset_shard() got two names: {name!r} and dataset_name={dataset_name!r}")
        name = dataset_name
    shard = _session("get_dataset_shard").dataset_shard
    if shard is None:
        warnings.warn("sgd.get_dataset_shard(): no dataset was passed to Trainer.run", RuntimeWarning, stacklevel=2)
        return None
    if isinstance(shard, dict):
        if name is None:
            raise RuntimeError(
                f"several datasets were passed to Trainer.run ({', '.join(map(str, shard))}); "
                "call sgd.get_dataset_shard(name) with one of those names."
            )
        if name not in shard:
            raise KeyError(f"no dataset named {name!r}; passed: {', '.join(map(str, shard))}")
        return shard[name]
    return shard


def world_rank() -> int:
    """This worker's rank among all workers (0 … world_size-1)."""
    return _context().world_rank


def local_rank() -> int:
    """This worker's rank among the workers on its node."""
    return _context().local_rank


def world_size() -> int:
    """How many workers take part in the run."""
    return _context().world_size


def node_rank() -> int:
    """The index of this worker's node among the group's nodes."""
    return _context().node_rank


def local_world_size() -> int:
    """How many workers run on this worker's node."""
    return _context().local_world_size


def get_session() -> Optional[Session]:
    """The training session running on this worker, or ``None`` outside a training function.

    For plugin authors (framework helpers such as ``sgd_torch.prepare_model`` that need
    per-run state); training code uses the functions above. A new session is made for
    every run, so ``get_session() is s`` tells whether run ``s`` is still the current one.
    Stable attributes: ``context`` (what :func:`get_context` returns),
    ``dataset_shard`` (this worker's shard of the ``dataset`` passed to the run, a dict
    for several datasets, or ``None``), ``loaded_checkpoint`` (what ``sgd.load_checkpoint()``
    returns), ``checkpoint_dir`` (the run's checkpoint folder) and
    ``commit_written_checkpoint(directory, score_values)`` (a checkpoint the workers wrote
    themselves, committed by the driver).
    """
    return STATE.session


def get_context() -> WorkerContext:
    """An object with ``get_world_rank()``, ``get_local_rank()``, ``get_world_size()``,
    ``get_node_rank()``, ``get_local_world_size()``, and which run this is:
    ``get_experiment_name()``, ``get_trial_dir()`` (the run directory, on the driver's node),
    ``get_trial_name()`` and ``get_trial_id()`` (the Ray Tune trial's, else ``None``)."""
    return _context()


# --- Ray AIR's ``session`` module names (``from ray.air import session`` -> ``from sgd import session``) ---


def get_world_rank() -> int:
    """AIR's name of :func:`world_rank`."""
    return _context().world_rank


def get_local_rank() -> int:
    """AIR's name of :func:`local_rank`."""
    return _context().local_rank


def get_world_size() -> int:
    """AIR's name of :func:`world_size`."""
    return _context().world_size


def get_node_rank() -> int:
    """AIR's name of :func:`node_rank`."""
    return _context().node_rank


def get_local_world_size() -> int:
    """AIR's name of :func:`local_world_size`."""
    return _context().local_world_size


def get_experiment_name() -> Optional[str]:
    """The experiment's name (``RunConfig(name=...)``, the trainer's ``logdir`` name)."""
    return _session("get_experiment_name").context.get_experiment_name()


def get_trial_dir() -> Optional[str]:
    """This run's directory (a path on the driver's node)."""
    return _session("get_trial_dir").context.get_trial_dir()


def get_trial_name() -> Optional[str]:
    """The Ray Tune trial's name when the run is a Tune trial, else ``None``."""
    return _session("get_trial_name").context.get_trial_name()


def get_trial_id() -> Optional[str]:
    """The Ray Tune trial's id when the run is a Tune trial, else ``None``."""
    return _session("get_trial_id").context.get_trial_id()


def get_preemption_info() -> Optional[PreemptionInfo]:
    """Whether a host of this job is going away: a :class:`sgd.PreemptionInfo` (its
    ``deadline``, ``seconds_left``, the host's ``node_ip`` and ``node_id``), else ``None``.

    When Ray marks a host of the group as draining (``ray drain-node``, a cloud preemption
    notice, KubeRay's scale-down), every worker of the group, not only those on that host,
    sees the notice from the same report on, so a decision taken on it is the same on every
    rank::

        for epoch in range(start, epochs):
            train_one_epoch()
            sgd.report(loss=loss)
            if epoch % 10 == 9 or sgd.get_preemption_info():
                sgd.save_checkpoint(epoch=epoch, model=model.state_dict())

    sgd moves the workers off the draining host right after the next checkpoint (without
    counting a failure against ``max_retries``); see docs/clusters.md.

    :raises RuntimeError: called outside a training function.
    """
    return _session("get_preemption_info").preemption_info()  # type: ignore[no-any-return]
