"""The session API, called inside a training function on each worker.

``report``, ``save_checkpoint``, ``load_checkpoint`` and ``get_dataset_shard``
raise :class:`RuntimeError` outside a training function. The rank getters
work in any sgd worker (also in the methods of a class-level
:class:`~sgd.WorkerGroup`); in a process that is not an sgd worker they warn
and return the values of a single-process job (rank 0, world size 1), so a
training function can be debugged by calling it directly.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Union

from sgd._worker.reported import read_reported
from sgd._worker.session import STATE, PreemptionInfo, Session, WorkerContext
from sgd._worker.uploads import ReportOptions, check_dir_name, validation_spec
from sgd.checkpoint import SHARDED_KEY, Checkpoint, is_sharded
from sgd.report_config import CheckpointConsistencyMode, CheckpointUploadMode, ReportedCheckpoint, ValidationTaskConfig

__all__ = [
    "report",
    "get_all_reported_checkpoints",
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
           checkpoint_upload_mode: Any = CheckpointUploadMode.SYNC,
           delete_local_checkpoint_after_upload: Optional[bool] = None,
           checkpoint_upload_fn: Optional[Callable[[Any, str], Any]] = None,
           validation: Union[bool, ValidationTaskConfig] = False, **kwargs: Any) -> None:
    """Report metrics from this worker, optionally with a checkpoint.

    Every signature of Ray Train works:

    - ``sgd.report(loss=0.1)`` (Ray Train 1.x: the metrics as keywords);
    - ``sgd.report({"loss": 0.1})`` and ``sgd.report({"loss": 0.1}, checkpoint=ckpt)`` (AIR 2.x);
    - ``sgd.report(metrics={"loss": 0.1}, checkpoint=ckpt)`` (AIR 2.x, keywords);
    - ``sgd.report({"loss": 0.1}, ckpt)`` (Ray 2.x: the checkpoint positional);
    - Ray 2.60's options, below.

    ``metrics`` must be a dict: anything else is a :class:`TypeError` (it is never taken for a
    metric called ``metrics``). Keywords beside a dict are added to it. Without a dict,
    ``checkpoint=`` that is not an :class:`sgd.Checkpoint` is a metric of that name (Ray 1.x's
    keyword style); with one, it is a :class:`TypeError`.

    Every worker must report the same number of times. The worker may run ahead
    of the driver by a bounded number of reports (``SGD_MAX_PENDING_RESULTS``,
    default 1024) before this call blocks.

    :param checkpoint: an :class:`sgd.Checkpoint` that goes with these metrics
        (``sgd.report(metrics, checkpoint=Checkpoint.from_directory(d))``). Ranks that pass
        ``None`` add nothing; several ranks' directories are merged (lowest rank wins on a
        name clash), the metrics of the lowest rank that passed one score it.
    :param checkpoint_dir_name: the folder name the checkpoint is committed under in the run's
        ``checkpoints`` folder (default ``checkpoint_NNNNNN``). A plain name, unique in the run
        (``f"epoch_{epoch}"``): a path, a hidden name, one of sgd's numbered names or a name
        already used is a :class:`ValueError`. Checkpoints keep their number (in their
        metadata), which orders them whatever their names.
    :param checkpoint_upload_mode: a :class:`sgd.CheckpointUploadMode` (or its name).
        ``SYNC`` (default): the checkpoint's content is taken before ``report`` returns (its
        folder may go right after) and the call returns once the driver committed it.
        ``ASYNC``: ``report`` returns at once and the upload runs in the background while
        training goes on; the reports after it reach the driver after it, the run does not end
        before it landed, and a failed upload fails the run (the previous checkpoint stays the
        latest). Keep the folder until then (``tempfile.mkdtemp()``, not a ``with
        TemporaryDirectory()`` block); it is deleted after the upload by default.
        ``NO_UPLOAD``: a checkpoint the loop wrote into the run's checkpoint folder itself
        (``sgd.session.get_session().checkpoint_dir``) is committed in place; one elsewhere is
        copied in as with ``SYNC``.
    :param delete_local_checkpoint_after_upload: delete the checkpoint's folder once uploaded
        (``None``: only with ``ASYNC``, as in Ray).
    :param checkpoint_upload_fn: ``fn(checkpoint, checkpoint_dir_name) -> sgd.Checkpoint``
        uploads the checkpoint itself (called in the upload, in the background with ``ASYNC``);
        what it returns is committed: moved into place when it wrote into the run's checkpoint
        folder, else copied in. Returning anything but an ``sgd.Checkpoint`` is a
        :class:`TypeError`. Without ``checkpoint_dir_name`` it gets a fresh name of Ray's form
        (``checkpoint_<date>_<time>``), and the checkpoint keeps sgd's numbered name.
    :param validation: ``True`` or a :class:`sgd.ValidationTaskConfig`: validate this
        checkpoint with the trainer's ``validation_config`` asynchronously (see
        :class:`sgd.ValidationConfig`). Needs a checkpoint and a ``validation_config``
        (else :class:`ValueError`).
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
    if (checkpoint is None and checkpoint_upload_mode is CheckpointUploadMode.SYNC and checkpoint_dir_name is None
            and checkpoint_upload_fn is None and validation is False and delete_local_checkpoint_after_upload is None):
        _session("report").report(data, None)  # the common call: metrics only
        return
    options = _options(checkpoint, checkpoint_dir_name, checkpoint_upload_mode, delete_local_checkpoint_after_upload,
                       checkpoint_upload_fn, validation)
    _session("report").report(data, checkpoint, options)


def _options(checkpoint: Any, dir_name: Any, mode: Any, delete_local: Any, upload_fn: Any,
             validation: Any) -> ReportOptions:
    """Ray 2.60's report options, checked; each bad one is an error naming it."""
    mode = CheckpointUploadMode.parse(mode)
    dir_name = check_dir_name(dir_name)
    if delete_local is not None and not isinstance(delete_local, bool):
        raise TypeError(f"sgd.report(delete_local_checkpoint_after_upload=...) takes True, False or None, "
                        f"got {type(delete_local).__name__}")
    if upload_fn is not None and not callable(upload_fn):
        raise TypeError(f"sgd.report(checkpoint_upload_fn=...) takes a function fn(checkpoint, checkpoint_dir_name) "
                        f"-> sgd.Checkpoint, got {type(upload_fn).__name__}")
    validation = validation_spec(validation)
    if validation is not False and checkpoint is None:
        raise ValueError("sgd.report(validation=...) validates a checkpoint: pass checkpoint= with it")
    if delete_local is None:
        delete_local = mode.default_delete_local_checkpoint_after_upload()
    return ReportOptions(mode=mode, dir_name=dir_name, delete_local=delete_local, upload_fn=upload_fn,
                         validation=validation)


def get_all_reported_checkpoints(consistency_mode: Any = CheckpointConsistencyMode.VALIDATED,
                                 timeout_s: Optional[float] = None) -> List[ReportedCheckpoint]:
    """Every checkpoint this run reported and still keeps, oldest first, with its metrics and
    :class:`sgd.ReportedCheckpointStatus` (Ray 2.60's ``ray.train.get_all_reported_checkpoints``).

    Waits until the driver has processed every report this worker made, the checkpoints of
    those rounds uploaded and committed whichever rank passed them (``COMMITTED``), and with
    ``VALIDATED`` (the default) also until the validations requested so far have ended. Not a
    collective: any rank may call it, any number of times.

    :param consistency_mode: a :class:`sgd.CheckpointConsistencyMode` (or its name).
    :param timeout_s: the most seconds to wait; then what is there is returned (as Ray does).
        ``None``: no limit.
    :raises RuntimeError: called outside a training function.
    """
    mode = CheckpointConsistencyMode.parse(consistency_mode)
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or timeout_s < 0):
        raise ValueError(f"get_all_reported_checkpoints(timeout_s=...) must be None or seconds >= 0, got {timeout_s!r}")
    session = _session("get_all_reported_checkpoints")

    return read_reported(session, mode, timeout_s)


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


#: Ray Train's name of the class of :func:`get_context`'s object (``ray.train.TrainContext``).
TrainContext = WorkerContext


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
