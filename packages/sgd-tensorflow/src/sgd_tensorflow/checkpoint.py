"""``TensorflowCheckpoint``: Ray AIR's checkpoint of a Keras model, on sgd's checkpoints.

Its forms, as AIR had them: ``from_model`` (the model's weights and its architecture as JSON,
both plain data), ``from_saved_model`` (a SavedModel directory), ``from_h5`` (an HDF5 file) and
``from_directory``; ``get_model`` gives the model back.

The trust rule holds: weights load into a model the caller builds (``get_model(model_definition)``
or ``get_model(model)``) with no code run; rebuilding a model from what the checkpoint says
(its JSON architecture, a SavedModel, an HDF5 file, which may hold ``Lambda`` layers' code)
needs ``trusted=True`` (or the checkpoint's ``trusted``, or ``SGD_TRUST_CHECKPOINTS=1``).
Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Optional, Union

from sgd.checkpoint import Checkpoint
from sgd.checkpoint.codecs import resolve_trusted
from sgd.checkpoint.preprocessor import PREPROCESSOR_FILE, PREPROCESSOR_KEY, encode_preprocessor
from sgd.errors import CheckpointError, UntrustedCheckpointError

__all__ = ["MODEL_KEY", "TensorflowCheckpoint"]

#: The key of the weights in a dict checkpoint (Ray AIR's key).
MODEL_KEY = "model"
#: The key of the model's architecture (``model.to_json()``).
ARCHITECTURE_KEY = "keras_architecture"
H5_FILE = "model.h5"


class TensorflowCheckpoint(Checkpoint):
    """A checkpoint holding a Keras model (Ray AIR's ``TensorflowCheckpoint``); ``Result.checkpoint``
    of a :class:`sgd_tensorflow.TensorflowTrainer` is one."""

    @classmethod
    def from_model(cls, model: Any, *, preprocessor: Any = None) -> TensorflowCheckpoint:
        """The model's weights (``get_weights()``) and architecture (``to_json()``): plain data."""
        data: Dict[str, Any] = {MODEL_KEY: [w for w in model.get_weights()], ARCHITECTURE_KEY: model.to_json()}
        if preprocessor is not None:
            data[PREPROCESSOR_KEY] = encode_preprocessor(preprocessor)
        return cls(data=data)

    @classmethod
    def from_saved_model(cls, dir_path: Union[str, os.PathLike], *, preprocessor: Any = None) -> TensorflowCheckpoint:
        """A SavedModel directory (``model.save(dir)``) as a checkpoint (copied)."""
        return cls._directory_with(dir_path, None, preprocessor)

    @classmethod
    def from_h5(cls, file_path: Union[str, os.PathLike], *, preprocessor: Any = None) -> TensorflowCheckpoint:
        """An HDF5 model file (``model.save("m.h5")``) as a checkpoint (copied as ``model.h5``)."""
        return cls._directory_with(None, file_path, preprocessor)

    @classmethod
    def _directory_with(cls, directory: Any, h5: Any, preprocessor: Any) -> TensorflowCheckpoint:
        source = str(directory if directory is not None else h5)
        if (directory is not None and not os.path.isdir(source)) or (h5 is not None and not os.path.isfile(source)):
            what = "SavedModel directory" if directory is not None else "HDF5 file"
            raise FileNotFoundError(f"no {what} at {source}")
        target = tempfile.mkdtemp(prefix="sgd_tf_checkpoint_")
        if directory is not None:
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy(source, os.path.join(target, H5_FILE))
        if preprocessor is not None:
            with open(os.path.join(target, PREPROCESSOR_FILE), "wb") as f:
                f.write(encode_preprocessor(preprocessor))
        return cls(path=target)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> TensorflowCheckpoint:
        """The same checkpoint (an :class:`sgd.Checkpoint`) as a ``TensorflowCheckpoint``."""
        if isinstance(checkpoint, cls):
            return checkpoint
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"from_checkpoint takes an sgd.Checkpoint, got {type(checkpoint).__name__}")
        if checkpoint.path is not None:
            return cls(path=checkpoint.path, trusted=checkpoint.trusted)
        return cls(data=checkpoint.to_dict())

    def get_model(self, model_definition: Union[Callable[[], Any], Any, None] = None, *, model: Any = None,
                  custom_objects: Optional[Dict[str, Any]] = None, trusted: Optional[bool] = None) -> Any:
        """The Keras model.

        :param model_definition: a function returning the (uncompiled) model, or the model
            itself (``model=`` is the same): the stored weights are set into it, with no code
            from the checkpoint run.
        :param custom_objects: for rebuilding a SavedModel / HDF5 model (``load_model``).
        :param trusted: allow rebuilding the model from the checkpoint (its JSON architecture,
            a SavedModel, an HDF5 file), which may run code the checkpoint holds.
        :raises UntrustedCheckpointError: the model must be rebuilt and there is no opt-in.
        """
        target = model if model is not None else model_definition
        if target is not None and not hasattr(target, "set_weights") and callable(target):
            target = target()
        trust = resolve_trusted(self.trusted if trusted is None else trusted)
        where = self.path or "in memory"
        with self.as_directory() as local:
            state = self._data if self._data is not None else Checkpoint(path=local, trusted=trust).to_dict()
            if "_directory_files" not in state:
                if MODEL_KEY not in state:
                    raise CheckpointError(f"checkpoint {where} holds no {MODEL_KEY!r} (keys: "
                                          f"{sorted(k for k in state if k != PREPROCESSOR_KEY)})")
                weights = state[MODEL_KEY]
                if hasattr(weights, "get_weights"):  # a whole Keras model (trusted load, or in memory)
                    weights = weights.get_weights()
                if not isinstance(weights, (list, tuple)):
                    raise CheckpointError(
                        f"checkpoint {where}: its {MODEL_KEY!r} is a {type(weights).__name__}, not a list of Keras "
                        "weights. A PyTorch model or state dict (TorchCheckpoint) loads with sgd_torch's "
                        "TorchCheckpoint / TorchPredictor.")
                if target is None:
                    target = self._from_architecture(state, trust, where)
                target.set_weights(weights)
                return target
            if target is not None:
                raise ValueError(f"checkpoint {where} holds a saved Keras model (SavedModel / HDF5), not weights: "
                                 "call get_model() without a model definition")
            if not trust:
                raise UntrustedCheckpointError(
                    f"checkpoint {where} holds a saved Keras model; rebuilding it may run code the checkpoint holds "
                    "(Lambda layers). Pass get_model(trusted=True) if you trust where it came from, or save "
                    "TensorflowCheckpoint.from_model(model) and call get_model(model_definition).")
            from tensorflow import keras

            h5 = os.path.join(local, H5_FILE)
            return keras.models.load_model(h5 if os.path.isfile(h5) else local, custom_objects=custom_objects)

    @staticmethod
    def _from_architecture(state: Dict[str, Any], trust: bool, where: str) -> Any:
        architecture = state.get(ARCHITECTURE_KEY)
        if architecture is None:
            raise ValueError(f"checkpoint {where} holds weights only: pass get_model(model_definition), a function "
                             "that builds the model")
        if not trust:
            raise UntrustedCheckpointError(
                f"checkpoint {where}: rebuilding the model from its stored architecture may run code it holds "
                "(Lambda layers). Pass get_model(model_definition) to load the weights into a model you build, or "
                "get_model(trusted=True) if you trust where it came from.")
        from tensorflow import keras

        return keras.models.model_from_json(architecture)
