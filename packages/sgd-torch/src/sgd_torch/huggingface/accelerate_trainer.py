"""``AccelerateTrainer``: an Accelerate training loop per worker, configured as ``accelerate launch`` would.

``accelerate launch`` turns an accelerate config file into environment variables that
``accelerate.Accelerator()`` reads in the launched processes. sgd launches the processes
itself, so the keys that describe the launch (how many processes, which machine, the
rendezvous address...) are sgd's business and ignored; the keys that configure training
become the same variables on every worker.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from sgd.air import RunConfig, ScalingConfig
from sgd.data import DatasetConfig
from sgd_torch.config import TorchConfig
from sgd_torch.trainer import TorchTrainer

__all__ = ["AccelerateTrainer", "HONOURED_KEYS", "IGNORED_KEYS"]

#: Keys of an accelerate config that set up training on every worker.
HONOURED_KEYS = (
    "mixed_precision",
    "use_cpu",
    "debug",
    "dynamo_config",
    "dynamo_backend",  # the older spelling of dynamo_config: {dynamo_backend: ...}
    "gradient_accumulation_steps",
    "num_cpu_threads_per_process",
    "enable_cpu_affinity",
)

#: Keys that describe the launch, which sgd does (workers, ranks, addresses), or TPUs.
IGNORED_KEYS = (
    "compute_environment",
    "distributed_type",
    "num_processes",
    "machine_rank",
    "num_machines",
    "gpu_ids",
    "main_process_ip",
    "main_process_port",
    "rdzv_backend",
    "same_network",
    "main_training_function",
    "mpirun_config",
    "downcast_bf16",
    "tpu_name",
    "tpu_zone",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "command_file",
    "commands",
    "tpu_vm",
    "tpu_env",
)

#: Keys accelerate writes as empty sections; sgd cannot honour them when they are set.
_UNSUPPORTED_SECTIONS = {
    "deepspeed_config": "DeepSpeed",
    "fsdp_config": "FSDP",
    "megatron_lm_config": "Megatron-LM",
    "fp8_config": "FP8 training",
    "parallelism_config": "a parallelism config",
}

#: distributed_type values that are plain data parallelism (what sgd sets up).
_DATA_PARALLEL_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
                        "MULTI_MUSA", "MULTI_HPU", "MULTI_NEURON")

_DYNAMO_KEYS = ("dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic",
                "dynamo_use_regional_compilation")
_DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class AccelerateTrainer(TorchTrainer):
    """Runs ``train_loop_per_worker``, an Accelerate training loop, on every worker.

    Before the loop runs on a worker, its environment is what ``accelerate launch`` would
    have given it for ``accelerate_config``, plus this worker's device, so that
    ``accelerate.Accelerator()`` inside the loop joins sgd's process group:
    ``accelerator.num_processes`` is the number of workers, ``accelerator.prepare`` shards
    data loaders and wraps the model in DDP, ``accelerator.backward`` and
    ``accelerator.gather`` go over sgd's group. Report with ``sgd.report``.

    :param accelerate_config: ``None`` (accelerate's defaults), a dict, or the path of a
        config file as ``accelerate config`` writes it (YAML, or JSON for ``.json``). The file
        is read here, on the driver. Keys in :data:`HONOURED_KEYS` are applied; keys in
        :data:`IGNORED_KEYS` are managed by sgd (workers come from ``scaling_config``);
        DeepSpeed/FSDP/Megatron-LM/FP8 sections and unknown keys raise ``ValueError``.
        :attr:`accelerate_env` shows the variables the workers get.
    Other arguments as :class:`sgd_torch.TorchTrainer`.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: Optional[Dict[str, Any]] = None,
        accelerate_config: Union[None, Dict[str, Any], str, os.PathLike] = None,
        scaling_config: Optional[ScalingConfig] = None,
        torch_config: Optional[TorchConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        resume_from_checkpoint: Any = None,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
        metadata: Optional[Dict[str, Any]] = None,
    ):
        from sgd.utils import wrap_train_func

        if not callable(train_loop_per_worker):
            raise TypeError(f"train_loop_per_worker must be a function, got {type(train_loop_per_worker).__name__}")
        wrap_train_func(train_loop_per_worker, train_loop_config)  # its signature, checked now
        config = load_accelerate_config(accelerate_config)
        env, _ = accelerate_env(config)
        if env.get("ACCELERATE_USE_CPU") == "true" and scaling_config is not None and scaling_config.use_gpu:
            raise ValueError("accelerate_config has use_cpu: true, but ScalingConfig(use_gpu=True) gives the workers "
                             "GPUs (and an NCCL process group); drop one of the two")
        self.train_loop_function = train_loop_per_worker
        self.accelerate_config = config
        #: The environment variables every worker gets from ``accelerate_config``.
        self.accelerate_env = env
        super().__init__(
            _loop(train_loop_per_worker, config),
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            torch_config=torch_config,
            run_config=run_config,
            datasets=datasets,
            resume_from_checkpoint=resume_from_checkpoint,
            dataset_config=dataset_config,
            metadata=metadata,
        )

    @classmethod
    def restore(cls, path: Any, train_loop_per_worker: Optional[Callable[..., Any]] = None,
                train_loop_config: Optional[Dict[str, Any]] = None, datasets: Optional[Dict[str, Any]] = None,
                trusted: Optional[bool] = None, **overrides: Any) -> AccelerateTrainer:
        """A trainer that continues the run in ``path`` (see :meth:`sgd.DataParallelTrainer.restore`).

        A new ``train_loop_per_worker`` runs under the saved ``accelerate_config``;
        ``accelerate_config`` itself cannot be replaced (:class:`TypeError`).
        """
        if "accelerate_config" in overrides:
            raise TypeError(f"{cls.__name__}.restore() cannot change accelerate_config; start a new run")
        if train_loop_per_worker is not None:  # the loop is rebuilt from it below: the saved one is not read
            overrides.update(train_loop_function=train_loop_per_worker, train_loop_per_worker=train_loop_per_worker)
        trainer = super().restore(path, train_loop_config=train_loop_config, datasets=datasets, trusted=trusted,
                                  **overrides)
        assert isinstance(trainer, AccelerateTrainer)
        if train_loop_per_worker is not None:
            from sgd.utils import wrap_train_func

            wrap_train_func(train_loop_per_worker, trainer.train_loop_config)  # its signature, checked now
            trainer.train_loop_function = train_loop_per_worker
            trainer.train_loop_per_worker = _loop(train_loop_per_worker, trainer.accelerate_config)
        return trainer


def _loop(train_loop_per_worker: Callable[..., Any], config: Dict[str, Any]) -> Callable[..., Any]:
    """``train_loop_per_worker`` run under the environment ``config`` gives."""
    env, num_threads = accelerate_env(config)
    return functools.partial(_train_loop_per_worker, train_loop_per_worker, env, num_threads)


# --- the config -----------------------------------------------------------------------------


def load_accelerate_config(config: Union[None, Mapping[str, Any], str, os.PathLike]) -> Dict[str, Any]:
    """The accelerate config as a dict: ``None`` → ``{}``, a dict as is, a path read (YAML or JSON)."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(f"accelerate_config must be None, a dict or the path of an accelerate config file, "
                        f"got {type(config).__name__}")
    path = os.path.expanduser(os.fspath(config))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"accelerate_config: no file at {path} (write one with `accelerate config "
                                f"--config_file {path}`, or pass a dict)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        if path.endswith(".json"):
            loaded = json.loads(text)
        else:
            import yaml

            loaded = yaml.safe_load(text)
    except Exception as exc:  # yaml.YAMLError, json.JSONDecodeError
        raise ValueError(f"accelerate_config: {path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: "
                         f"{exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError(f"accelerate_config: {path} must hold a mapping of keys, got a {type(loaded).__name__}")
    return loaded


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"accelerate_config: {key} must be true or false, got {value!r}")
    return value


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"accelerate_config: {key} must be an int >= 1, got {value!r}")
    return value


def _choice(key: str, value: Any, choices: Tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"accelerate_config: {key} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _check_sections(config: Mapping[str, Any]) -> None:
    for key, what in _UNSUPPORTED_SECTIONS.items():
        if config.get(key):
            raise ValueError(f"accelerate_config: {key} is set, but sgd's AccelerateTrainer does not set up {what}; "
                             f"remove {key} (sgd runs plain data parallelism over its process group)")
    if config.get("compute_environment", "LOCAL_MACHINE") != "LOCAL_MACHINE":
        raise ValueError(f"accelerate_config: compute_environment {config['compute_environment']!r} is not "
                         "supported; sgd launches the workers on Ray (use LOCAL_MACHINE or leave it out)")
    distributed_type = config.get("distributed_type")
    if distributed_type is not None:
        from accelerate.utils import DistributedType

        known = [t.value for t in DistributedType]
        if distributed_type not in known:
            raise ValueError(f"accelerate_config: unknown distributed_type {distributed_type!r}; accelerate knows "
                             f"{', '.join(known)}")
        if distributed_type not in _DATA_PARALLEL_TYPES:
            raise ValueError(f"accelerate_config: distributed_type {distributed_type} is not supported by sgd's "
                             "AccelerateTrainer, which runs data parallelism over its own process group "
                             f"(accepted and ignored: {', '.join(_DATA_PARALLEL_TYPES)})")


def _dynamo_env(dynamo: Any) -> Dict[str, str]:
    if dynamo is None:
        return {}
    if not isinstance(dynamo, Mapping):
        raise ValueError(f"accelerate_config: dynamo_config must be a mapping, got {dynamo!r}")
    unknown = sorted(set(dynamo) - set(_DYNAMO_KEYS))
    if unknown:
        raise ValueError(f"accelerate_config: unknown dynamo_config keys {unknown}; known: {', '.join(_DYNAMO_KEYS)}")
    env: Dict[str, str] = {}
    if "dynamo_backend" in dynamo:
        from accelerate.utils import DynamoBackend

        backends = tuple(b.value for b in DynamoBackend)
        backend = dynamo["dynamo_backend"]
        env["ACCELERATE_DYNAMO_BACKEND"] = _choice(
            "dynamo_config.dynamo_backend", backend.upper() if isinstance(backend, str) else backend, backends)
    if "dynamo_mode" in dynamo:
        env["ACCELERATE_DYNAMO_MODE"] = _choice("dynamo_config.dynamo_mode", dynamo["dynamo_mode"], _DYNAMO_MODES)
    for key, name in (("dynamo_use_fullgraph", "USE_FULLGRAPH"), ("dynamo_use_dynamic", "USE_DYNAMIC"),
                      ("dynamo_use_regional_compilation", "USE_REGIONAL_COMPILATION")):
        if key in dynamo:
            env[f"ACCELERATE_DYNAMO_{name}"] = str(_bool(f"dynamo_config.{key}", dynamo[key]))
    return env


def accelerate_env(config: Mapping[str, Any]) -> Tuple[Dict[str, str], Optional[int]]:
    """The environment variables ``accelerate launch`` would set for ``config``, and the
    torch thread count (``num_cpu_threads_per_process``) or ``None``.

    :raises ValueError: an unknown key, a bad value, or a setting sgd cannot honour.
    """
    known = set(HONOURED_KEYS) | set(IGNORED_KEYS) | set(_UNSUPPORTED_SECTIONS)
    unknown = sorted(str(key) for key in config if key not in known)
    if unknown:
        raise ValueError(f"accelerate_config: unknown keys {unknown}. Honoured: {', '.join(HONOURED_KEYS)}; "
                         f"managed by sgd (ignored): {', '.join(IGNORED_KEYS)}")
    _check_sections(config)
    env: Dict[str, str] = {}
    precision = config.get("mixed_precision")
    if precision is False:  # YAML reads an unquoted `no` as false
        precision = "no"
    if precision is not None:
        precision = precision.lower() if isinstance(precision, str) else precision
        if precision == "fp8":
            raise ValueError("accelerate_config: mixed_precision fp8 needs an FP8 recipe sgd does not set up; "
                             "pass mixed_precision='fp8' and its kwargs_handlers to Accelerator() in the loop")
        env["ACCELERATE_MIXED_PRECISION"] = _choice("mixed_precision", precision, ("no", "fp16", "bf16"))
    if _bool("use_cpu", config.get("use_cpu", False)):
        env["ACCELERATE_USE_CPU"] = "true"
    if _bool("debug", config.get("debug", False)):
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if _bool("enable_cpu_affinity", config.get("enable_cpu_affinity", False)):
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    dynamo = config.get("dynamo_config")
    if "dynamo_backend" in config:  # accelerate's older top-level spelling
        if dynamo:
            raise ValueError("accelerate_config: give dynamo_backend inside dynamo_config, not both")
        dynamo = {"dynamo_backend": config["dynamo_backend"]}
    env.update(_dynamo_env(dynamo))
    if config.get("gradient_accumulation_steps") is not None:
        steps = _positive_int("gradient_accumulation_steps", config["gradient_accumulation_steps"])
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(steps)
    num_threads = None
    if config.get("num_cpu_threads_per_process") is not None:
        num_threads = _positive_int("num_cpu_threads_per_process", config["num_cpu_threads_per_process"])
        env["OMP_NUM_THREADS"] = str(num_threads)
    return env, num_threads


# --- on the workers -----------------------------------------------------------------------


def _train_loop_per_worker(train_loop_per_worker: Callable[..., Any], env: Dict[str, str],
                           num_threads: Optional[int], config: Dict[str, Any]) -> Any:
    from sgd.utils import wrap_train_func
    from sgd_torch.huggingface._worker import worker_environment

    with worker_environment(env, num_threads=num_threads):
        return wrap_train_func(train_loop_per_worker, config)()
