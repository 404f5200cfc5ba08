import os
import uuid
from dataclasses import dataclass

import sgd


def _mark(rank_env, session):
    os.environ["DUMMY_BACKEND_RANK"] = rank_env
    os.environ["DUMMY_BACKEND_SESSION"] = session


class DummyBackend(sgd.Backend):
    """A stateful backend: it opens a "session" (as a real one would start a server) in its
    first ``on_start``, hands it to the workers at every setup (also after a restart), and
    closes it in ``on_shutdown``. ``events`` records every lifecycle call it got."""

    #: Every DummyBackend ever made in this process (for the tests).
    instances = []

    def __init__(self):
        self.session = None
        self.events = []
        DummyBackend.instances.append(self)

    def on_start(self, worker_group, backend_config):
        self.events.append("start")
        if self.session is None:
            self.session = uuid.uuid4().hex
        for rank in range(len(worker_group)):
            worker_group.execute_single(rank, _mark, f"{backend_config.prefix}{rank}", self.session)

    def on_training_start(self, worker_group, backend_config):
        self.events.append("training_start")
        assert self.session is not None, "on_training_start before on_start"

    def on_failure(self, worker_group, backend_config, error):
        self.events.append("failure")

    def on_shutdown(self, worker_group, backend_config):
        self.events.append("shutdown")
        self.session = None


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
