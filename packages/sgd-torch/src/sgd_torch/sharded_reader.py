"""Reading a sharded checkpoint's files without running code from them.

DCP's ``.metadata`` file is a pickle: :class:`SafeFileSystemReader` reads it with an unpickler
that builds only DCP's own metadata classes, in place or from the driver's disk through sgd's
file server; :class:`SafeLoadPlanner` reads values stored as bytes with
``torch.load(weights_only=True)``. Both are public as ``sgd_torch.sharded.SafeFileSystemReader``
and ``sgd_torch.sharded.SafeLoadPlanner``, their ``__module__``.
"""

from __future__ import annotations

import io
import os
import pickle
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element  # what DCP's own planner uses
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from sgd.checkpoint import UntrustedCheckpointError

#: DCP's own metadata file in a checkpoint folder (a pickle).
_DCP_METADATA = ".metadata"


def _allowed(module: str, name: str) -> Any:
    """The objects a DCP ``.metadata`` pickle may name: DCP's metadata classes, ``torch.Size``,
    dtypes, layouts, memory formats and paths. Nothing that runs code when called."""
    import pathlib

    import torch.distributed.checkpoint.filesystem as dcp_fs
    import torch.distributed.checkpoint.metadata as dcp_meta

    if module == "torch.distributed.checkpoint.metadata" and not name.startswith("__"):
        obj = getattr(dcp_meta, name, None)
        if isinstance(obj, type):
            return obj
    if module == "torch.distributed.checkpoint.filesystem" and name == "_StorageInfo":
        return dcp_fs._StorageInfo
    if module == "torch" and name == "Size":
        return torch.Size
    if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
        return getattr(torch, name)
    if module == "torch.serialization" and name == "_get_layout":
        return _layout_by_name
    if module == "pathlib" and name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
        return getattr(pathlib, name)
    if module == "collections" and name == "OrderedDict":
        import collections

        return collections.OrderedDict
    return None


def _layout_by_name(name: str) -> Any:
    layout = getattr(torch, str(name).replace("torch.", ""), None)
    if not isinstance(layout, torch.layout):
        raise UntrustedCheckpointError(f"unknown tensor layout {name!r} in a sharded checkpoint's metadata")
    return layout


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, where: str):
        super().__init__(file)
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        obj = _allowed(module, name)
        if obj is None:
            raise UntrustedCheckpointError(
                f"sharded checkpoint {self._where}: its {_DCP_METADATA} names {module}.{name}, which is not part of "
                "torch.distributed.checkpoint's metadata; it was altered or not written by sgd, and is not loaded")
        return obj


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader, reading the ``.metadata`` pickle with an unpickler that builds only
    DCP's metadata classes (``torch.distributed.checkpoint.FileSystemReader`` unpickles anything).

    :param path: the checkpoint folder.
    :param driver_files: read it from the driver's disk through sgd's file server
        (``Session.driver_files``) instead of this host's: each tensor's byte range, fetched
        when DCP asks for it.
    """

    def __init__(self, path: Any, driver_files: Any = None) -> None:
        super().__init__(path)
        self._driver_files = driver_files
        if driver_files is not None:
            self.fs = _DriverFileSystem()

    def _read_file(self, name: str) -> bytes:
        where = os.path.join(str(self.path), name)
        if self._driver_files is None:
            with open(where, "rb") as f:
                return f.read()
        return self._driver_files.read(where, 0, self._driver_files.size(where))

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        if self._driver_files is None:
            return super()._slice_file(file, sinfo)
        return io.BytesIO(self._driver_files.read(str(file), sinfo.offset, sinfo.length))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise UntrustedCheckpointError("per-rank DCP metadata files are not read by sgd")
        where = str(self.path)
        metadata = _MetadataUnpickler(io.BytesIO(self._read_file(_DCP_METADATA)), where).load()
        if not isinstance(metadata, Metadata):
            raise UntrustedCheckpointError(f"sharded checkpoint {where}: {_DCP_METADATA} does not hold DCP metadata")
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = getattr(self, "load_id", None)
        metadata.storage_meta = storage_meta
        return metadata


class _DriverFileSystem(FileSystem):
    """Paths on the driver's host: a "stream" is the file's path; :meth:`SafeFileSystemReader._slice_file`
    fetches each byte range through the file server."""

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        if mode != "rb":
            raise PermissionError(f"{path} on the driver's host is opened for reading only")
        yield str(path)


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, reading values stored as bytes with ``torch.load(weights_only=True)``
    (plain values and tensors only; DCP's own planner unpickles anything)."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


SafeFileSystemReader.__module__ = "sgd_torch.sharded"
SafeLoadPlanner.__module__ = "sgd_torch.sharded"
