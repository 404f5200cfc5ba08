"""The ``"xgboost"`` and ``"lightgbm"`` backends: what makes N sgd workers one boosting job.

**XGBoost** trains through its collective communicator, which belongs to the thread that
joined it. Before each run the backend starts a ``RabitTracker`` on the driver's node (one per
run: a tracker serves one communication group) and hands every worker the tracker's address.
Every training function then runs inside XGBoost's communicator on its own thread (through
:func:`sgd.backend.on_worker_run`), so ``xgboost.train(...)`` in it is one distributed job.
When the function raises, the worker signals the error to the tracker, which makes the other
workers' collective calls fail at once instead of waiting for the missing peer.

**LightGBM** connects its workers itself, through sockets: before each run every worker finds a
free port on its own node and the backend gives all of them the ``machines`` list;
:func:`get_network_params` in the training function returns the parameters to pass to
``lightgbm.train``.

Nothing here imports XGBoost or LightGBM at module level: the plugin is loaded by every
sgd process, and the frameworks are needed on the workers only.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

import ray

import sgd
from sgd.backend import (
    Backend,
    BackendConfig,
    free_address,
    on_worker_run,
    on_worker_run_error,
    remove_worker_run,
)
from sgd.errors import PeerFailureError

if TYPE_CHECKING:
    from sgd.backend import Workers

logger = logging.getLogger("sgd.xgboost")

__all__ = ["XGBoostConfig", "LightGBMConfig", "XGBoostPeerError", "get_network_params"]


@dataclass
class XGBoostConfig(BackendConfig):
    """Configuration of the ``"xgboost"`` backend.

    :param tracker_host: the address the workers reach XGBoost's tracker at; ``None``: the
        driver's node IP (the tracker runs in the driver process).
    :param tracker_port: the tracker's port; ``0`` (the default) picks a free one. A port that
        is in use fails the run's start with a ``RuntimeError`` naming it.
    :param timeout_s: how long the tracker waits for all workers to join, and at the end of a
        run for all of them to leave (XGBoost's tracker ``timeout``); ``0`` waits forever.
    :param communicator_timeout_s: XGBoost's ``dmlc_timeout``: how long one collective
        operation may wait for a peer; ``None`` keeps XGBoost's default.
    :param xgboost_communicator: Ray Train's name of the collective: ``"rabit"``, the only one
        (XGBoost's tracker), as in Ray 2.60. Pass it by keyword (the fields above come first).
    """

    tracker_host: Optional[str] = None
    tracker_port: int = 0
    timeout_s: int = 300
    communicator_timeout_s: Optional[int] = None
    xgboost_communicator: str = "rabit"

    def __post_init__(self) -> None:
        if self.xgboost_communicator != "rabit":
            raise ValueError(f"XGBoostConfig(xgboost_communicator={self.xgboost_communicator!r}) is not supported: "
                             "'rabit' (XGBoost's tracker) is the only communicator, as in Ray Train")
        if not isinstance(self.tracker_port, int) or not 0 <= self.tracker_port < 65536:
            raise ValueError(f"XGBoostConfig(tracker_port={self.tracker_port!r}) must be a port number (0: any free)")
        if not isinstance(self.timeout_s, int) or self.timeout_s < 0:
            raise ValueError(f"XGBoostConfig(timeout_s={self.timeout_s!r}) must be an int >= 0 (0: no timeout)")
        t = self.communicator_timeout_s
        if t is not None and (not isinstance(t, int) or t <= 0):
            raise ValueError(f"XGBoostConfig(communicator_timeout_s={t!r}) must be a positive int or None")

    @property
    def backend_cls(self) -> type:
        return _XGBoostBackend

    @property
    def name(self) -> str:
        return "xgboost"


@dataclass
class LightGBMConfig(BackendConfig):
    """Configuration of the ``"lightgbm"`` backend.

    :param time_out_min: LightGBM's socket ``time_out`` (minutes) for the workers' connections.
    """

    time_out_min: int = 120

    def __post_init__(self) -> None:
        if not isinstance(self.time_out_min, int) or self.time_out_min <= 0:
            raise ValueError(f"LightGBMConfig(time_out_min={self.time_out_min!r}) must be a positive int")

    @property
    def backend_cls(self) -> type:
        return _LightGBMBackend

    @property
    def name(self) -> str:
        return "lightgbm"


# --- on the workers: XGBoost ------------------------------------------------------

_lock = threading.Lock()
#: the communicator arguments of the next run on this worker (set by the driver before each run)
_comm_args: Optional[Dict[str, Any]] = None


class XGBoostPeerError(PeerFailureError):
    """A collective call of XGBoost failed on this worker because another worker stopped (its
    error was signalled, or its process died). As a :class:`sgd.errors.PeerFailureError`, sgd
    reads it as the echo of another worker's failure: the driver restarts the group when that
    worker died, or reports that worker's own error instead of this one."""


#: what XGBoost's errors say when a collective call lost its peers
_COLLECTIVE_FAILURE = ("allreduce", "allgather", "broadcast", "poll error", "failed to recv", "failed to send",
                       "connection reset", "socket")


def _peer_error(exc: BaseException) -> Optional[XGBoostPeerError]:
    if type(exc).__name__ != "XGBoostError":
        return None
    text = str(exc)
    if not any(marker in text.lower() for marker in _COLLECTIVE_FAILURE):
        return None
    detail = next((line.strip("- ").strip() for line in text.splitlines() if line.strip().startswith("- [")), "")
    return XGBoostPeerError(f"worker rank {sgd.world_rank()}: XGBoost's collective call failed because another "
                            f"worker stopped (its own error or death is the cause): {detail}")


def _root_cause(exc: BaseException) -> str:
    """The last of XGBoost's ``- [file:line|time]: reason`` lines (the innermost reason, without
    the native stack trace that follows), else the first line of the message."""
    text = str(exc)
    reasons = [line.strip()[2:] for line in text.splitlines() if line.strip().startswith("- [")]
    if not reasons:
        return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return re.sub(r"^\[[^\]]*\]:\s*", "", reasons[-1])


def _set_comm_args(args: Optional[Dict[str, Any]]) -> None:
    global _comm_args
    with _lock:
        _comm_args = args


@contextlib.contextmanager
def _xgboost_communicator() -> Iterator[None]:
    """Around a training function: join this run's communication group, leave it at the end."""
    global _comm_args
    with _lock:
        args, _comm_args = _comm_args, None
    if args is None:  # not a run of the xgboost backend (a local-mode group, another trainer)
        yield
        return
    from xgboost import collective

    try:
        collective.init(**args)
    except Exception as exc:
        raise RuntimeError(
            f"worker rank {sgd.world_rank()} could not join XGBoost's tracker at "
            f"{args.get('dmlc_tracker_uri')}:{args.get('dmlc_tracker_port')} ({_root_cause(exc)}). Is the driver's "
            "node reachable from this worker? Set XGBoostConfig(tracker_host=...) to an address it can reach."
        ) from exc
    try:
        yield
    except BaseException as exc:
        # The peers are (or will be) waiting for this worker in a collective call: tell the
        # tracker, which makes their calls fail now rather than at a timeout.
        try:
            collective.signal_error()
        except Exception:
            logger.debug("signalling XGBoost's tracker failed", exc_info=True)
        echo = _peer_error(exc)
        if echo is not None:
            raise echo from exc
        raise
    finally:
        try:
            collective.finalize()
        except Exception:
            logger.warning("leaving XGBoost's communication group failed", exc_info=True)


def _register_xgboost_worker() -> None:
    on_worker_run(_xgboost_communicator)


def _unregister_xgboost_worker() -> None:
    _set_comm_args(None)
    remove_worker_run(_xgboost_communicator)


# --- on the driver: XGBoost -------------------------------------------------------


def _start_tracker(n_workers: int, config: XGBoostConfig) -> Any:
    from xgboost.tracker import RabitTracker

    host = config.tracker_host or ray.util.get_node_ip_address()
    try:
        tracker = RabitTracker(n_workers=n_workers, host_ip=host, port=config.tracker_port, sortby="task",
                               timeout=config.timeout_s)
        tracker.start()
    except Exception as exc:
        reason = _root_cause(exc)
        if config.tracker_port:
            raise RuntimeError(
                f"cannot start XGBoost's tracker on {host}:{config.tracker_port} ({reason}). Is the port in use? "
                "Pass XGBoostConfig(tracker_port=0) to let the system pick a free one."
            ) from exc
        raise RuntimeError(f"cannot start XGBoost's tracker on {host}: {reason}") from exc
    return tracker


def _close_tracker(tracker: Any, wait_s: float) -> None:
    """Wait (up to ``wait_s``) for a tracker whose run ended, then release it; never raises.

    XGBoost's ``free`` waits for the tracker's thread, which waits for every worker to join and
    leave, up to the tracker's own timeout (``XGBoostConfig.timeout_s``, 300 s). A tracker some
    worker never joined (a run that failed before every training function started) would hold
    the driver that long: one that did not end within ``wait_s`` is freed on a daemon thread."""
    ended = False
    if wait_s > 0:
        try:
            tracker.wait_for(max(1, int(wait_s)))
            ended = True
        except Exception as exc:  # the run failed, or a worker never said goodbye
            logger.debug("XGBoost's tracker did not end cleanly: %s", exc)
    if ended:
        _free_tracker(tracker)
    else:
        threading.Thread(target=_free_tracker, args=(tracker,), name="sgd-xgboost-free-tracker", daemon=True).start()


def _free_tracker(tracker: Any) -> None:
    try:
        tracker.free()
    except Exception as exc:  # a tracker whose group failed complains when freed
        logger.debug("freeing XGBoost's tracker: %s", exc)


class _XGBoostBackend(Backend):
    """One tracker per run, on the driver; the workers join it from their training thread."""

    preload_modules = ("xgboost",)

    def __init__(self) -> None:
        self._tracker: Any = None

    def on_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        worker_group.execute(_register_xgboost_worker)

    def on_training_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, XGBoostConfig)
        self._release(wait_s=10)  # the previous run's workers have all left it by now
        n = len(worker_group)
        tracker = _start_tracker(n, backend_config)
        args = tracker.worker_args()
        if backend_config.communicator_timeout_s is not None:
            args["dmlc_timeout"] = backend_config.communicator_timeout_s
        # sortby="task" with zero-padded ranks: XGBoost's rank is sgd's world rank.
        ray.get([worker_group.execute_single_async(rank, _set_comm_args, {**args, "dmlc_task_id": f"{rank:08d}"})
                 for rank in range(n)])
        self._tracker = tracker

    def on_failure(self, worker_group: Workers, backend_config: BackendConfig, error: BaseException) -> None:
        self._release(wait_s=0)

    def on_shutdown(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        self._release(wait_s=10)
        worker_group.execute(_unregister_xgboost_worker)

    def reuses_processes(self, backend_config: BackendConfig) -> bool:
        """Each run joins a tracker of its own, and shutdown unregisters the worker: a process
        can serve another group (sgd.keep_workers)."""
        return isinstance(backend_config, XGBoostConfig)

    def _release(self, wait_s: float) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            _close_tracker(tracker, wait_s)


# --- on the workers: LightGBM -----------------------------------------------------

#: this worker's LightGBM network parameters for the current run
_network_params: Dict[str, Any] = {}


def get_network_params() -> Dict[str, Any]:
    """Inside a training function of the ``"lightgbm"`` backend: the parameters that make
    ``lightgbm.train`` on this worker part of one distributed job (``machines``,
    ``local_listen_port``, ``num_machines``, ``time_out``); merge them into your ``params``
    together with ``tree_learner="data"``.

    ``{}`` where there is nothing to connect: with one worker, in local mode
    (``ScalingConfig(num_workers=0)``), and outside a ``"lightgbm"`` run, where it also logs a
    warning (Ray Train 2.60's ``ray.train.lightgbm.get_network_params`` does the same), so the
    same training function runs alone too.
    """
    with _lock:
        params = dict(_network_params)
    if not params:
        logger.warning(
            "sgd_xgboost.get_network_params() was called outside a training function of the 'lightgbm' backend "
            "(Trainer(backend='lightgbm') or sgd_xgboost.LightGBMTrainer): returning {} (LightGBM trains alone). "
            "Call it inside the training loop of a LightGBMTrainer to train on all workers together.")
        return {}
    return {} if params.get("num_machines", 1) <= 1 else params


def _set_network_params(params: Dict[str, Any]) -> None:
    with _lock:
        _network_params.clear()
        _network_params.update(params)


def _free_lightgbm_network() -> None:
    """After a failed run: close this worker's LightGBM sockets, so that its peers' reads
    fail at once (their sockets see the connection close) rather than after ``time_out``."""
    import sys

    lightgbm = sys.modules.get("lightgbm")
    if lightgbm is None:
        return
    try:
        lightgbm.basic._LIB.LGBM_NetworkFree()
    except Exception:
        logger.debug("LGBM_NetworkFree failed", exc_info=True)


def _register_lightgbm_worker() -> None:
    on_worker_run_error(_free_lightgbm_network)


# --- on the driver: LightGBM ------------------------------------------------------


def machines_for(addresses: List[Any]) -> str:
    """LightGBM's ``machines`` parameter for workers listening at ``(ip, port)`` pairs."""
    return ",".join(f"{_lightgbm_ip(ip)}:{port}" for ip, port in addresses)


def _lightgbm_ip(ip: str) -> str:
    """The address LightGBM is given for a worker on the node at ``ip``.

    LightGBM finds its own rank by looking for one of its interfaces' addresses (with its port)
    in ``machines`` ("Machine list file doesn't contain the local machine" otherwise). A node
    whose Ray address is a loopback alias (``127.0.0.3``: several Ray nodes on one machine, the
    three-host test fixture) has no interface with that address, only ``127.0.0.1``; every
    worker that can reach a loopback address is on that machine, so ``127.0.0.1`` is the same
    place for all of them. LightGBM listens on all interfaces, so the port is the same.
    """
    return "127.0.0.1" if ip.startswith("127.") else ip


class _LightGBMBackend(Backend):
    """Fresh listen ports for every run (a port of the previous run may still be closing)."""

    preload_modules = ("lightgbm",)

    def on_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        worker_group.execute(_register_lightgbm_worker)

    def reuses_processes(self, backend_config: BackendConfig) -> bool:
        """Each run gets fresh network parameters and ports: a process can serve another group
        (sgd.keep_workers)."""
        return isinstance(backend_config, LightGBMConfig)

    def on_training_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, LightGBMConfig)
        n = len(worker_group)
        found = ray.get([worker_group.execute_single_async(rank, free_address) for rank in range(n)])
        machines = machines_for(found)
        ray.get([
            worker_group.execute_single_async(rank, _set_network_params, {
                "machines": machines,
                "local_listen_port": port,
                "num_machines": n,
                "time_out": backend_config.time_out_min,
            })
            for rank, (_ip, port) in enumerate(found)
        ])
