"""``HorovodConfig`` and the backend that makes sgd's workers one Horovod (Gloo) job.

The driver runs Horovod's HTTP rendezvous server and gives every worker the
environment that ``horovodrun`` would have given it (``HOROVOD_RANK``..., the
rendezvous address, the Gloo controller, the network interface), so
``hvd.init()`` in a training function needs no arguments and no MPI.

Nothing here imports Horovod or torch at module level: the plugin is loaded by
every process that uses sgd.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
from dataclasses import InitVar, dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

import ray

from sgd.backend import Backend, BackendConfig
from sgd_horovod._horovod import INSTALL_HINT, require_horovod
from sgd_horovod.in_place import install as install_in_place
from sgd_horovod.rendezvous import RendezvousService, Slot, choose_interfaces, network_info, slot_plan
from sgd_torch import TorchBackend

if TYPE_CHECKING:
    from sgd.backend import Workers

logger = logging.getLogger("sgd.horovod")

#: How long teardown waits for the workers' ``hvd.shutdown()``.
SHUTDOWN_TIMEOUT_S = 10.0


@dataclass
class HorovodConfig(BackendConfig):
    """Configuration of the ``"horovod"`` backend (Horovod over Gloo, no MPI).

    :param nics: network interfaces Gloo may use (``{"eth0"}``, ``["ib0", "eth0"]`` or
        ``"eth0"``); each worker uses the first one its node has. ``None`` picks the
        loopback interface when every worker is on one node, else the interface that
        holds the worker's Ray node IP.
    :param verbose: ``0`` quiet; ``1`` log the rendezvous address at setup; ``2`` also
        the rendezvous server's own log lines and the slot plan.
    :param key: secret handed to the workers as Horovod's ``_HOROVOD_SECRET_KEY``
        (``None``: a new random one per setup). It is not written to the run
        directory's ``trainer.json``. Horovod's Gloo rendezvous itself is not
        authenticated, like ``horovodrun``'s: keep the cluster network trusted.
    :param timeout_s: Gloo timeout (rendezvous and collectives), seconds
        (``HOROVOD_GLOO_TIMEOUT_SECONDS``).
    """

    nics: Optional[Union[str, Sequence[str]]] = None
    verbose: int = 1
    # An InitVar, so that dataclasses.asdict (what sgd writes to trainer.json) leaves the
    # secret out; read it back through the `key` property defined below the class.
    key: InitVar[Optional[Union[str, bytes]]] = None
    timeout_s: float = 300

    def __post_init__(self, key: Optional[Union[str, bytes]]) -> None:
        if self.nics is not None:
            nics = (self.nics,) if isinstance(self.nics, str) else tuple(self.nics)
            if not nics or not all(isinstance(n, str) and n for n in nics):
                raise ValueError(
                    f"nics must be None or interface names such as {{'eth0'}}, got {self.nics!r}"
                )
            self.nics = nics
        if not isinstance(self.verbose, int) or self.verbose < 0:
            raise ValueError(f"verbose must be an int >= 0 (0 quiet, 1, 2 more), got {self.verbose!r}")
        if key is not None and not isinstance(key, (str, bytes)):
            raise TypeError(f"key must be a str, bytes or None, got {type(key).__name__}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")
        self._key = key

    @property
    def backend_cls(self) -> type:
        return _HorovodBackend

    @property
    def name(self) -> str:
        return "horovod"


# The InitVar's default stays the __init__ default; the attribute reads what was passed.
HorovodConfig.key = property(  # type: ignore[assignment,method-assign,attr-defined]
    lambda self: getattr(self, "_key", None), doc="The secret passed as ``key`` (``None`` if none)."
)


# --- functions run on the workers ------------------------------------------------


def _probe() -> Dict[str, Any]:
    """Network interfaces, and whether Horovod's torch extension loads with Gloo."""
    info = network_info()
    try:
        import horovod
        import horovod.torch as hvd

        info["horovod"] = {"version": horovod.__version__, "gloo": bool(hvd.gloo_built())}
    except Exception as exc:  # ImportError, or an extension built against another torch
        info["horovod_error"] = f"{type(exc).__name__}: {exc}"
    return info


def check_probes(infos: Sequence[Dict[str, Any]]) -> None:
    """Raise, naming the worker, if Horovod is missing or was built without Gloo on one.

    :param infos: what :func:`_probe` returned on each worker, in rank order.
    """
    for rank, info in enumerate(infos):
        if "horovod_error" in info:
            raise ImportError(
                f"worker rank {rank} (node IP {info['node_ip']}) cannot import horovod.torch: "
                f"{info['horovod_error']}. {INSTALL_HINT}"
            )
        if not info["horovod"]["gloo"]:
            raise RuntimeError(
                f"Horovod {info['horovod']['version']} on worker rank {rank} was built without Gloo; "
                "sgd runs Horovod over Gloo. Rebuild it with scripts/build_horovod.py (HOROVOD_WITH_GLOO=1)."
            )


#: The variables the last :func:`_set_env` gave this process: a kept process (sgd.keep_workers)
#: that serves another group must not read a variable only the last group had.
_ENV_SET: List[str] = []


def _set_env(env: Dict[str, str]) -> None:
    """A worker's Horovod environment, and ``hvd.elastic.run`` on sgd's in-place recovery
    (:mod:`sgd_horovod.in_place`)."""
    for name in _ENV_SET:
        if name not in env:
            os.environ.pop(name, None)
    os.environ.update(env)
    _ENV_SET[:] = list(env)
    install_in_place()


def _shutdown_horovod() -> None:
    """On each worker at the group's end: Horovod shut down, and what an elastic job set in this
    process (``ray_logger``'s queue, the commit order) forgotten, so that the process can serve
    another group (:meth:`_HorovodBackend.reuses_processes`)."""
    from sgd_horovod import in_place, ray_logger

    ray_logger.reset()
    in_place.keep_before_host_check(False)
    if "horovod.torch" not in sys.modules:
        return
    import horovod.torch as hvd

    if hvd.is_initialized():
        hvd.shutdown()


# --- driver side -----------------------------------------------------------------


def rendezvous_service(worker_group: Workers) -> Optional[RendezvousService]:
    """The rendezvous server running for ``worker_group`` (``None`` if none): the one its
    Horovod backend object holds."""
    backend = getattr(worker_group, "backend", None)
    return backend.service if isinstance(backend, _HorovodBackend) else None


def _secret(key: Optional[Union[str, bytes]]) -> bytes:
    if key is None:
        return secrets.token_bytes(32)
    return key.encode() if isinstance(key, str) else key


def horovod_env(
    plan: Sequence[Slot], infos: Sequence[Dict[str, Any]], config: HorovodConfig, addr: str, port: int
) -> List[Dict[str, str]]:
    """Every worker's environment, in rank order, for rendezvous server ``addr:port``.

    :param infos: what :func:`_probe` returned on each worker (its network interfaces).
    """
    from horovod.runner.common.util import codec, secret

    single_node = len({slot.hostname for slot in plan}) == 1
    ifaces = choose_interfaces(infos, config.nics, single_node)  # type: ignore[arg-type]
    common = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(max(1, int(round(config.timeout_s)))),
        # What horovodrun hands its tasks; Horovod's authenticated services read it.
        secret.HOROVOD_SECRET_KEY: codec.dumps_base64(_secret(config.key)),  # type: ignore[attr-defined]
    }
    envs = []
    for slot, iface in zip(plan, ifaces):
        env = {**common, **slot.env()}
        if iface is not None:
            env["HOROVOD_GLOO_IFACE"] = iface
            env["NCCL_SOCKET_IFNAME"] = iface
        envs.append(env)
    return envs


class _HorovodBackend(Backend):
    """Rendezvous server on the driver, ``HOROVOD_*`` on the workers; data handling as torch's.

    One object per worker group (sgd keeps it from setup to teardown): it holds the
    group's rendezvous server in :attr:`service`.
    """

    # Horovod here is Horovod-on-torch: reports and checkpoints hold torch tensors and modules.
    checkpoint_codec = TorchBackend.checkpoint_codec
    encode_data = staticmethod(TorchBackend.encode_data)
    encode_checkpoint = TorchBackend.encode_checkpoint
    decode_checkpoint = staticmethod(TorchBackend.decode_checkpoint)
    preload_modules = ("horovod.torch",)
    share_cuda_visible_devices = True  # done by sgd-core before on_start

    def __init__(self) -> None:
        #: The group's rendezvous server while it is set up, else ``None``.
        self.service: Optional[RendezvousService] = None

    def _stop_service(self) -> None:
        service, self.service = self.service, None
        if service is not None:
            service.stop()

    def __del__(self) -> None:  # a group dropped without teardown must not leave a server running
        try:
            self._stop_service()
        except Exception:
            pass

    def on_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, HorovodConfig)
        require_horovod("horovod.runner.http.http_server", "on the driver")
        n = len(worker_group)
        infos = ray.get([worker_group.execute_single_async(i, _probe) for i in range(n)])
        check_probes(infos)
        # A restart sets the same group up again: never reuse a server that saw the old workers.
        self._stop_service()
        plan = slot_plan([m.node_id for m in worker_group.metadata])
        service = RendezvousService(verbose=max(0, backend_config.verbose - 1))
        port = service.start(plan)
        self.service = service  # stopped at teardown, on failure, or when this object is garbage
        try:
            envs = horovod_env(plan, infos, backend_config, ray.util.get_node_ip_address(), port)
            ray.get([worker_group.execute_single_async(i, _set_env, env) for i, env in enumerate(envs)])
        except BaseException:
            self._stop_service()
            raise
        if backend_config.verbose >= 1:
            logger.info("horovod: Gloo rendezvous for %d workers at %s:%d", n,
                        envs[0]["HOROVOD_GLOO_RENDEZVOUS_ADDR"], port)
        if backend_config.verbose >= 2:
            for slot, env in zip(plan, envs):
                logger.info("horovod: %s, iface %s", slot, env.get("HOROVOD_GLOO_IFACE", "(Gloo's choice)"))

    def on_training_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        # Workers that keep Horovod initialised from the last run do not meet again; workers
        # that shut it down meet anew. Either way start from an empty store, so nothing a
        # half-finished rendezvous left behind can be read by the next one.
        service = self.service
        if service is not None and service.running:
            service.reset(slot_plan([m.node_id for m in worker_group.metadata]))

    def on_shutdown(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        try:
            refs = worker_group.execute_async(_shutdown_horovod)
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=SHUTDOWN_TIMEOUT_S)
            if len(done) < len(refs):
                logger.warning("horovod: hvd.shutdown() did not finish on every worker within %.0fs; "
                               "the workers are stopped anyway", SHUTDOWN_TIMEOUT_S)
        finally:
            self._stop_service()

    def reuses_processes(self, backend_config: BackendConfig) -> bool:
        """A process serves another Horovod group once :meth:`on_shutdown` ran ``hvd.shutdown()``
        there (sgd.keep_workers): the next :meth:`on_start` sets every ``HOROVOD_*`` variable
        anew (and removes the last group's that it does not set), and ``hvd.init()`` reads them,
        as the survivors of an in-place re-form do."""
        return isinstance(backend_config, HorovodConfig)

    def reforms_in_place(self, worker_group: Workers, backend_config: BackendConfig) -> bool:
        """A run whose training function uses ``hvd.elastic.run`` re-forms in place: :meth:`on_start`
        starts a rendezvous server for the new group and sets every worker's ``HOROVOD_*`` for
        it, and each survivor meets the others there again in its live process
        (``hvd.shutdown()``, sgd's reset barrier, ``hvd.init()``: :mod:`sgd_horovod.in_place`)."""
        return isinstance(backend_config, HorovodConfig)

    def on_failure(self, worker_group: Workers, backend_config: BackendConfig, error: BaseException) -> None:
        # The workers are about to be killed; the restart (if any) starts a fresh server.
        self._stop_service()
