"""Checks of boosting parameters against the workers they will run on (on the driver)."""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from sgd.air import ScalingConfig

logger = logging.getLogger("sgd.xgboost")

_XGB_THREADS = ("nthread", "n_jobs")
_LGB_THREADS = ("num_threads", "num_thread", "nthread", "nthreads", "n_jobs")
_LGB_LEARNER = ("tree_learner", "tree", "tree_type", "tree_learner_type")
_LGB_DEVICE = ("device_type", "device")


def cpus_per_worker(scaling: ScalingConfig) -> int:
    resources = scaling.resources_per_worker or {}
    return max(1, int(resources.get("CPU", 1)))


def gpus_per_worker(scaling: ScalingConfig) -> float:
    resources = scaling.resources_per_worker
    if resources is not None and "GPU" in resources:
        return float(resources["GPU"])
    return 1.0 if scaling.use_gpu else 0.0


def max_workers(scaling: ScalingConfig) -> int:
    n = scaling.num_workers
    return n[1] if isinstance(n, tuple) else n


def _threads(params: Dict[str, Any], aliases: tuple, cpus: int, framework: str) -> Dict[str, Any]:
    """One thread setting, at most the worker's CPUs (a warning says when one was lowered)."""
    given = [(k, params[k]) for k in aliases if params.get(k) is not None]
    out = {k: v for k, v in params.items() if k not in aliases or params.get(k) is None}
    key = given[0][0] if given else aliases[0]
    value = given[0][1] if given else cpus
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{framework} parameter {key}={value!r} must be an int")
    if value <= 0 or value > cpus:
        logger.warning("%s parameter %s=%s does not fit the %d CPU(s) each worker reserves "
                       "(ScalingConfig.resources_per_worker); using %s=%d instead", framework, key, value, cpus,
                       key, cpus)
        value = cpus
    out[key] = value
    return out


def xgboost_params(params: Optional[Dict[str, Any]], scaling: ScalingConfig) -> Dict[str, Any]:
    """``params`` checked and completed for distributed XGBoost on ``scaling``'s workers.

    :raises ValueError: a GPU is asked for (``device="cuda"``, ``tree_method="gpu_hist"``)
        and the workers have none, or ``tree_method="exact"`` (not distributed by XGBoost).
    """
    out = dict(params or {})
    gpus = gpus_per_worker(scaling)
    device = str(out.get("device", "") or "")
    wants_gpu = device.startswith(("cuda", "gpu")) or out.get("tree_method") == "gpu_hist" or \
        str(out.get("predictor", "")).startswith("gpu")
    if wants_gpu and gpus <= 0:
        raise ValueError(
            f"XGBoost params ask for a GPU (device={out.get('device')!r}, tree_method={out.get('tree_method')!r}) "
            "but the workers have none: pass ScalingConfig(use_gpu=True), or device='cpu'")
    if gpus > 0 and not device:
        out["device"] = "cuda"
    if out.get("tree_method") == "exact":
        raise ValueError("XGBoost's tree_method='exact' does not train across workers; use 'hist' (the default) "
                         "or 'approx'")
    return _threads(out, _XGB_THREADS, cpus_per_worker(scaling), "XGBoost")


def lightgbm_params(params: Optional[Dict[str, Any]], scaling: ScalingConfig) -> Dict[str, Any]:
    """``params`` checked and completed for distributed LightGBM on ``scaling``'s workers.

    :raises ValueError: a GPU device without GPUs, a tree learner that does not split the data
        across workers (``serial``, ``feature``) with several workers, or network parameters
        (``machines``...), which the backend sets.
    """
    out = dict(params or {})
    set_by_backend = [k for k in ("machines", "local_listen_port", "num_machines", "machine_list_filename")
                      if k in out]
    if set_by_backend:
        raise ValueError(f"LightGBM params {set_by_backend} are set by the 'lightgbm' backend for each run; "
                         "leave them out")
    device = next((str(out[k]) for k in _LGB_DEVICE if k in out), "cpu")
    if device in ("gpu", "cuda") and gpus_per_worker(scaling) <= 0:
        raise ValueError(f"LightGBM params ask for a GPU (device_type={device!r}) but the workers have none: "
                         "pass ScalingConfig(use_gpu=True), or device_type='cpu'")
    learner_key = next((k for k in _LGB_LEARNER if k in out), "tree_learner")
    learner = str(out.get(learner_key, "data"))
    if max_workers(scaling) > 1 and learner in ("serial", "feature", "feature_parallel"):
        raise ValueError(
            f"LightGBM {learner_key}={learner!r} does not train one model on data split across "
            f"{max_workers(scaling)} workers: use 'data' (the default here) or 'voting'")
    out[learner_key] = learner
    out.setdefault("pre_partition", True)  # each worker holds its own part of the rows
    out.setdefault("verbose", -1)
    return _threads(out, _LGB_THREADS, cpus_per_worker(scaling), "LightGBM")
