"""sgd-torch: the PyTorch backend for sgd.

``TorchConfig`` is importable without torch; the training helpers import it.
"""

from typing import Any

from sgd_torch.checkpoint import TorchCheckpoint
from sgd_torch.config import TorchBackend, TorchConfig
from sgd_torch.predictor import TorchPredictor
from sgd_torch.profiler import TorchWorkerProfiler
from sgd_torch.trainer import TorchTrainer

_LAZY = {
    "accelerate",
    "backward",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
}

#: Sharded checkpoints (torch.distributed.checkpoint), in sgd_torch.sharded.
_LAZY_SHARDED = {"load_sharded_checkpoint", "save_sharded_checkpoint"}

__version__ = "0.1.0"
__all__ = ["TorchPredictor", "TorchBackend", "TorchCheckpoint", "TorchConfig", "TorchTrainer", "TorchWorkerProfiler",
           *sorted(_LAZY | _LAZY_SHARDED)]


def __getattr__(name: str) -> Any:
    # The helpers need torch; importing them lazily keeps `import sgd_torch`
    # (done by plugin discovery in every process) free of a torch import.
    if name in _LAZY or name in _LAZY_SHARDED:
        import importlib

        try:
            module = importlib.import_module("sgd_torch.train_loop_utils" if name in _LAZY else "sgd_torch.sharded")
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(f"sgd_torch.{name} needs PyTorch: pip install torch ({exc})") from exc
        return getattr(module, name)
    raise AttributeError(f"module 'sgd_torch' has no attribute {name!r}")
