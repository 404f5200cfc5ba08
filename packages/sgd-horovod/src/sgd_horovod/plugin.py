"""Entry point of sgd-horovod: declares the ``"horovod"`` backend. Glue only; imports neither
Horovod nor torch."""

import sgd
from sgd_horovod.config import HorovodConfig


@sgd.hookimpl
def sgd_backends():
    return [sgd.BackendSpec("horovod", HorovodConfig, provider="sgd-horovod")]
