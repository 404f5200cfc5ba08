"""Checkpoint codec of the torch backend (registered as ``"torch"``): ``torch.save`` to write;
``torch.load(weights_only=True)`` onto the CPU to read, which rebuilds tensors, state dicts,
plain containers and numpy arrays but runs no code named by the file.

Content that needs the full unpickler (a whole ``nn.Module``, a custom class) loads only when
the caller trusts the checkpoint (``trusted=True`` or ``SGD_TRUST_CHECKPOINTS=1``).
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any, List, Optional

from sgd.codecs import Codec, resolve_trusted, untrusted_error

SUFFIX = "pt"


def _numpy_globals() -> List[Any]:
    """What a pickled numpy array or scalar names: safe to allow (object arrays' items
    are still unpickled under the restricted rules)."""
    try:
        import numpy as np
    except ImportError:
        return []
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray  # type: ignore[no-redef]
    return [multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype,
            *[type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDGSUV"]]


def _unsupported(exc: Exception) -> List[str]:
    # torch names the first global it refused: "Unsupported global: GLOBAL mod.Name ..."
    text = str(exc)
    marker = "GLOBAL "
    if marker in text:
        name = text.split(marker, 1)[1].split()[0].rstrip(".,")
        return [name]
    return []


def _weights_only_load(data: bytes) -> Any:
    import torch

    with torch.serialization.safe_globals(_numpy_globals()):
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def save(obj: Any, f: IO[bytes]) -> List[str]:
    """``torch.save(obj, f)``; returns the types the weights-only loader will refuse.

    A class that pickle cannot name (defined inside a function, or in a module the driver
    cannot import: a model class shipped to the workers by value) is written with
    cloudpickle as torch's pickler instead, as Ray AIR's checkpoints were; such content loads
    only with trust, like any pickled model.
    """
    import torch

    start = f.tell()
    try:
        torch.save(obj, f)
    except (pickle.PicklingError, AttributeError) as exc:
        if "pickle" not in str(exc).lower():
            raise
        import ray.cloudpickle as cloudpickle

        f.seek(start)
        f.truncate()
        torch.save(obj, f, pickle_module=cloudpickle)
    return _needs_pickle(obj)


def _needs_pickle(obj: Any) -> List[str]:
    import torch

    found: List[str] = []

    def walk(v: Any, depth: int = 0) -> None:
        t = type(v)
        if v is None or t in (bool, int, float, complex, str, bytes, bytearray) or depth > 100:
            return
        if isinstance(v, torch.Tensor):
            if t not in (torch.Tensor, torch.nn.Parameter):
                found.append(f"{t.__module__}.{t.__qualname__}")
            return
        if t in (torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout):
            return
        if t in (list, tuple, set, frozenset):
            for x in v:
                walk(x, depth + 1)
            return
        if t is dict or t.__module__ == "collections" and t.__name__ == "OrderedDict":
            for k, x in v.items():
                walk(k, depth + 1)
                walk(x, depth + 1)
            return
        if t.__module__ == "numpy" and not getattr(getattr(v, "dtype", None), "hasobject", True):
            return
        found.append(f"{t.__module__}.{t.__qualname__}")

    walk(obj)
    return sorted(set(found))


def load(f: IO[bytes], trusted: Optional[bool] = None, where: Optional[str] = None) -> Any:
    """Read what :func:`save` wrote, with the weights-only unpickler unless ``trusted``
    (``None``: the ``SGD_TRUST_CHECKPOINTS`` switch)."""
    import torch

    data = f.read()
    if resolve_trusted(trusted):
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    try:
        return _weights_only_load(data)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" not in str(exc) and "Unsupported" not in str(exc):
            raise
        raise untrusted_error(str(where or getattr(f, "name", "<stream>")), _unsupported(exc)) from None


class TorchCodec(Codec):
    name = "torch"
    suffix = SUFFIX
    aliases = ("sgd_torch.codec",)

    def save(self, obj: Any, f: IO[bytes]) -> List[str]:
        return save(obj, f)

    def load(self, f: IO[bytes], trusted: bool, where: str) -> Any:
        return load(f, trusted, where)
