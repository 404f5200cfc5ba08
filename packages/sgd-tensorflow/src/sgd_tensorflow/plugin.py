"""Entry point of sgd-tensorflow: declares the ``"tensorflow"`` backend. Glue only; no TF import."""

import sgd
from sgd_tensorflow.config import TensorflowConfig


@sgd.hookimpl
def sgd_backends():
    return [sgd.BackendSpec("tensorflow", TensorflowConfig, provider="sgd-tensorflow")]


@sgd.hookimpl
def sgd_checkpoint_codecs():
    from sgd_tensorflow.codec import TensorflowCodec

    return [TensorflowCodec()]
