"""``TorchTrainer.as_trainable``: a Ray Tune class trainable around a v1 ``TorchTrainer``.

Resources are asked for the way ``sgd-tune`` asks for them (its ``trial_resources``): one
placement group per trial with a bundle for the trial's own actor and one per worker; the
trainer's ``sgd.Trainer`` started inside the trial places its workers in those bundles.
"""

from __future__ import annotations

import os
from typing import Any, Callable, ClassVar, Dict, Optional, Tuple

try:
    from ray import tune

    from sgd_tune.trainable import trial_resources
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"TorchTrainer.as_trainable needs Ray Tune and sgd-tune: pip install sgd-tune ({exc})"
    ) from exc

#: The file a Tune checkpoint of a v1 trainable holds (written by ``TorchTrainer.save``).
CHECKPOINT_FILE = "trainer.pt"


class BaseTorchTrainable(tune.Trainable):
    """Base class of the trainables ``TorchTrainer.as_trainable`` returns.

    ``setup`` builds the trial's ``TorchTrainer``; ``step`` runs ``train()`` and, when the
    data has a validation loader, ``validate()`` (their metrics merged, validation's winning
    on shared keys), or ``override_tune_step(trainer, {"iteration": n})``;
    ``save_checkpoint`` / ``load_checkpoint`` go through ``TorchTrainer.save`` / ``restore``.
    """

    _v1_trainer_cls: ClassVar[Any] = None
    _v1_args: ClassVar[Tuple[Any, ...]] = ()
    _v1_kwargs: ClassVar[Dict[str, Any]] = {}
    _v1_step: ClassVar[Optional[Callable[..., Any]]] = None

    @classmethod
    def default_resource_request(cls, config: Dict[str, Any]) -> Any:
        from sgd_torch.v1.arguments import _resolve_use_gpu, _resolve_workers
        from sgd_torch.v1.trainer import TorchTrainer

        kwargs = cls._v1_kwargs
        defaults = TorchTrainer.__init__.__kwdefaults__ or {}
        num_workers = _resolve_workers(kwargs.get("num_workers", 1), kwargs.get("num_replicas"))
        use_gpu = _resolve_use_gpu(kwargs.get("use_gpu", False))
        cpus = kwargs.get("num_cpus_per_worker", defaults.get("num_cpus_per_worker", 1))
        return trial_resources(num_workers, {"CPU": cpus, "GPU": int(use_gpu)})

    @property
    def trainer(self) -> Any:
        """This trial's ``TorchTrainer``."""
        return self._trainer

    def setup(self, config: Dict[str, Any]) -> None:
        kwargs = dict(self._v1_kwargs)
        kwargs["config"] = {**(kwargs.get("config") or {}), **config}
        kwargs.setdefault("logdir", os.path.join(self.logdir, "sgd"))
        self._trainer = type(self)._v1_trainer_cls(*self._v1_args, **kwargs)

    def step(self) -> Dict[str, Any]:
        step = type(self)._v1_step
        if step is not None:
            return step(self._trainer, {"iteration": self.training_iteration})
        stats = dict(self._trainer.train())
        if self._trainer._has_validation:
            stats.update(self._trainer.validate())
        return stats

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self._trainer.save(os.path.join(checkpoint_dir, CHECKPOINT_FILE))

    def load_checkpoint(self, checkpoint: Any) -> None:
        path = checkpoint if isinstance(checkpoint, (str, os.PathLike)) else checkpoint.path
        self._trainer.restore(os.path.join(path, CHECKPOINT_FILE))

    def cleanup(self) -> None:
        trainer = getattr(self, "_trainer", None)
        if trainer is not None:
            trainer.shutdown()


def make_trainable(trainer_cls: type, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                   override_tune_step: Optional[Callable[..., Any]] = None) -> type:
    """A :class:`BaseTorchTrainable` subclass for ``trainer_cls(*args, **kwargs)``; the
    arguments are checked now, so a mistake fails here and not in every trial."""
    from sgd_torch.v1.trainer import check_trainer_args

    check_trainer_args(*args, **kwargs)
    if override_tune_step is not None and not callable(override_tune_step):
        raise TypeError(f"override_tune_step must be a function (trainer, info) -> dict, "
                        f"got {type(override_tune_step).__name__}")
    attrs = {
        "_v1_trainer_cls": trainer_cls,
        "_v1_args": tuple(args),
        "_v1_kwargs": dict(kwargs),
        "_v1_step": staticmethod(override_tune_step) if override_tune_step is not None else None,
        "__module__": __name__,
    }
    return type("TorchTrainable", (BaseTorchTrainable,), attrs)
