"""``TensorflowConfig`` and the backend that writes ``TF_CONFIG`` on the workers.

Nothing here imports TensorFlow at module level: the plugin is loaded by every
``import sgd``-using process, and TensorFlow is only needed on the workers.
The order matters: ``TF_USE_LEGACY_KERAS`` must be in a worker's environment
before that worker first imports TensorFlow, so the backend sets the environment
first and only then starts the (background) TensorFlow import.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import ray

from sgd.backend import Backend, BackendConfig, free_address
from sgd_tensorflow.codec import KerasModelState, is_keras_model

if TYPE_CHECKING:
    from sgd.backend import Workers

logger = logging.getLogger("sgd.tensorflow")


@dataclass
class TensorflowConfig(BackendConfig):
    """Configuration of the ``"tensorflow"`` backend.

    :param use_legacy_keras: run the workers on tf-keras (Keras 2) by setting
        ``TF_USE_LEGACY_KERAS=1`` before they import TensorFlow. ``None`` (the
        default) does so exactly when ``tf-keras`` is installed on the worker,
        because Keras 3's ``model.fit`` does not work under
        ``MultiWorkerMirroredStrategy``; ``True`` requires tf-keras (``RuntimeError``
        at start if it is missing); ``False`` keeps Keras 3 (``TF_USE_LEGACY_KERAS=0``).
    """

    use_legacy_keras: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.use_legacy_keras not in (None, True, False):
            raise ValueError(f"use_legacy_keras must be None, True or False, got {self.use_legacy_keras!r}")

    @property
    def backend_cls(self) -> type:
        return _TensorflowBackend

    @property
    def name(self) -> str:
        return "tensorflow"


# --- functions run on the workers ------------------------------------------------


def _set_env(tf_config: str, use_legacy_keras: Optional[bool]) -> Dict[str, Any]:
    """Write ``TF_CONFIG`` and the Keras choice; report what this worker has."""
    has_tf_keras = importlib.util.find_spec("tf_keras") is not None
    legacy = has_tf_keras if use_legacy_keras is None else use_legacy_keras
    os.environ["TF_CONFIG"] = tf_config
    if not (legacy and not has_tf_keras):
        os.environ["TF_USE_LEGACY_KERAS"] = "1" if legacy else "0"
    return {
        "legacy": legacy,
        "has_tf_keras": has_tf_keras,
        "tf_imported": "tensorflow" in sys.modules,
    }


# --- driver side -----------------------------------------------------------------


def tf_config_for(addresses: List[str], index: int) -> Dict[str, Any]:
    """The ``TF_CONFIG`` of worker ``index`` of a cluster of ``addresses`` (``"ip:port"``)."""
    return {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}


class _TensorflowBackend(Backend):
    checkpoint_codec = "tensorflow"
    # Not "tensorflow": the group's preload runs before on_start, i.e. before the
    # Keras choice is in the environment. on_start starts the import itself.

    def on_start(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        assert isinstance(backend_config, TensorflowConfig)
        # One port per worker, found on the worker's own node.
        found = ray.get([worker_group.execute_single_async(i, free_address) for i in range(len(worker_group))])
        addresses = [f"{ip}:{port}" for ip, port in found]
        infos = ray.get(
            [
                worker_group.execute_single_async(
                    i, _set_env, json.dumps(tf_config_for(addresses, i)), backend_config.use_legacy_keras
                )
                for i in range(len(worker_group))
            ]
        )
        for rank, info in enumerate(infos):
            if info["legacy"] and not info["has_tf_keras"]:
                raise RuntimeError(
                    f"TensorflowConfig(use_legacy_keras=True), but tf-keras is not installed on worker rank "
                    f"{rank}. Install it (pip install 'sgd-tensorflow[legacy-keras]' or tf-keras matching your "
                    "TensorFlow version), or pass use_legacy_keras=None/False."
                )
            if info["tf_imported"]:
                logger.warning(
                    "worker rank %d imported TensorFlow before the backend set TF_USE_LEGACY_KERAS=%s "
                    "(an initialization_hook?); its Keras choice may not follow TensorflowConfig",
                    rank, "1" if info["legacy"] else "0",
                )
        # The environment is in place: start importing TensorFlow now, in the background
        # (a control-group call), so the training function finds it (mostly) loaded.
        worker_group.preload(("tensorflow",))

    def on_shutdown(self, worker_group: Workers, backend_config: BackendConfig) -> None:
        """Nothing to release: TensorFlow's gRPC servers end with the worker processes."""

    @staticmethod
    def encode_data(data: Any) -> Any:
        if "tensorflow" not in sys.modules:  # nothing can hold a tensor
            return data
        return _to_numpy(data)


def _to_numpy(data: Any) -> Any:
    """TensorFlow tensors and variables (also distributed ones, Keras 3 variables)
    as numpy arrays, so the driver can read them without TensorFlow; Keras models
    as :class:`~sgd_tensorflow.codec.KerasModelState` (see the codec for why)."""
    if isinstance(data, (int, float, str, bool, bytes, type(None))):
        return data
    if isinstance(data, dict):
        return {k: _to_numpy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_to_numpy(v) for v in data]
    if isinstance(data, tuple) and not hasattr(data, "_fields"):
        return tuple(_to_numpy(v) for v in data)
    if is_keras_model(data):
        return KerasModelState.from_model(data)
    module = type(data).__module__ or ""
    if module.split(".")[0] in ("tensorflow", "keras", "tf_keras") and hasattr(data, "numpy"):
        values = getattr(data, "values", None)  # PerReplica: the local replica's value
        if module.startswith("tensorflow.python.distribute") and isinstance(values, tuple) and values:
            data = values[0]
        try:
            return data.numpy()
        except Exception:  # symbolic tensors and the like: leave them to pickling
            return data
    return data
