"""A fitted preprocessor kept with a checkpoint, stored so that loading it runs no code.

Ray AIR kept the trainer's preprocessor in every checkpoint (``checkpoint.get_preprocessor()``).
sgd keeps it in a file of the checkpoint directory, :data:`PREPROCESSOR_FILE` (in an in-memory
dict checkpoint: the same bytes under :data:`PREPROCESSOR_KEY`).

Ray Data's own preprocessors (the classes of ``ray.data.preprocessors``, ``Chain`` of them
included) are written as their class name and their state in sgd's safe tree format: loading
looks the name up among those classes only and sets the state, so nothing the file names is
imported or run. Any other preprocessor (a subclass of your own) is pickled, and loading it
needs the caller's opt-in (``trusted=True`` or ``SGD_TRUST_CHECKPOINTS=1``), like any pickled
checkpoint content.
"""

from __future__ import annotations

import io
from typing import Any, Dict, Optional, Union

from sgd.checkpoint.codecs import find_unsafe, load_safe, resolve_trusted, save_safe
from sgd.errors import CheckpointError, UntrustedCheckpointError

__all__ = ["PREPROCESSOR_FILE", "PREPROCESSOR_KEY", "encode_preprocessor", "decode_preprocessor"]

#: The file a checkpoint directory keeps its preprocessor in.
PREPROCESSOR_FILE = "preprocessor.sgd"
#: The key of a dict checkpoint that holds the encoded preprocessor (Ray AIR's key).
PREPROCESSOR_KEY = "_preprocessor"

_CLASS = "$preprocessor"
_FORMAT = "sgd-preprocessor/1"


def _ray_class(name: Any) -> Optional[Any]:
    """The class of ``ray.data.preprocessors`` called ``name``, else ``None`` (never an import by name)."""
    try:
        import ray.data.preprocessors as builtin
        from ray.data.preprocessor import Preprocessor
    except ImportError:
        return None
    cls = getattr(builtin, name, None) if isinstance(name, str) and not name.startswith("_") else None
    if isinstance(cls, type) and issubclass(cls, Preprocessor) and cls.__module__.startswith("ray.data.preprocessors"):
        return cls
    return None


def _tree(value: Any) -> Any:
    """``value`` with every built-in Ray preprocessor in it replaced by ``{$preprocessor: name, state}``."""
    cls = type(value)
    if _ray_class(cls.__name__) is cls:
        return {_CLASS: cls.__name__, "state": _tree(value.__getstate__())}
    if cls is dict:
        return {k: _tree(v) for k, v in value.items()}
    if cls in (list, tuple):
        return cls(_tree(v) for v in value)
    return value


def _build(value: Any) -> Any:
    if type(value) is dict and _CLASS in value:
        cls = _ray_class(value[_CLASS])
        if cls is None:
            raise CheckpointError(f"the checkpoint's preprocessor names {value[_CLASS]!r}, which is not a class of "
                                  "ray.data.preprocessors in this Ray version")
        obj = cls.__new__(cls)  # no __init__: the state below is the whole object
        obj.__setstate__(_build(value.get("state") or {}))
        return obj
    if type(value) is dict:
        return {k: _build(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_build(v) for v in value)
    return value


def encode_preprocessor(preprocessor: Any) -> bytes:
    """The bytes that keep ``preprocessor``: its safe tree when it is made of Ray Data's own
    preprocessors and plain data, else a pickle (loaded only with trust)."""
    tree = _tree(preprocessor)
    f = io.BytesIO()
    if isinstance(tree, dict) and _CLASS in tree and not find_unsafe(tree):
        save_safe({"format": _FORMAT, "tree": tree}, f)
        return f.getvalue()
    import ray.cloudpickle as cloudpickle

    t = type(preprocessor)
    save_safe({"format": "pickle", "class": f"{t.__module__}.{t.__qualname__}",
               "pickle": cloudpickle.dumps(preprocessor)}, f)
    return f.getvalue()


def decode_preprocessor(data: Union[bytes, bytearray], trusted: Optional[bool] = None, where: str = "") -> Any:
    """The preprocessor :func:`encode_preprocessor` kept.

    :raises UntrustedCheckpointError: it was pickled (not one of Ray Data's own) and the
        caller did not opt in.
    :raises CheckpointError: the bytes are not a kept preprocessor.
    """
    try:
        record: Dict[str, Any] = load_safe(bytes(data))
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {where}: its {PREPROCESSOR_FILE} is damaged ({exc})") from exc
    if not isinstance(record, dict) or record.get("format") not in (_FORMAT, "pickle"):
        raise CheckpointError(f"checkpoint {where}: its {PREPROCESSOR_FILE} is not a preprocessor sgd wrote")
    if record["format"] == _FORMAT:
        return _build(record.get("tree"))
    if not resolve_trusted(trusted):
        raise UntrustedCheckpointError(
            f"checkpoint {where} keeps a preprocessor of class {record.get('class')} that only pickle can load, and "
            "unpickling runs whatever code the file names (Ray Data's own preprocessors load without it). Load "
            "it only if you trust where it came from: get_preprocessor(trusted=True), "
            "Checkpoint.from_directory(path, trusted=True) or SGD_TRUST_CHECKPOINTS=1.")
    import ray.cloudpickle as cloudpickle

    try:
        return cloudpickle.loads(record["pickle"])
    except (ImportError, AttributeError) as exc:
        raise CheckpointError(
            f"checkpoint {where}: its preprocessor of class {record.get('class')} cannot be loaded here: {exc}. "
            "Import or install the module that defines it.") from exc
