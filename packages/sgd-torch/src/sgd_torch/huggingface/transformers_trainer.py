"""``TransformersTrainer``: a ``transformers.Trainer`` per worker, over sgd's process group."""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable, Dict, Optional, Sequence

import sgd
from sgd.air import RunConfig, ScalingConfig
from sgd.data import DatasetConfig
from sgd_torch.config import TorchConfig
from sgd_torch.trainer import TorchTrainer

__all__ = ["TransformersTrainer"]

TRAIN_KEY = "train"
EVAL_KEY = "evaluation"
_TRAINER_STATE = "trainer_state.json"


class TransformersTrainer(TorchTrainer):
    """Runs a ``transformers.Trainer`` on every worker, all joined in one process group.

    On each worker, sgd's torch backend has created the ``torch.distributed`` group and
    set ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``...; then this trainer

    1. tells accelerate this worker's device (``ACCELERATE_USE_CPU`` or
       ``ACCELERATE_TORCH_DEVICE``), so the ``TrainingArguments`` built next join sgd's group;
    2. calls ``trainer_init_per_worker(train_dataset, eval_dataset, **trainer_init_config)``,
       which builds and returns the ``transformers.Trainer``;
    3. adds :class:`~sgd_torch.huggingface.SgdReportCallback` (HF logs and checkpoints become
       ``sgd.report`` calls) and makes the Trainer read Ray Dataset shards as they are
       (:func:`~sgd_torch.huggingface.prepare_trainer`);
    4. runs ``trainer.train()``, with ``resume_from_checkpoint=<local folder>`` when there
       is a checkpoint to start from (``resume_from_checkpoint=`` or a restart after a
       worker failure).

    :param trainer_init_per_worker: ``(train_dataset, eval_dataset, **trainer_init_config)
        -> transformers.Trainer``. The datasets are this worker's shards of
        ``datasets["train"]`` and ``datasets["evaluation"]`` as
        :class:`~sgd_torch.huggingface.RayShardDataset` (torch iterable datasets of dict
        rows; set ``TrainingArguments(max_steps=...)``, they have no length), the objects
        themselves for datasets that are not Ray Datasets, ``None`` for names not passed.
    :param trainer_init_config: keyword arguments for ``trainer_init_per_worker`` (it is
        the run's config: it appears in the run's logs).
    :param datasets: ``{"train": ..., "evaluation": ...}`` (either may be left out). Both are
        split among the workers (each evaluates its own part), as Ray AIR's
        ``HuggingFaceTrainer`` did; other names are split too (Ray Train 2.60's default), or go
        whole to every worker when an AIR ``dataset_config`` dict is passed.
    Other arguments as :class:`sgd_torch.TorchTrainer`.
    """

    #: Ray AIR's HuggingFaceTrainer rules: "evaluation" is split too.
    _dataset_config = {
        **TorchTrainer._dataset_config,
        "evaluation": DatasetConfig(split=True, fit=False, transform=True),
    }

    def __init__(
        self,
        trainer_init_per_worker: Callable[..., Any],
        *,
        trainer_init_config: Optional[Dict[str, Any]] = None,
        scaling_config: Optional[ScalingConfig] = None,
        torch_config: Optional[TorchConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        resume_from_checkpoint: Any = None,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
        metadata: Optional[Dict[str, Any]] = None,
    ):
        if not callable(trainer_init_per_worker):
            raise TypeError(f"trainer_init_per_worker must be a function, got {type(trainer_init_per_worker).__name__}")
        if trainer_init_config is not None and not isinstance(trainer_init_config, dict):
            raise TypeError(f"trainer_init_config must be a dict (or None), got {type(trainer_init_config).__name__}")
        _check_signature(trainer_init_per_worker, trainer_init_config or {})
        _check_datasets(datasets)
        self.trainer_init_per_worker = trainer_init_per_worker
        super().__init__(
            _loop(trainer_init_per_worker, datasets),
            train_loop_config=trainer_init_config,
            scaling_config=scaling_config,
            torch_config=torch_config,
            run_config=run_config,
            datasets=datasets,
            resume_from_checkpoint=resume_from_checkpoint,
            dataset_config=dataset_config,
            metadata=metadata,
        )

    @classmethod
    def restore(cls, path: Any, train_loop_per_worker: Optional[Callable[..., Any]] = None,  # type: ignore[override]
                train_loop_config: Optional[Dict[str, Any]] = None, datasets: Optional[Dict[str, Any]] = None,
                *, trainer_init_per_worker: Optional[Callable[..., Any]] = None,
                trainer_init_config: Optional[Dict[str, Any]] = None, **overrides: Any) -> TransformersTrainer:
        """A trainer that continues the run in ``path`` (see :meth:`sgd.DataParallelTrainer.restore`).

        ``trainer_init_per_worker`` and ``trainer_init_config`` replace the saved ones;
        the datasets must be passed again. The saved ``trainer_init_per_worker`` is kept only
        pickled: pass it again, or ``trusted=True`` for a run directory you wrote.

        :raises TypeError: ``train_loop_per_worker`` or ``train_loop_config`` was given: this
            trainer's loop is built from ``trainer_init_per_worker``.
        """
        if train_loop_per_worker is not None or train_loop_config is not None:
            raise TypeError(f"{cls.__name__}.restore() takes trainer_init_per_worker= and trainer_init_config=, "
                            "not train_loop_per_worker= / train_loop_config=")
        if trainer_init_per_worker is not None:  # the loop is rebuilt from it below: the saved one is not read
            overrides.update(trainer_init_per_worker=trainer_init_per_worker,
                             train_loop_per_worker=trainer_init_per_worker)
        trainer = super().restore(path, datasets=datasets, **overrides)
        assert isinstance(trainer, TransformersTrainer)
        init = trainer.trainer_init_per_worker
        if trainer_init_config is not None:
            trainer.train_loop_config = dict(trainer_init_config)
        _check_signature(init, trainer.train_loop_config or {})
        trainer.trainer_init_per_worker = init
        trainer.train_loop_per_worker = _loop(init, trainer.datasets)
        return trainer


def _loop(trainer_init_per_worker: Callable[..., Any], datasets: Optional[Dict[str, Any]]) -> Callable[..., Any]:
    # The init function is bound rather than put in the config: the config goes to the run's logs.
    return functools.partial(_train_loop_per_worker, trainer_init_per_worker, tuple(datasets or ()))


def _check_signature(func: Callable[..., Any], config: Dict[str, Any]) -> None:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # no signature to check (a builtin): let the call tell
        return
    try:
        signature.bind(None, None, **config)
    except TypeError as exc:
        name = getattr(func, "__name__", repr(func))
        raise TypeError(
            f"trainer_init_per_worker {name!r} cannot be called as {name}(train_dataset, eval_dataset, "
            f"**trainer_init_config) with trainer_init_config keys {sorted(config)}: {exc}"
        ) from None


def _check_datasets(datasets: Optional[Dict[str, Any]]) -> None:
    if datasets is None:
        return
    if not isinstance(datasets, dict):
        raise TypeError("datasets must be a dict like {'train': ..., 'evaluation': ...}, "
                        f"got {type(datasets).__name__}")
    unknown = sorted(str(name) for name in datasets if name not in (TRAIN_KEY, EVAL_KEY))
    if unknown:
        raise ValueError(
            f"TransformersTrainer takes datasets named {TRAIN_KEY!r} and {EVAL_KEY!r}, got "
            f"{', '.join(map(repr, unknown))} (an evaluation set is named {EVAL_KEY!r})"
        )


# --- on the workers -----------------------------------------------------------------------


def _shard(name: str, names: Sequence[str]) -> Any:
    """This worker's part of dataset ``name`` as the Trainer gets it (``None`` if not passed)."""
    if name not in names:
        return None
    from sgd_torch.huggingface.data import RayShardDataset

    shard = sgd.get_dataset_shard(name)
    if callable(getattr(shard, "iter_rows", None)):
        return RayShardDataset(shard)
    return shard  # a torch dataset given whole to every worker: the Trainer shards it


def _check_trainer(trainer: Any) -> None:
    from transformers import Trainer

    if not isinstance(trainer, Trainer):
        raise TypeError(
            f"trainer_init_per_worker must return a transformers.Trainer, got {type(trainer).__name__} "
            f"(on worker rank {sgd.world_rank()})"
        )
    world_size = sgd.world_size()
    if trainer.args.world_size != world_size:
        raise RuntimeError(
            f"the Trainer's TrainingArguments see {trainer.args.world_size} process(es), but sgd runs {world_size} "
            f"workers (rank {sgd.world_rank()}); build TrainingArguments inside trainer_init_per_worker, and do not "
            "pass accelerator_config={'use_configured_state': True} with a state of your own"
        )


def _check_checkpoint_folder(folder: str) -> None:
    if not os.path.isfile(os.path.join(folder, _TRAINER_STATE)):
        found = sorted(os.listdir(folder))[:10]
        raise ValueError(
            f"the checkpoint to resume from is not a Hugging Face Trainer checkpoint: it has no {_TRAINER_STATE} "
            f"(files: {', '.join(found) or 'none'}). Pass a checkpoint a TransformersTrainer reported "
            "(result.checkpoint), or a copy of an HF output_dir/checkpoint-N folder."
        )


def _train_loop_per_worker(trainer_init_per_worker: Callable[..., Any], dataset_names: Sequence[str],
                           config: Dict[str, Any]) -> None:
    from sgd_torch.huggingface._worker import worker_environment
    from sgd_torch.huggingface.data import prepare_trainer

    with worker_environment():
        trainer = trainer_init_per_worker(_shard(TRAIN_KEY, dataset_names), _shard(EVAL_KEY, dataset_names),
                                          **config)
        _check_trainer(trainer)
        prepare_trainer(trainer)
        checkpoint = sgd.get_checkpoint()
        if checkpoint is None:
            trainer.train()
            return
        with checkpoint.as_directory() as folder:
            _check_checkpoint_folder(folder)
            trainer.train(resume_from_checkpoint=folder)
