import os
from dataclasses import dataclass

import sgd


def _mark(rank_env):
    os.environ["DUMMY_BACKEND_RANK"] = rank_env


class DummyBackend(sgd.Backend):
    def on_start(self, worker_group, backend_config):
        for rank in range(len(worker_group)):
            worker_group.execute_single(rank, _mark, f"{backend_config.prefix}{rank}")


@dataclass
class DummyConfig(sgd.BackendConfig):
    prefix: str = "dummy-"

    @property
    def backend_cls(self):
        return DummyBackend

    @property
    def name(self):
        return "dummy"


class DummyCallback(sgd.TrainingCallback):
    pass


@sgd.hookimpl
def sgd_backends():
    return [sgd.BackendSpec("dummy", DummyConfig, provider="sgd-dummy-backend")]


@sgd.hookimpl
def sgd_callbacks():
    return [DummyCallback]


@sgd.hookimpl
def sgd_checkpoint_storage_schemes():
    return ["dummyfs"]
