"""Checkpoint codec of the TensorFlow backend (registered as ``"tensorflow"``): sgd's safe
format for weights and plain data; cloudpickle, with Keras models as (architecture, weights),
when the state holds a Keras model (loading that needs ``trusted=True`` or
``SGD_TRUST_CHECKPOINTS=1``, as rebuilding it runs code).

Tensors and variables are turned into numpy arrays on the worker
(``_TensorflowBackend.encode_data``), so a checkpoint of weights loads without
TensorFlow. A Keras model is *not* pickled by Keras' own ``__reduce__``: that
saves the model, which under ``MultiWorkerMirroredStrategy`` waits for the other
workers and hangs when only rank 0 does it (measured). Instead the model travels
as :class:`KerasModelState` (its JSON config and ``get_weights()``, both local
reads) and is rebuilt, uncompiled, wherever it is unpickled, with the Keras it was
made with (``tf_keras`` or Keras 3). Optimizer state is not kept; save
``model.optimizer.variables`` yourself if you need it.
"""

from __future__ import annotations

from typing import IO, Any, List, Optional

from sgd.codecs import SafeCodec, resolve_trusted

SUFFIX = "pkl"

_KERAS_ROOTS = ("keras", "tf_keras")


def is_keras_model(obj: Any) -> bool:
    """Whether ``obj`` is a Keras (3 or tf-keras) model, without importing either."""
    for cls in type(obj).__mro__:
        if cls.__name__ == "Model" and cls.__module__.split(".")[0] in _KERAS_ROOTS:
            return True
    return False


class KerasModelState:
    """A Keras model as its architecture and weights; unpickles into the model."""

    def __init__(self, flavour: str, config_json: str, weights: List[Any]):
        self.flavour = flavour
        self.config_json = config_json
        self.weights = weights

    @classmethod
    def from_model(cls, model: Any) -> KerasModelState:
        flavour = "tf_keras" if type(model).__module__.startswith("tf_keras") else "keras"
        return cls(flavour, model.to_json(), [w for w in model.get_weights()])

    def __reduce__(self):
        return (rebuild_keras_model, (self.flavour, self.config_json, self.weights))


def rebuild_keras_model(flavour: str, config_json: str, weights: List[Any]) -> Any:
    """The model of a :class:`KerasModelState` (uncompiled)."""
    if flavour == "tf_keras":
        import tf_keras as keras
    else:
        import keras  # type: ignore[no-redef]
    model = keras.models.model_from_json(config_json)
    model.set_weights(weights)
    return model


def encode_models(data: Any) -> Any:
    """``data`` with every Keras model replaced by its :class:`KerasModelState`."""
    if isinstance(data, dict):
        return {k: encode_models(v) for k, v in data.items()}
    if isinstance(data, list):
        return [encode_models(v) for v in data]
    if isinstance(data, tuple) and not hasattr(data, "_fields"):
        return tuple(encode_models(v) for v in data)
    if is_keras_model(data):
        return KerasModelState.from_model(data)
    return data


class TensorflowCodec(SafeCodec):
    name = "tensorflow"
    suffix = "sgd"
    aliases = ("sgd_tensorflow.codec",)

    def prepare(self, obj: Any) -> Any:
        return encode_models(obj)


_CODEC = TensorflowCodec()


def save(obj: Any, f: IO[bytes]) -> List[str]:
    """Write ``obj``; returns the types that need pickle to load (Keras models)."""
    return _CODEC.save(obj, f)


def load(f: IO[bytes], trusted: Optional[bool] = None, where: Optional[str] = None) -> Any:
    return _CODEC.load(f, resolve_trusted(trusted), str(where or getattr(f, "name", "<stream>")))
