"""Checkpoint codecs: how a dict checkpoint's state becomes one file, and back.

A codec is chosen by the name written in ``.sgd_checkpoint.json``, and only among
registered codecs: sgd-core's own (``"sgd"``, ``"pickle"``) and those plugins return from
the ``sgd_checkpoint_codecs`` hook. A name read from disk is a key in that table,
never a module to import.

``"sgd"`` (the default) stores plain data (None, bools, ints, floats, complex, strings,
bytes, lists, tuples, dicts, sets, numpy arrays and scalars of non-object dtype) in a
format that cannot run code: a JSON tree plus ``.npy`` blobs read with
``allow_pickle=False``. State holding anything else (a custom class, a Keras model) is
written with cloudpickle instead, and reading it back needs the caller's opt-in
(``trusted=True`` or ``SGD_TRUST_CHECKPOINTS=1``).

Public for plugin authors: a backend package that needs its own format subclasses
:class:`Codec` (or :class:`SafeCodec`) and returns an instance from the
``sgd_checkpoint_codecs`` hook, as sgd-torch and sgd-tensorflow do.
"""

from __future__ import annotations

import io
import json
import os
import struct
from collections import OrderedDict
from typing import IO, Any, Dict, List, Optional, Tuple

from sgd import plugins
from sgd.errors import CheckpointIntegrityError, UntrustedCheckpointError

__all__ = [
    "TRUST_ENV",
    "Codec",
    "PickleCodec",
    "SafeCodec",
    "find_unsafe",
    "get_codec",
    "is_safe_format",
    "load_safe",
    "registered_codecs",
    "resolve_trusted",
    "save_safe",
    "untrusted_error",
]

#: The environment variable that trusts every checkpoint this process loads.
TRUST_ENV = "SGD_TRUST_CHECKPOINTS"

_MAGIC = b"SGDSTATE1\n"
_TRAILER = struct.Struct("<Q")  # length of the JSON tree, at the very end of the file
_TAG = "$sgd"


def resolve_trusted(trusted: Optional[bool]) -> bool:
    """The caller's ``trusted`` argument, or the ``SGD_TRUST_CHECKPOINTS`` switch when it is ``None``."""
    if trusted is not None:
        return bool(trusted)
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def untrusted_error(where: str, types: List[str]) -> Exception:

    what = f"objects of type {', '.join(sorted(set(types)))}" if types else "Python objects"
    return UntrustedCheckpointError(
        f"checkpoint {where} holds {what} that only pickle can load, and unpickling runs whatever "
        f"code the file names. Load it only if you trust where it came from: pass trusted=True "
        f"(e.g. Checkpoint.from_directory(path, trusted=True), Trainer.load_checkpoint_from_path(path, "
        f"trusted=True), Trainer.restore(run_dir, trusted=True)) or set {TRUST_ENV}=1."
    )


class Codec:
    """A way to write a dict state into one file.

    :ivar name: the name written into the checkpoint's metadata.
    :ivar suffix: the state file's extension (``state.<suffix>``).
    :ivar aliases: older names that mean this codec (metadata written by earlier versions).
    """

    name = ""
    suffix = ""
    aliases: Tuple[str, ...] = ()

    def save(self, obj: Any, f: IO[bytes]) -> List[str]:
        """Write ``obj``; return the type names that made it need pickle (empty: safe to load)."""
        raise NotImplementedError

    def load(self, f: IO[bytes], trusted: bool, where: str) -> Any:
        """Read what :meth:`save` wrote. Without ``trusted`` no code named by the file may run;
        raise :func:`untrusted_error` for content that needs it."""
        raise NotImplementedError


# --- the safe tree format ---------------------------------------------------------


class _Unsafe(Exception):
    pass


class _Writer:
    def __init__(self, f: Optional[IO[bytes]]):
        self.f = f  # None: a dry run that only collects the unsupported types
        self.pos = 0
        self.unsafe: List[str] = []

    def blob(self, data: bytes) -> List[int]:
        if self.f is None:
            return [0, 0]
        self.f.write(data)
        where = [self.pos, len(data)]
        self.pos += len(data)
        return where

    def encode(self, v: Any) -> Any:
        t = type(v)
        if v is None or t is bool or t is int or t is str or t is float:
            return v
        if t is list:
            return [self.encode(x) for x in v]
        if t is dict:
            if all(type(k) is str for k in v) and _TAG not in v:
                return {k: self.encode(x) for k, x in v.items()}
            return {_TAG: "dict", "items": [[self.encode(k), self.encode(x)] for k, x in v.items()]}
        if t is OrderedDict:
            return {_TAG: "odict", "items": [[self.encode(k), self.encode(x)] for k, x in v.items()]}
        if t is tuple:
            return {_TAG: "tuple", "items": [self.encode(x) for x in v]}
        if t is set or t is frozenset:
            return {_TAG: t.__name__, "items": [self.encode(x) for x in v]}
        if t is complex:
            return {_TAG: "complex", "re": v.real, "im": v.imag}
        if t is bytes or t is bytearray:
            return {_TAG: t.__name__, "blob": self.blob(bytes(v))}
        if t.__module__ == "numpy" and getattr(v, "dtype", None) is not None and not v.dtype.hasobject:
            if self.f is None:
                return None
            import numpy as np

            buf = io.BytesIO()
            np.save(buf, np.asarray(v), allow_pickle=False)
            return {_TAG: "ndarray" if t is np.ndarray else "npscalar", "blob": self.blob(buf.getvalue())}
        self.unsafe.append(f"{t.__module__}.{t.__qualname__}")
        return None


def _decode(v: Any, data: memoryview, where: str) -> Any:
    if isinstance(v, list):
        return [_decode(x, data, where) for x in v]
    if not isinstance(v, dict):
        return v
    tag = v.get(_TAG)
    if tag is None:
        return {k: _decode(x, data, where) for k, x in v.items()}
    if tag in ("dict", "odict"):
        pairs = [(_decode(k, data, where), _decode(x, data, where)) for k, x in v["items"]]
        return OrderedDict(pairs) if tag == "odict" else dict(pairs)
    if tag == "tuple":
        return tuple(_decode(x, data, where) for x in v["items"])
    if tag in ("set", "frozenset"):
        items = [_decode(x, data, where) for x in v["items"]]
        return set(items) if tag == "set" else frozenset(items)
    if tag == "complex":
        return complex(v["re"], v["im"])
    if tag in ("bytes", "bytearray", "ndarray", "npscalar"):
        start, length = (int(x) for x in v["blob"])
        if start < 0 or length < 0 or start + length > len(data):
            raise ValueError(f"a blob lies outside the file (offset {start}, length {length})")
        raw = data[start:start + length]
        if tag == "bytes":
            return bytes(raw)
        if tag == "bytearray":
            return bytearray(raw)
        import numpy as np

        arr = np.load(io.BytesIO(raw), allow_pickle=False)
        return arr if tag == "ndarray" else arr[()]
    raise ValueError(f"unknown tag {tag!r}")


def save_safe(obj: Any, f: IO[bytes]) -> List[str]:
    """Write ``obj`` in the safe tree format; return the unsupported types (then nothing
    useful was written and the caller must use another format)."""
    f.write(_MAGIC)
    w = _Writer(f)
    tree = w.encode(obj)
    if w.unsafe:
        return w.unsafe
    body = json.dumps(tree, allow_nan=True).encode()
    f.write(body)
    f.write(_TRAILER.pack(len(body)))
    return []


def is_safe_format(head: bytes) -> bool:
    return head.startswith(_MAGIC)


def load_safe(raw: bytes) -> Any:
    """Read the safe tree format (raises ``ValueError`` on malformed input)."""
    if not raw.startswith(_MAGIC) or len(raw) < len(_MAGIC) + _TRAILER.size:
        raise ValueError("not an sgd state file (or cut short)")
    (n,) = _TRAILER.unpack(raw[-_TRAILER.size:])
    end = len(raw) - _TRAILER.size
    if n > end - len(_MAGIC):
        raise ValueError("the file is cut short")
    data = memoryview(raw)[len(_MAGIC):end - n]
    tree = json.loads(bytes(raw[end - n:end]))
    return _decode(tree, data, "")


def find_unsafe(obj: Any) -> List[str]:
    """The types in ``obj`` that the safe format cannot hold (a dry run, nothing kept)."""
    w = _Writer(None)
    w.encode(obj)
    return w.unsafe


class SafeCodec(Codec):
    """The default codec: the safe tree format, cloudpickle only for what it cannot hold."""

    name = "sgd"
    suffix = "sgd"
    aliases: Tuple[str, ...] = ("sgd._internal.codec",)

    def prepare(self, obj: Any) -> Any:
        """Hook for subclasses: turn objects into what is written."""
        return obj

    def save(self, obj: Any, f: IO[bytes]) -> List[str]:
        obj = self.prepare(obj)
        start = f.tell()
        unsafe = save_safe(obj, f)
        if not unsafe:
            return []
        import ray.cloudpickle as cloudpickle

        f.seek(start)
        f.truncate()
        cloudpickle.dump(obj, f)
        return sorted(set(unsafe))

    def load(self, f: IO[bytes], trusted: bool, where: str) -> Any:
        raw = f.read()
        if is_safe_format(raw):
            return load_safe(raw)
        if not trusted:
            raise untrusted_error(where, [])
        import ray.cloudpickle as cloudpickle

        return cloudpickle.loads(raw)


class PickleCodec(SafeCodec):
    """Always cloudpickle (for state that must keep its Python objects); loading needs trust."""

    name = "pickle"
    suffix = "pkl"
    aliases = ()

    def save(self, obj: Any, f: IO[bytes]) -> List[str]:
        import ray.cloudpickle as cloudpickle

        cloudpickle.dump(obj, f)
        return [type(obj).__qualname__]


_BUILTIN: Tuple[Codec, ...] = (SafeCodec(), PickleCodec())


def registered_codecs(hook: Optional[Any] = None) -> Dict[str, Codec]:
    """Every registered codec by name and alias (sgd-core's plus the ``sgd_checkpoint_codecs`` hook's).

    :param hook: the plugin manager (or its ``.hook``) to ask: a trainer's own
        (``trainer.plugin_manager``); by default the one :func:`sgd.plugins.using` made
        active, else the process-wide one.
    """
    codecs: List[Codec] = list(_BUILTIN)
    for found in plugins.current_hook(hook).sgd_checkpoint_codecs():
        codecs.extend(found or [])
    table: Dict[str, Codec] = {}
    for c in codecs:
        for name in (c.name, *c.aliases):
            table.setdefault(name, c)
    return table


def get_codec(name: Any, where: Optional[str] = None, hook: Optional[Any] = None) -> Codec:
    """The registered codec called ``name``.

    :param hook: the plugin manager to ask, as for :func:`registered_codecs`.

    :raises CheckpointIntegrityError: no codec has that name (reading ``where``).
    :raises ValueError: no codec has that name (writing).
    """
    table = registered_codecs(hook)
    codec = table.get(name) if isinstance(name, str) else None
    if codec is not None:
        return codec
    known = ", ".join(sorted({c.name for c in table.values()}))
    if where is None:
        raise ValueError(f"unknown checkpoint codec {name!r}; registered codecs: {known}")

    raise CheckpointIntegrityError(
        f"checkpoint {where} names codec {name!r} in its metadata, which is not a registered codec "
        f"(registered: {known}); install the plugin that provides it (see `sgd plugins`) or check "
        "where the checkpoint came from."
    )
