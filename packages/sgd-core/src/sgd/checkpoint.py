"""Checkpoints: ``Checkpoint`` (a directory or a dict), ``CheckpointStrategy`` (what to keep).

A dict checkpoint on disk is a directory holding ``state.<codec>`` and
``.sgd_checkpoint.json`` (which codec wrote it). The codec is a module path
with ``save(obj, path)`` and ``load(path)``: ``sgd._internal.codec`` (pickle)
by default, ``sgd_torch.codec`` (``torch.save`` / ``torch.load``) for torch.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Union

METADATA_FILE = ".sgd_checkpoint.json"
DEFAULT_CODEC = "sgd._internal.codec"


@dataclass
class CheckpointStrategy:
    """Which checkpoints of a run to keep on disk.

    :param num_to_keep: ``None`` keeps all, ``0`` persists none, ``K`` keeps the K best
        (the latest is kept too, until a newer one exists, so a run can always resume).
    :param checkpoint_score_attribute: key of the checkpoint state to rank by.
    :param checkpoint_score_order: ``"max"`` or ``"min"``. NaN scores rank worst.
    """

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: str = "_timestamp"
    checkpoint_score_order: str = "max"

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (not isinstance(self.num_to_keep, int) or self.num_to_keep < 0):
            raise ValueError(f"num_to_keep must be None or an int >= 0, got {self.num_to_keep!r}")
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(f"checkpoint_score_order must be 'max' or 'min', got {self.checkpoint_score_order!r}")
        if not isinstance(self.checkpoint_score_attribute, str) or not self.checkpoint_score_attribute:
            raise ValueError("checkpoint_score_attribute must be a non-empty string")

    def score(self, state: Dict[str, Any]) -> float:
        """The ranking score of ``state`` (higher is better after applying the order).

        :raises ValueError: the attribute is missing or not a number.
        """
        attr = self.checkpoint_score_attribute
        if attr not in state:
            raise ValueError(
                f"checkpoint_score_attribute {attr!r} is not in the checkpoint (keys: "
                f"{', '.join(sorted(map(str, state))) or 'none'}); pass it to sgd.save_checkpoint or "
                "choose another attribute."
            )
        value = state[attr]
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
            raise ValueError(f"checkpoint_score_attribute {attr!r} must be a number, got {type(value).__name__}")
        try:
            value = float(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint_score_attribute {attr!r} must be a number, got {value!r}") from exc
        if math.isnan(value):
            return -math.inf
        return value if self.checkpoint_score_order == "max" else -value


def _codec(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"this checkpoint was written with codec {name!r}, which is not installed ({exc})") from exc


class Checkpoint:
    """A checkpoint: a directory (local or remote through the storage hook) or an in-memory dict.

    ``Checkpoint.from_dict(d).to_dict() == d``; ``to_directory`` writes a
    directory any ``Checkpoint.from_directory`` can read.
    """

    def __init__(self, path: Optional[Union[str, os.PathLike]] = None, data: Optional[Dict[str, Any]] = None,
                 codec: str = DEFAULT_CODEC):
        if (path is None) == (data is None):
            raise ValueError("a Checkpoint has either a path or a dict, not both or neither")
        self._path = str(path) if path is not None else None
        self._data = data
        self._codec = codec

    # --- constructors ---------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Dict[str, Any], codec: str = DEFAULT_CODEC) -> Checkpoint:
        if not isinstance(data, dict):
            raise TypeError(f"Checkpoint.from_dict takes a dict, got {type(data).__name__}")
        return cls(data=data, codec=codec)

    @classmethod
    def from_directory(cls, path: Union[str, os.PathLike]) -> Checkpoint:
        from sgd._internal.storage import is_uri

        if not is_uri(str(path)) and not Path(path).is_dir():
            raise FileNotFoundError(f"no checkpoint directory at {path}")
        return cls(path=path)

    # --- accessors ------------------------------------------------------------------

    @property
    def path(self) -> Optional[str]:
        """The directory (or URI) this checkpoint lives in; ``None`` for a dict checkpoint."""
        return self._path

    def to_dict(self) -> Dict[str, Any]:
        """The checkpoint's state. A directory that was not written from a dict gives
        ``{"_directory_files": {relative_path: bytes}}``."""
        if self._data is not None:
            return self._data
        with self.as_directory() as local:
            return _read_dict(Path(local))

    def to_directory(self, path: Optional[Union[str, os.PathLike]] = None) -> str:
        """Write the checkpoint to ``path`` (a new temporary directory if ``None``); returns it."""
        from sgd._internal.storage import is_uri
        from sgd.plugins import get_storage

        target = str(path) if path is not None else tempfile.mkdtemp(prefix="sgd_checkpoint_")
        if is_uri(target):
            with self.as_directory() as local:
                get_storage(target).upload_dir(local, target)
            return target
        if self._data is not None:
            write_dict_dir(self._data, Path(target), self._codec)
        else:
            with self.as_directory() as local:
                if Path(local).resolve() != Path(target).resolve():
                    shutil.copytree(local, target, dirs_exist_ok=True)
        return target

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local directory with the checkpoint's files, for the ``with`` block.

        A local checkpoint directory is yielded as is (do not change it);
        dicts and remote checkpoints are materialised in a temporary directory.
        """
        from sgd._internal.storage import is_uri
        from sgd.plugins import get_storage

        if self._path is not None and not is_uri(self._path):
            yield self._path
            return
        tmp = tempfile.mkdtemp(prefix="sgd_checkpoint_")
        try:
            if self._path is not None:
                get_storage(self._path).download_dir(self._path, tmp)
            else:
                assert self._data is not None
                write_dict_dir(self._data, Path(tmp), self._codec)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def __repr__(self) -> str:
        if self._path:
            return f"Checkpoint(path={self._path!r})"
        return f"Checkpoint(dict with {len(self._data or {})} keys)"


def write_dict_dir(data: Dict[str, Any], directory: Path, codec: str = DEFAULT_CODEC,
                   extra_meta: Optional[Dict[str, Any]] = None) -> None:
    """Write ``data`` into ``directory`` with ``codec`` (files are fsynced)."""
    directory.mkdir(parents=True, exist_ok=True)
    mod = _codec(codec)
    state_file = directory / f"state.{mod.SUFFIX}"
    with open(state_file, "wb") as f:
        mod.save(data, f)
        f.flush()
        os.fsync(f.fileno())
    meta = directory / METADATA_FILE
    with open(meta, "w") as f:
        json.dump({"format": "dict", "codec": codec, "state_file": state_file.name, **(extra_meta or {})}, f)
        f.flush()
        os.fsync(f.fileno())


def write_directory_metadata(directory: Path, extra_meta: Optional[Dict[str, Any]] = None) -> None:
    """Mark ``directory`` as a directory checkpoint (its files are the checkpoint, as they are)."""
    with open(directory / METADATA_FILE, "w") as f:
        json.dump({"format": "directory", **(extra_meta or {})}, f)
        f.flush()
        os.fsync(f.fileno())


def write_files(files: Dict[str, bytes], directory: Path, overwrite: bool = True) -> None:
    """Write ``{relative_path: bytes}`` under ``directory`` (fsynced)."""
    for rel, content in files.items():
        target = directory / rel
        if not target.resolve().is_relative_to(directory.resolve()):
            raise ValueError(f"checkpoint file {rel!r} would be written outside {directory}")
        if not overwrite and target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())


def _read_dict(directory: Path) -> Dict[str, Any]:
    meta_file = directory / METADATA_FILE
    meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    if meta.get("format") == "dict":
        mod = _codec(meta["codec"])
        with open(directory / meta["state_file"], "rb") as f:
            return mod.load(f)
    files = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name != METADATA_FILE:
            files[str(p.relative_to(directory))] = p.read_bytes()
    return {"_directory_files": files}
