"""Helpers for plugin authors and embedding libraries: what sgd's own trainers use to
start Ray, bind a training function to its config and check worker counts and resources.

These are public (plugins must not import ``sgd.storage`` or ``sgd._common``): sgd-tune, the
Hugging Face trainers and ``sgd run`` use them.
"""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

logger = logging.getLogger("sgd")

__all__ = ["ensure_ray", "wrap_train_func", "resolve_num_workers", "resolve_resources", "results_root"]


def ensure_ray() -> None:
    """Start an embedded local Ray cluster unless Ray is already initialised.

    ``RAY_ADDRESS`` connects to a cluster instead. Without it the cluster is always a
    new embedded one (``address="local"``): a bare ``ray.init()`` would join any cluster
    that another program started on this machine with ``ray start``.
    """
    import ray

    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or "local"
        check_head_reachable(address)
        # The dashboard costs seconds at start and memory; opt in with SGD_RAY_DASHBOARD=1.
        ray.init(
            address=address,
            include_dashboard=os.environ.get("SGD_RAY_DASHBOARD", "0") == "1",
        )


def check_head_reachable(address: str, timeout: Optional[float] = None) -> None:
    """Fail fast, naming the address, when a ``host:port`` Ray head does not accept a TCP
    connection (Ray itself retries for minutes). ``local``, ``auto`` and ``ray://`` addresses
    are left to Ray.

    :raises ConnectionError: nothing answers at ``address`` within ``timeout`` seconds
        (``SGD_CONNECT_TIMEOUT_S``, default 10).
    """
    import socket

    if address in ("local", "auto") or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        port_number = int(port)
    except ValueError:
        raise ValueError(f"RAY_ADDRESS={address!r} is not host:port (or 'auto', 'local', ray://...)") from None
    wait = float(os.environ.get("SGD_CONNECT_TIMEOUT_S", "10")) if timeout is None else timeout
    try:
        with socket.create_connection((host.strip("[]"), port_number), timeout=wait):
            return
    except OSError as exc:
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        raise ConnectionError(
            f"cannot reach the Ray head at {address} (RAY_ADDRESS): {reason}. Start it there with "
            f"`ray start --head --port={port_number}`, or point RAY_ADDRESS at the running head "
            "(`ray status` on the head prints its address); unset RAY_ADDRESS for a local Ray."
        ) from None


def wrap_train_func(train_func: Callable[..., Any], config: Any) -> Callable[[], Any]:
    """Check ``train_func`` takes zero or one argument and bind ``config or {}`` to it.

    :raises ValueError: ``train_func`` needs two or more arguments.
    :raises TypeError: ``train_func`` is not callable.
    """
    if not callable(train_func):
        raise TypeError(f"train_func must be callable, got {type(train_func).__name__}")
    params: List[inspect.Parameter]
    try:
        params = list(inspect.signature(train_func).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: call with no argument
        params = []
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    takes_any = any(p.kind is p.VAR_POSITIONAL for p in params)
    takes_one = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) or takes_any
    if len(positional) > 1:
        name = getattr(train_func, "__name__", repr(train_func))
        raise ValueError(
            f"train_func {name!r} takes {len(positional)} required arguments "
            f"({', '.join(p.name for p in positional)}); it must take none or one (config)."
        )
    return BoundTrainFunc(train_func, (config if config is not None else {},) if takes_one else ())


class BoundTrainFunc:
    """A training function with its arguments bound (:func:`wrap_train_func`). A class of
    sgd's, not a closure: it travels to the workers by reference, so that each of them rebuilds
    only the user's function from its pickle, not a second function around it, at every run."""

    __slots__ = ("func", "args")

    def __init__(self, func: Callable[..., Any], args: Tuple[Any, ...]):
        self.func = func
        self.args = args

    def __call__(self) -> Any:
        return self.func(*self.args)


def results_root() -> Path:
    """Where runs go by default: ``$SGD_RESULTS_DIR`` or ``~/sgd_results``."""
    return Path(os.environ.get("SGD_RESULTS_DIR") or "~/sgd_results").expanduser()


def resolve_num_workers(num_workers: Any) -> Tuple[int, int]:
    """``(min, max)`` workers from ``num_workers`` (a positive int, or a ``(min, max)`` tuple;
    ``0``: local mode, the training function in the driver's process).

    :raises ValueError: not an int >= 0, or not ``0 < min <= max``.
    """
    def ok(n: Any) -> bool:
        return isinstance(n, int) and not isinstance(n, bool) and n > 0

    if isinstance(num_workers, tuple):
        if len(num_workers) != 2 or not all(ok(n) for n in num_workers) or num_workers[0] > num_workers[1]:
            raise ValueError(f"num_workers as a tuple must be (min, max) with 0 < min <= max, got {num_workers!r}")
        return num_workers
    if num_workers == 0 and isinstance(num_workers, int) and not isinstance(num_workers, bool):
        return 0, 0
    if not ok(num_workers):
        raise ValueError(f"num_workers must be a positive int (or 0: local mode, in this process) or a (min, max) "
                         f"tuple, got {num_workers!r}")
    return num_workers, num_workers


def resolve_resources(use_gpu: bool, resources_per_worker: Optional[Dict[str, float]]) -> Dict[str, float]:
    """The Ray resources of one worker: ``{"CPU": 1, "GPU": int(use_gpu)}`` updated with
    ``resources_per_worker`` (which is not changed).

    :raises ValueError: a negative or non-numeric amount, or GPUs that disagree with ``use_gpu``.
    """
    resources: Dict[str, float] = {"CPU": 1, "GPU": int(use_gpu)}
    resources.update(resources_per_worker or {})  # a copy: the caller's dict is never changed
    for key, value in resources.items():
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"resources_per_worker[{key!r}] must be a number >= 0, got {value!r}")
    if not use_gpu and resources["GPU"] > 0:
        raise ValueError(
            f"resources_per_worker asks for {resources['GPU']} GPU(s) but use_gpu=False; pass use_gpu=True "
            "or drop 'GPU' from resources_per_worker."
        )
    if use_gpu and resources["GPU"] == 0:
        raise ValueError("use_gpu=True but resources_per_worker sets 'GPU' to 0; set it above 0 or use_gpu=False.")
    return resources
