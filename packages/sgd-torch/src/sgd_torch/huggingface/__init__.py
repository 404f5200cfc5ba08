"""Hugging Face on sgd: ``TransformersTrainer`` and ``AccelerateTrainer`` (``pip install "sgd-torch[huggingface]"``).

Each worker builds its own ``transformers.Trainer`` (or runs an Accelerate loop) over the
``torch.distributed`` process group sgd set up. ``SgdReportCallback`` and ``prepare_trainer``
are for code that builds a ``transformers.Trainer`` itself inside a ``TorchTrainer`` loop.

Importing this package does not import transformers, accelerate or torch: the trainers
import them on the workers, and the three helpers below when first used.
"""

from typing import Any

from sgd_torch.huggingface._deps import require

require("transformers", "accelerate")

from sgd_torch.huggingface.accelerate_trainer import AccelerateTrainer  # noqa: E402
from sgd_torch.huggingface.transformers_trainer import TransformersTrainer  # noqa: E402

_LAZY = {
    "SgdReportCallback": "sgd_torch.huggingface.callback",
    "RayShardDataset": "sgd_torch.huggingface.data",
    "prepare_trainer": "sgd_torch.huggingface.data",
}

__all__ = ["AccelerateTrainer", "TransformersTrainer", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    # These need transformers or torch, which the driver of a run does not otherwise import.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sgd_torch.huggingface' has no attribute {name!r}")
