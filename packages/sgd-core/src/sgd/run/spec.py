"""What one run needs (:class:`RunSpec`), prepared by :meth:`sgd.Trainer.run_iterator` or, for
tests and embedders that drive a controller themselves, by :func:`new_run_spec`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from sgd.callbacks import TrainingCallback
from sgd.checkpoint import CheckpointStrategy
from sgd.data import DatasetConfig
from sgd.storage.manager import CheckpointManager
from sgd.storage.run_dir import RunDirectory


@dataclass
class RunSpec:
    """Everything one run needs, prepared by :meth:`sgd.Trainer.run_iterator`."""

    train_func: Callable[[], Any]
    config: Dict[str, Any]
    callbacks: List[TrainingCallback]
    checkpoint: Optional[dict]
    dataset: Any
    dataset_config: Optional[Dict[str, DatasetConfig]]
    run_dir: RunDirectory
    manager: CheckpointManager
    #: worker deaths this run recovers from (``-1``: unlimited): the trainer's ``max_retries``
    #: when the run begins (it may change between runs).
    max_retries: int
    #: whether an exception of the training function on a worker is retried too (counted
    #: against ``max_retries``), as Ray 2.x's ``FailureConfig(max_failures)`` does: set by the
    #: AIR/v2 trainers (``sgd.Trainer(retry_worker_errors=True)``); off, only deaths are.
    retry_worker_errors: bool = False
    #: what ``sgd.get_context()`` tells the workers about this run (experiment, trial...).
    worker_run_info: Dict[str, Optional[str]] = field(default_factory=dict)
    #: given to ``sgd_handle_result`` with every round.
    run_info: Dict[str, Any] = field(default_factory=dict)


def new_run_spec(run_dir: Path, train_func: Callable[[], Any], manager: Optional[CheckpointManager] = None,
                 max_retries: int = 0, **fields: Any) -> RunSpec:
    """A :class:`RunSpec` whose run directory is made at ``run_dir`` (a folder of its own), and
    whose checkpoints go to its ``checkpoints/`` through ``manager`` (default: every checkpoint
    kept, the ``pickle`` codec). ``fields``: the spec's other fields (``config``, ``callbacks``,
    ``checkpoint``, ``dataset``...). For tests and embedders that drive a controller themselves."""
    directory = RunDirectory.create(Path(run_dir))
    if manager is None:
        manager = CheckpointManager(directory.checkpoint_dir, CheckpointStrategy(), "pickle")
    values: Dict[str, Any] = dict(config={}, callbacks=[], checkpoint=None, dataset=None, dataset_config=None)
    values.update(fields)
    return RunSpec(train_func=train_func, run_dir=directory, manager=manager, max_retries=max_retries, **values)
