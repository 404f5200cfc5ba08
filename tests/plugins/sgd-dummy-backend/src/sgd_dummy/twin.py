import sgd
from sgd_dummy.plugin import DummyConfig


@sgd.hookimpl
def sgd_backends():
    return [sgd.BackendSpec("torch", DummyConfig, provider="sgd-dummy-backend")]
