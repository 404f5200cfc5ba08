"""Ray SGD v1 compatibility: ``TorchTrainer`` / ``PyTorchTrainer`` and ``TrainingOperator``.

Move a v1 script by changing its import to ``from sgd_torch.v1 import TorchTrainer,
TrainingOperator``; it then runs on ``sgd.Trainer`` (see ``docs/migration-v1.md``).
Re-exports only. ``BaseTorchTrainable`` (Ray Tune) loads on first use.
"""

from typing import Any

from sgd_torch.v1.metrics import reduce_stats
from sgd_torch.v1.operator import TrainingOperator
from sgd_torch.v1.trainer import PyTorchTrainer, TorchTrainer

__all__ = ["BaseTorchTrainable", "PyTorchTrainer", "TorchTrainer", "TrainingOperator", "reduce_stats"]


def __getattr__(name: str) -> Any:
    if name == "BaseTorchTrainable":  # needs Ray Tune: imported only when asked for
        from sgd_torch.v1.tune import BaseTorchTrainable

        return BaseTorchTrainable
    raise AttributeError(f"module 'sgd_torch.v1' has no attribute {name!r}")
