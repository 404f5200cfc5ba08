"""The configs of an AIR-style trainer: how many workers (:class:`ScalingConfig`), where and how a
run is kept (:class:`RunConfig`), which checkpoints stay (:class:`CheckpointConfig`) and how many
failures are recovered from (:class:`FailureConfig`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from sgd._common.public import public_module
from sgd.air.callback import is_user_callback
from sgd.air.config_fields import (
    ACCELERATOR_RESOURCE_PREFIX,
    LoggingConfig,
    check_label_selector,
    check_storage_filesystem,
)
from sgd.air.tune_callbacks import is_tune_callback
from sgd.callbacks import TrainingCallback
from sgd.checkpoint import CheckpointStrategy
from sgd.utils import resolve_num_workers, resolve_resources
from sgd.worker_group import PLACEMENT_STRATEGIES


@public_module("sgd.air")
@dataclass
class ScalingConfig:
    """How many workers and what each gets (Ray Train 2.60's fields, with sgd's meaning of each).

    :param num_workers: a positive int, or ``(min, max)`` for elastic training.
    :param use_gpu: one GPU per worker unless ``resources_per_worker`` says otherwise.
    :param resources_per_worker: Ray resources per worker (``{"CPU": 2, "custom": 1}``).
    :param placement_strategy: ``"PACK"`` (default), ``"SPREAD"``, ``"STRICT_PACK"``, ``"STRICT_SPREAD"``.
    :param trainer_resources: accepted for Ray Train compatibility; sgd's driver is the
        calling process, so it reserves nothing (under Tune the trial asks one CPU for it).
    :param accelerator_type: the workers run only on nodes with this type of accelerator
        (``"A100"``, ``"H100"``, ``"TPU-V6E"``...): each worker also reserves ``0.001`` of Ray's
        ``accelerator_type:<type>`` resource, which Ray gives every node with such a device (as
        Ray Train does).
    :param label_selector: Ray node labels the workers must run on (``{"market-type": "spot"}``;
        ``"!value"``, ``"in(a,b)"``, ``"!in(a,b)"`` as Ray's label selectors): one dict for every
        worker, or a list of one dict per worker (``max_workers`` long). Checked as Ray checks it;
        not supported yet: a selector is refused at ``fit()`` with ``ValueError`` (ask for a custom
        resource the nodes have instead).
    :param use_tpu: each worker reserves one ``"TPU"`` (unless ``resources_per_worker`` says how
        many). sgd has no TPU backend (no JAX trainer): one TPU host per worker with your own
        framework code works; a multi-host slice (``num_workers > 1``) is refused at ``fit()``.
    :param topology: the TPU slice topology (``"4x4"``); with ``use_tpu`` only.
    :param elastic_resize_monitor_interval_s: accepted for Ray Train 2.60 compatibility (``>= 0``);
        how often an elastic group looks for room to grow is sgd's ``SGD_ELASTIC_GROW_CHECK_S``.
    """

    num_workers: Union[int, Tuple[int, int]] = 1
    use_gpu: bool = False
    resources_per_worker: Optional[Dict[str, float]] = None
    placement_strategy: str = "PACK"
    trainer_resources: Optional[Dict[str, float]] = None
    accelerator_type: Optional[str] = None
    label_selector: Optional[Union[Dict[str, str], List[Dict[str, str]]]] = None
    use_tpu: bool = False
    topology: Optional[str] = None
    elastic_resize_monitor_interval_s: float = 60.0

    def __post_init__(self) -> None:

        resolve_num_workers(self.num_workers)
        resolve_resources(self.use_gpu, self.resources_per_worker)
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"placement_strategy must be one of {', '.join(PLACEMENT_STRATEGIES)}, "
                             f"got {self.placement_strategy!r}")
        if self.accelerator_type is not None and (not isinstance(self.accelerator_type, str)
                                                  or not self.accelerator_type):
            raise ValueError(f"accelerator_type must be a non-empty str such as 'A100', got {self.accelerator_type!r}")
        check_label_selector(self.label_selector, self.max_workers)
        self._check_tpu()
        interval = self.elastic_resize_monitor_interval_s
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
            raise ValueError(f"elastic_resize_monitor_interval_s must be a number of seconds >= 0, got {interval!r}")

    def _check_tpu(self) -> None:
        tpus = (self.resources_per_worker or {}).get("TPU", 0)
        if self.use_gpu and self.use_tpu:
            raise ValueError("ScalingConfig got use_gpu=True and use_tpu=True; pass one")
        if not self.use_tpu and tpus:
            raise ValueError("resources_per_worker asks for TPUs but use_tpu=False; pass use_tpu=True or drop 'TPU'")
        if self.use_tpu and self.resources_per_worker is not None and "TPU" in self.resources_per_worker and not tpus:
            raise ValueError("use_tpu=True but resources_per_worker sets 'TPU' to 0; set it above 0 or use_tpu=False")
        if self.topology is not None and not self.use_tpu:
            raise ValueError(f"topology={self.topology!r} is for TPU slices; pass use_tpu=True with it, or drop it")

    def check_supported(self) -> None:
        """Raise ``ValueError`` for what sgd cannot run (``fit()`` calls it, before anything starts)."""
        if self.use_tpu and self.max_workers > 1:
            raise ValueError(
                "ScalingConfig(use_tpu=True, num_workers > 1) asks for a multi-host TPU slice, which sgd does not "
                "reserve (it has no JAX trainer). Run one worker per TPU host with resources_per_worker={'TPU': n}, "
                "or use Ray Train's JaxTrainer.")

    # --- Ray Train's read-only views -------------------------------------------------

    @property
    def elasticity_enabled(self) -> bool:
        """Whether ``num_workers`` is a ``(min, max)`` range."""
        return isinstance(self.num_workers, tuple)

    @property
    def min_workers(self) -> int:
        """The fewest workers a run goes on with (``num_workers`` when it is an int)."""
        return resolve_num_workers(self.num_workers)[0]

    @property
    def max_workers(self) -> int:
        """The most workers a run has (``num_workers`` when it is an int)."""
        return resolve_num_workers(self.num_workers)[1]

    @property
    def resources_per_worker_resolved(self) -> Dict[str, float]:
        """What one worker reserves, as sgd asks Ray for it: ``{"CPU": 1, "GPU": int(use_gpu)}``
        updated with ``resources_per_worker`` (zero amounts left out), one ``"TPU"`` with
        ``use_tpu``, and ``accelerator_type:<type>: 0.001`` with ``accelerator_type``."""
        resources = resolve_resources(self.use_gpu, self.resources_per_worker)
        if self.use_tpu:
            resources.setdefault("TPU", 1)
        if self.accelerator_type:
            resources.setdefault(f"{ACCELERATOR_RESOURCE_PREFIX}{self.accelerator_type}", 0.001)
        return {k: v for k, v in resources.items() if v}

    @property
    def total_resources(self) -> Dict[str, float]:
        """All the workers' resources together (``max_workers`` of them for an elastic range).
        sgd's driver reserves nothing (Ray Train 2.60's controller neither)."""
        return {k: v * self.max_workers for k, v in self.resources_per_worker_resolved.items()}

    @property
    def num_cpus_per_worker(self) -> float:
        """CPUs one worker reserves."""
        return self.resources_per_worker_resolved.get("CPU", 0)

    @property
    def num_gpus_per_worker(self) -> float:
        """GPUs one worker reserves."""
        return self.resources_per_worker_resolved.get("GPU", 0)

    @property
    def num_tpus_per_worker(self) -> float:
        """TPUs one worker reserves."""
        return self.resources_per_worker_resolved.get("TPU", 0)

    @property
    def additional_resources_per_worker(self) -> Dict[str, float]:
        """What one worker reserves besides CPUs and GPUs."""
        return {k: v for k, v in self.resources_per_worker_resolved.items() if k not in ("CPU", "GPU")}

    def label_selector_per_worker(self, num_workers: int) -> Optional[List[Dict[str, str]]]:
        """``label_selector`` as one dict per worker, for ``num_workers`` workers (``None``: no selector)."""
        if isinstance(self.label_selector, list):
            return [dict(s) for s in self.label_selector[:num_workers]]
        if isinstance(self.label_selector, dict):
            return [dict(self.label_selector) for _ in range(num_workers)]
        return None


@public_module("sgd.air")
@dataclass
class CheckpointConfig:
    """Which checkpoints to keep.

    :param num_to_keep: ``None`` keeps all; ``K`` keeps the K best (and the latest).
    :param checkpoint_score_attribute: a metric reported with the checkpoint
        (``sgd.report(metrics, checkpoint=...)``); ``None`` ranks by recency.
    :param checkpoint_score_order: ``"max"`` or ``"min"``.
    :param checkpoint_frequency: Ray AIR's field for trainers that run a training loop of their
        own and checkpoint it themselves (sgd-xgboost's ``XGBoostTrainer(params=...)``): a
        checkpoint every this many iterations; ``0`` (the default): none along the way. A
        :class:`DataParallelTrainer` (whose loop reports its own checkpoints) refuses a value other
        than ``0`` at ``fit()`` with ``ValueError``, as Ray's did.
    :param checkpoint_at_end: for the same trainers: a checkpoint after the last iteration
        (``None``: the trainer's default, which is yes); ``True`` is refused at ``fit()`` by a
        trainer whose loop reports its own checkpoints.
    """

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (not isinstance(self.num_to_keep, int) or self.num_to_keep < 1):
            # 0 would keep no checkpoint to resume from: Ray Train refuses it too.
            raise ValueError(f"num_to_keep must be None or an int >= 1, got {self.num_to_keep!r}")
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(f"checkpoint_score_order must be 'max' or 'min', got {self.checkpoint_score_order!r}")
        f = self.checkpoint_frequency
        if isinstance(f, bool) or not isinstance(f, int) or f < 0:
            raise ValueError(f"checkpoint_frequency must be an int >= 0 (0: no periodic checkpoints), got {f!r}")
        if self.checkpoint_at_end not in (None, True, False):
            raise ValueError(f"checkpoint_at_end must be None, True or False, got {self.checkpoint_at_end!r}")
        self.to_strategy()

    def check_for_loop_trainer(self, trainer_name: str) -> None:
        """Raise ``ValueError`` for the fields a trainer whose loop reports its own checkpoints cannot honour."""
        for name, value in (("checkpoint_frequency", self.checkpoint_frequency),
                            ("checkpoint_at_end", self.checkpoint_at_end)):
            if value:
                raise ValueError(
                    f"{trainer_name} does not support CheckpointConfig({name}={value!r}): its training loop "
                    "saves checkpoints itself, with sgd.report(metrics, checkpoint=...). Drop the argument.")

    def to_strategy(self) -> CheckpointStrategy:
        if self.checkpoint_score_attribute is None:
            return CheckpointStrategy(self.num_to_keep, "_training_iteration", "max")
        return CheckpointStrategy(self.num_to_keep, self.checkpoint_score_attribute, self.checkpoint_score_order)


@public_module("sgd.air")
@dataclass
class FailureConfig:
    """:param max_failures: worker-group failures to recover from, from the latest checkpoint;
        ``-1`` is unlimited. A failure is a worker's death or an exception the training function
        raised on a worker (Ray 2.x's rule); one count for both. Past it ``fit()`` raises
        :class:`sgd.WorkerGroupError`.
    :param placement_timeout_s: how long a (re)start waits for room for the workers (after a
        host is lost: for it or another to come back) before it fails; ``None``: 120 s
        (``SGD_PLACEMENT_TIMEOUT_S``). See :class:`sgd.Trainer`.
    :param hang_timeout_s: no worker sent anything for this long: log every worker's stack and
        the stragglers, and fail the run (retried as a worker failure). ``None``:
        ``SGD_HANG_TIMEOUT_S`` (unset: never). See :class:`sgd.Trainer`.
    :param controller_failure_limit: Ray Train 2.60's: how many times a worker group that
        could not be started (no room for the workers within the placement timeout, workers
        that died while starting) is tried again, counted apart from ``max_failures``; ``-1``
        (Ray's default): no limit, ``0``: fail at the first.
    :param max_preemption_failures: Ray Train 2.60's budget of preemptions; sgd never counts a
        host's drain as a failure (the workers move off it, see
        :func:`sgd.get_preemption_info`), which is Ray's default ``-1``. Other values are
        accepted (``>= -1``) and change nothing.
    :param relax_collectives_on_preemption: accepted for Ray Train 2.60 compatibility; sgd's
        drain handling needs no relaxed collectives (it moves the workers at a checkpoint).
    :param preemption_grace_s: accepted for Ray Train 2.60 compatibility (``>= 0``); sgd
        leaves a draining host ``SGD_DRAIN_MARGIN_S`` before its deadline.
    :param fail_fast: Ray AIR 2.x's: ``True`` or ``"raise"`` stops at the first error, so
        ``max_failures`` must be ``0`` (``ValueError`` otherwise). ``fit()`` raises the error
        either way.
    """

    max_failures: int = 0
    placement_timeout_s: Optional[float] = None
    hang_timeout_s: Optional[float] = None
    controller_failure_limit: int = -1
    max_preemption_failures: int = -1
    relax_collectives_on_preemption: bool = False
    preemption_grace_s: float = 0.0
    fail_fast: Union[bool, str] = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_failures, int) or isinstance(self.max_failures, bool) or self.max_failures < -1:
            raise ValueError(f"max_failures must be an int >= -1 (-1: unlimited), got {self.max_failures!r}")
        t = self.placement_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0):
            raise ValueError(f"placement_timeout_s must be a number of seconds >= 0 or None, got {t!r}")
        h = self.hang_timeout_s
        if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float)) or not h > 0):
            raise ValueError(f"hang_timeout_s must be a number of seconds > 0 or None, got {h!r}")
        for name in ("controller_failure_limit", "max_preemption_failures"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < -1:
                raise ValueError(f"{name} must be an int >= -1 (-1: unlimited), got {value!r}")
        if not isinstance(self.relax_collectives_on_preemption, bool):
            raise ValueError("relax_collectives_on_preemption must be True or False, "
                             f"got {self.relax_collectives_on_preemption!r}")
        g = self.preemption_grace_s
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not g >= 0:
            raise ValueError(f"preemption_grace_s must be a number of seconds >= 0, got {g!r}")
        ff = self.fail_fast
        if not (isinstance(ff, bool) or (isinstance(ff, str) and ff.upper() == "RAISE")):
            raise ValueError(f"fail_fast must be True, False or 'raise', got {ff!r}")
        if ff and self.max_failures != 0:
            raise ValueError(f"max_failures must be 0 with fail_fast={ff!r} (got {self.max_failures})")


@public_module("sgd.air")
@dataclass
class RunConfig:
    """Where and how a run is kept.

    :param name: the experiment folder's name (default ``<TrainerClass>_<timestamp>``).
    :param storage_path: a local folder (default: the results root, ``~/sgd_results`` or
        ``SGD_RESULTS_DIR``) or a storage URI (``s3://…``, any ``pyarrow.fs``/fsspec URI);
        with a URI, the run is written locally under the results root and every kept
        checkpoint is copied to ``<storage_path>/<name>/run_NNN/checkpoints/``.
    :param callbacks: :class:`sgd.TrainingCallback` objects (``sgd_loggers`` has loggers), and
        Ray Tune ``Callback`` objects, as AIR passed them to the Tune run behind ``fit()``: their
        ``on_trial_start``, ``on_trial_result`` (rank 0's report, one per round),
        ``on_trial_complete`` / ``on_trial_error`` and ``on_experiment_end`` are called with a
        :class:`TrialView` standing for the run; and Ray Train 2.x's :class:`sgd.UserCallback`
        objects (``after_report`` after every round, ``after_exception`` after every failure of
        a worker; Ray's own ``ray.train.UserCallback`` objects too, such as
        ``ray.tune.integration.ray_train.TuneReportCallback``). Anything else: ``TypeError``.
    :param local_dir: Ray AIR 2.0-2.4's name of ``storage_path``.
    :param checkpoint_config: :class:`CheckpointConfig`.
    :param failure_config: :class:`FailureConfig`.
    :param verbose: ``0`` turns sgd's live progress line off; otherwise sgd's default.
    :param storage_filesystem: Ray Train 2.60's: a ``pyarrow.fs.FileSystem`` that
        ``storage_path`` is a path on (its URI prefix stripped: ``s3://bucket/runs`` is
        ``bucket/runs``). The run is written locally and every kept checkpoint copied to
        ``<storage_path>/<name>/...`` on that filesystem through sgd's checkpoint storage, as
        for a storage URI. A ``pyarrow.fs.LocalFileSystem`` makes ``storage_path`` a local folder.
    :param worker_runtime_env: Ray Train 2.60's runtime environment of the workers. Not
        supported yet: a non-empty one is refused at ``fit()`` with ``ValueError`` (give the job
        its runtime environment with ``ray.init(runtime_env=...)``, which the workers inherit).
    :param logging_config: Ray Train 2.60's :class:`LoggingConfig`: the level of sgd's logger
        (``"sgd"``) in the driver, set when ``fit()`` starts.
    """

    name: Optional[str] = None
    storage_path: Optional[str] = None
    callbacks: Optional[Sequence[Any]] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    failure_config: Optional[FailureConfig] = None
    verbose: Optional[int] = None
    local_dir: Optional[str] = None
    storage_filesystem: Any = None
    worker_runtime_env: Optional[Dict[str, Any]] = None
    logging_config: Optional[LoggingConfig] = None

    def __post_init__(self) -> None:
        if self.local_dir is not None:  # Ray 2.0-2.4's name of storage_path
            if self.storage_path is not None and self.storage_path != self.local_dir:
                raise ValueError("RunConfig got both storage_path and local_dir (its older name); pass one")
            self.storage_path, self.local_dir = self.local_dir, None
        if self.callbacks is not None:
            accepted = ("a list of sgd.UserCallback (Ray Train 2.x's callbacks), sgd.TrainingCallback or "
                        "ray.tune.Callback objects")
            if not isinstance(self.callbacks, (list, tuple)):
                raise TypeError(f"RunConfig(callbacks=...) takes {accepted}, got {type(self.callbacks).__name__}")
            bad = [type(c).__name__ for c in self.callbacks
                   if not isinstance(c, TrainingCallback) and not is_tune_callback(c) and not is_user_callback(c)]
            if bad:
                raise TypeError(f"RunConfig(callbacks=...) takes {accepted}; got {', '.join(bad)}. Subclass "
                                "sgd.UserCallback and override after_report / after_exception.")
        if self.name is not None and (not self.name or "/" in self.name or self.name in (".", "..")):
            raise ValueError(f"RunConfig(name=...) must be a plain folder name, got {self.name!r}")
        if isinstance(self.storage_path, os.PathLike):  # Ray accepts a pathlib.Path
            self.storage_path = os.fspath(self.storage_path)
        check_storage_filesystem(self.storage_filesystem, self.storage_path)
        env = self.worker_runtime_env
        if env is not None and not isinstance(env, dict):  # ray.runtime_env.RuntimeEnv is a dict
            raise TypeError(f"RunConfig(worker_runtime_env=...) takes a dict or a ray.runtime_env.RuntimeEnv, "
                            f"got {type(env).__name__}")
        if self.logging_config is not None and not isinstance(self.logging_config, LoggingConfig):
            raise TypeError(f"RunConfig(logging_config=...) takes an sgd.LoggingConfig, "
                            f"got {type(self.logging_config).__name__}")
