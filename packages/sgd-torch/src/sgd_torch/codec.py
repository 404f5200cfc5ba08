"""Checkpoint codec of the torch backend: ``torch.save`` to write; ``torch.load`` onto the CPU
to read, with ``weights_only=True`` whenever the content allows it."""

import io
import logging
from typing import IO, Any

SUFFIX = "pt"

logger = logging.getLogger("sgd.torch")


def save(obj: Any, f: IO[bytes]) -> None:
    import torch

    torch.save(obj, f)


def load(f: IO[bytes]) -> Any:
    import pickle

    import torch

    data = f.read()
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # Arbitrary Python objects (a whole nn.Module, a custom class) need the full
        # unpickler; only load checkpoints you trust.
        logger.debug("checkpoint holds more than tensors; loading with weights_only=False")
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
