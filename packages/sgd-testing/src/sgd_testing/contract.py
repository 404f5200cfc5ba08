"""Contract tests every backend package runs by subclassing :class:`BackendContractTests`.

Example (in ``packages/sgd-jax/tests/test_contract.py``)::

    from sgd_testing import BackendContractTests

    class TestJaxBackend(BackendContractTests):
        backend_name = "jax"
        provider = "sgd-jax"
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar, Optional

import pytest

import sgd
from sgd import plugins


def _ranks_and_size() -> Any:
    return sgd.world_rank(), sgd.world_size(), sgd.local_rank()


class BackendContractTests:
    """What every backend must do. Subclasses set :attr:`backend_name` and :attr:`provider`.

    Override :meth:`collective` to exercise the framework's own communication
    (for torch, an ``all_reduce``); it runs inside a training function and must
    return the same value on every worker.
    """

    backend_name: ClassVar[str] = ""
    provider: ClassVar[Optional[str]] = None
    num_workers: ClassVar[int] = 2

    @staticmethod
    def collective() -> Any:
        return None

    @pytest.fixture
    def trainer(self, ray_cluster):
        trainer = sgd.Trainer(backend=self.backend_name, num_workers=self.num_workers)
        trainer.start()
        yield trainer
        trainer.shutdown()

    def test_backend_is_discovered(self):
        spec = plugins.available_backends().get(self.backend_name)
        assert spec is not None, f"backend {self.backend_name!r} not found through entry points"
        if self.provider:
            assert spec.provider == self.provider
        config = spec.config_cls()
        assert isinstance(config, sgd.BackendConfig)
        assert config.name == self.backend_name

    def test_listed_by_cli(self):
        out = subprocess.run(
            [sys.executable, "-m", "sgd", "plugins"], capture_output=True, text=True, check=True
        ).stdout
        assert any(self.backend_name in line.split() for line in out.splitlines()[1:]), out

    def test_ranks_and_collective(self, trainer):
        collective = type(self).collective

        def train_func():
            value = collective()
            sgd.report(rank=sgd.world_rank())
            return _ranks_and_size(), value

        results = trainer.run(train_func)
        ranks = [r[0] for r in results]
        assert ranks == [(i, self.num_workers, i) for i in range(self.num_workers)]
        values = [r[1] for r in results]
        assert all(v == values[0] for v in values), values

    def test_user_error_keeps_type_and_trainer_recovers(self, trainer):
        def fails():
            if sgd.world_rank() == self.num_workers - 1:
                raise KeyError("broken on purpose")
            return type(self).collective()

        with pytest.raises(KeyError) as info:
            trainer.run(fails)
        assert getattr(info.value, "sgd_world_rank", None) == self.num_workers - 1
        assert trainer.run(_ranks_and_size)[0] == (0, self.num_workers, 0)
