"""``TorchCheckpoint``: Ray AIR's checkpoint of a PyTorch model, on sgd's checkpoints.

``from_state_dict`` / ``from_model`` make an in-memory dict checkpoint (written with the torch
codec when it is reported); ``from_directory`` reads any sgd checkpoint directory, or a
directory holding ``model.pt`` (Ray 2.4+'s layout); ``get_model`` gives the model back.

The trust rule holds: a state dict loads with no code run (``torch.load(weights_only=True)``);
a whole pickled model loads only when the caller opts in (``get_model(trusted=True)``,
``TorchCheckpoint.from_directory(path, trusted=True)`` or ``SGD_TRUST_CHECKPOINTS=1``).
Nothing here imports torch at module level (plugin discovery imports ``sgd_torch``).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from sgd.checkpoint import Checkpoint
from sgd.checkpoint.codecs import resolve_trusted
from sgd.checkpoint.preprocessor import PREPROCESSOR_KEY, encode_preprocessor
from sgd.errors import CheckpointError, UntrustedCheckpointError

__all__ = ["MODEL_KEY", "TorchCheckpoint"]

#: The key of the model (or its state dict) in a dict checkpoint (Ray AIR's key).
MODEL_KEY = "model"
#: The file a directory checkpoint keeps a model in (Ray 2.4+'s ``TorchCheckpoint`` layout).
MODEL_FILES = ("model.pt", "model")


def _plain_model(model: Any) -> Any:
    """``model`` without DDP / DataParallel around it and without sgd's autocast wrapper (a
    shallow copy when it has one: the training model keeps it)."""
    import copy

    import torch

    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    from sgd_torch.train_loop_utils import AutocastForward, strip_autocast

    if isinstance(model.__dict__.get("forward"), AutocastForward):
        model = strip_autocast(copy.copy(model))
    return model


class TorchCheckpoint(Checkpoint):
    """A checkpoint holding a PyTorch model or its state dict (Ray AIR's ``TorchCheckpoint``).

    ``Result.checkpoint`` of a :class:`sgd_torch.TorchTrainer` is one, so
    ``result.checkpoint.get_model(...)`` works as in Ray AIR.
    """

    def __init__(self, path: Any = None, data: Optional[Dict[str, Any]] = None, codec: str = "torch",
                 trusted: Optional[bool] = None):
        super().__init__(path=path, data=data, codec=codec, trusted=trusted)

    @classmethod
    def from_dict(cls, data: Dict[str, Any], codec: str = "torch") -> TorchCheckpoint:  # type: ignore[override]
        return super().from_dict(data, codec=codec)  # type: ignore[return-value]

    @classmethod
    def from_state_dict(cls, state_dict: Dict[str, Any], *, preprocessor: Any = None) -> TorchCheckpoint:
        """A checkpoint of ``state_dict`` (``model.state_dict()``; loads with no code run).

        :param preprocessor: a fitted preprocessor kept with it (``get_preprocessor()``).
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"TorchCheckpoint.from_state_dict takes a dict (model.state_dict()), "
                            f"got {type(state_dict).__name__}; for a whole model use from_model")
        return cls._made({MODEL_KEY: dict(state_dict)}, preprocessor)

    @classmethod
    def from_model(cls, model: Any, *, preprocessor: Any = None) -> TorchCheckpoint:
        """A checkpoint of the whole ``model`` (pickled: loading it needs ``trusted=True``).

        A ``DistributedDataParallel`` model is stored as its module; sgd's autocast wrapper
        (``accelerate(amp=True)``) is left out. Prefer :meth:`from_state_dict`, which loads
        anywhere without trust.
        """
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"TorchCheckpoint.from_model takes a torch.nn.Module, got {type(model).__name__}")
        return cls._made({MODEL_KEY: _plain_model(model)}, preprocessor)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> TorchCheckpoint:
        """The same checkpoint (an :class:`sgd.Checkpoint`) as a ``TorchCheckpoint``."""
        if isinstance(checkpoint, cls):
            return checkpoint
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"TorchCheckpoint.from_checkpoint takes an sgd.Checkpoint, got {type(checkpoint).__name__}")
        if checkpoint.path is not None:
            return cls(path=checkpoint.path, trusted=checkpoint.trusted)
        return cls(data=checkpoint.to_dict(), codec=getattr(checkpoint, "_codec", "torch"))

    @classmethod
    def _made(cls, data: Dict[str, Any], preprocessor: Any) -> TorchCheckpoint:
        if preprocessor is not None:
            data[PREPROCESSOR_KEY] = encode_preprocessor(preprocessor)
        return cls(data=data, codec="torch")

    # --- reading ------------------------------------------------------------------------

    def _saved_model(self, trusted: bool) -> Any:
        """What the checkpoint holds under ``model``: a module or a state dict."""
        where = self.path or "in memory"
        if self._data is not None:
            if MODEL_KEY not in self._data:
                raise CheckpointError(f"checkpoint {where} holds no {MODEL_KEY!r} (keys: {sorted(self._data)}); "
                                      "it was not made by TorchCheckpoint.from_model / from_state_dict")
            return self._data[MODEL_KEY]
        with self.as_directory() as local:
            state = Checkpoint(path=local, trusted=trusted).to_dict()
            files = state.get("_directory_files")
            if files is None:
                if MODEL_KEY not in state:
                    raise CheckpointError(f"checkpoint {where} holds no {MODEL_KEY!r} (keys: "
                                          f"{sorted(k for k in state if k != PREPROCESSOR_KEY)})")
                return state[MODEL_KEY]
            for name in MODEL_FILES:
                if name in files:
                    from sgd_torch.codec import load

                    return load(_Bytes(files[name], os.path.join(where, name)),  # type: ignore[arg-type]
                                trusted, os.path.join(where, name))
            raise CheckpointError(f"checkpoint {where} has no {' or '.join(MODEL_FILES)} file (files: "
                                  f"{', '.join(sorted(files))}); save the model there with torch.save")

    def get_model(self, model: Any = None, *, trusted: Optional[bool] = None) -> Any:
        """The model: the stored module, or ``model`` with the stored state dict loaded.

        A state dict saved from a ``DistributedDataParallel`` model (keys ``module.*``) loads
        into the plain model.

        :param model: the model to load a state dict into (needed for ``from_state_dict``
            checkpoints; for a stored whole model it is ignored, as in Ray).
        :param trusted: allow a whole pickled model to load (its unpickling runs code the
            file names). ``None``: the checkpoint's own ``trusted``, else ``SGD_TRUST_CHECKPOINTS``.
        :raises ValueError: a state dict and no ``model`` to load it into.
        :raises UntrustedCheckpointError: a whole model, and no opt-in.
        :raises CheckpointError: the stored model's class cannot be imported here.
        """
        import torch

        trust = resolve_trusted(self.trusted if trusted is None else trusted)
        where = self.path or "in memory"
        try:
            saved = self._saved_model(trust)
        except UntrustedCheckpointError as exc:
            raise UntrustedCheckpointError(
                f"{exc} TorchCheckpoint: this checkpoint holds a whole pickled model "
                "(TorchCheckpoint.from_model); load it with get_model(trusted=True) if you trust where it came "
                "from, or save TorchCheckpoint.from_state_dict(model.state_dict()) and call "
                "get_model(model=YourModel()), which loads with no code run.") from None
        except (ImportError, AttributeError) as exc:
            raise CheckpointError(
                f"checkpoint {where} holds a whole model whose class cannot be imported here ({type(exc).__name__}: "
                f"{exc}). Import or install the module that defines it before get_model(), or save the state dict "
                "(TorchCheckpoint.from_state_dict) and pass get_model(model=YourModel()).") from exc
        except CheckpointError as exc:
            cause = exc.__cause__
            if isinstance(cause, (ImportError, AttributeError)):
                raise CheckpointError(
                    f"checkpoint {where} holds a whole model whose class cannot be imported here "
                    f"({type(cause).__name__}: {cause}). Import or install the module that defines it before "
                    "get_model(), or save the state dict (TorchCheckpoint.from_state_dict) and pass "
                    "get_model(model=YourModel()).") from exc
            raise
        if isinstance(saved, torch.nn.Module):
            return saved
        if not isinstance(saved, dict):
            other = (" It looks like a TensorflowCheckpoint (a list of Keras weights): use sgd_tensorflow's "
                     "TensorflowCheckpoint / TensorflowPredictor") if isinstance(saved, list) else ""
            raise CheckpointError(f"checkpoint {where}: its {MODEL_KEY!r} is a {type(saved).__name__}, "
                                  f"neither a PyTorch model nor a state dict.{other}")
        if model is None:
            raise ValueError(f"checkpoint {where} holds a state dict, not a model: pass the model to load it into, "
                             "get_model(model=YourModel())")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"get_model(model=...) takes a torch.nn.Module, got {type(model).__name__}")
        from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

        state = dict(saved)
        consume_prefix_in_state_dict_if_present(state, "module.")
        model.load_state_dict(state)
        return model


class _Bytes:
    """A file-like object over bytes with a name (for the torch codec's messages)."""

    def __init__(self, data: bytes, name: str):
        self._data = data
        self.name = name

    def read(self) -> bytes:
        return self._data
