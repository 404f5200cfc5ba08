"""Hugging Face on sgd: ``TransformersTrainer`` and ``AccelerateTrainer`` (``pip install "sgd-torch[huggingface]"``).

Each worker builds its own ``transformers.Trainer`` (or runs an Accelerate loop) over the
``torch.distributed`` process group sgd set up. ``SgdReportCallback`` and ``prepare_trainer``
are for code that builds a ``transformers.Trainer`` itself inside a ``TorchTrainer`` loop;
:mod:`sgd_torch.huggingface.transformers` holds Ray Train 2.60's ``RayTrainReportCallback``
and ``prepare_trainer`` (``ray.train.huggingface.transformers``).

Importing this package imports neither transformers, accelerate nor torch, and needs none of
them installed: each name imports what it needs when first used, and a missing package is an
``ImportError`` with the install line then.
"""

from typing import Any

# name -> (module, the packages it needs installed)
_LAZY = {
    "AccelerateTrainer": ("sgd_torch.huggingface.accelerate_trainer", ("transformers", "accelerate")),
    "TransformersTrainer": ("sgd_torch.huggingface.transformers_trainer", ("transformers", "accelerate")),
    "SgdReportCallback": ("sgd_torch.huggingface.callback", ("transformers",)),
    "RayShardDataset": ("sgd_torch.huggingface.data", ("torch",)),
    "prepare_trainer": ("sgd_torch.huggingface.data", ("transformers",)),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    # The driver of a run needs none of these frameworks: each loads when first used.
    if name in _LAZY:
        import importlib

        from sgd_torch.huggingface._deps import require

        module, needs = _LAZY[name]
        require(*needs)
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sgd_torch.huggingface' has no attribute {name!r}")
