"""Entry point of sgd-torch: declares the ``"torch"`` backend. Glue only; no torch import."""

import sgd
from sgd_torch.config import TorchConfig


@sgd.hookimpl
def sgd_backends():
    return [sgd.BackendSpec("torch", TorchConfig, provider="sgd-torch")]


@sgd.hookimpl
def sgd_checkpoint_codecs():
    from sgd_torch.codec import TorchCodec

    return [TorchCodec()]
