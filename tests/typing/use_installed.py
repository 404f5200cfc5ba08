"""Type-checked by ``nox -s lint`` from outside the repository, with no mypy settings: a user's
mypy sees sgd's hints only through each installed package's ``py.typed`` marker. Without the
marker mypy stops at the import (``import-untyped``) and the ``assert_type`` lines fail (Any).
Not run by pytest."""

from pathlib import Path
from typing import List

from ray.tune import PlacementGroupFactory
from typing_extensions import assert_type

import sgd
import sgd_horovod
import sgd_loggers
import sgd_tensorflow
import sgd_testing
import sgd_torch
import sgd_tune


def use() -> None:
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    assert_type(trainer.logdir, Path)
    assert_type(trainer.run(lambda: sgd.world_rank()), List)
    assert_type(sgd.world_rank(), int)
    assert_type(sgd_torch.TorchConfig(), sgd_torch.TorchConfig)
    assert_type(sgd_loggers.JsonLoggerCallback(), sgd_loggers.JsonLoggerCallback)
    assert_type(sgd_tensorflow.TensorflowConfig(), sgd_tensorflow.TensorflowConfig)
    assert_type(sgd_horovod.HorovodConfig(), sgd_horovod.HorovodConfig)
    assert_type(sgd_horovod.horovod_available(), bool)
    assert_type(sgd_testing.KillWorker(at=1), sgd_testing.KillWorker)
    assert_type(sgd_tune.trial_resources(2, {"CPU": 1.0}), PlacementGroupFactory)
