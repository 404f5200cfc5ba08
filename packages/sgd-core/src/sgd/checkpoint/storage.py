"""Checkpoint storage: local paths are plain files; URIs go through the
``sgd_checkpoint_storage`` hook (:func:`storage_for`). When no plugin answers, core's own
storage does for any URI that ``pyarrow.fs`` understands (``file://``, ``s3://``, ``gs://``,
``hdfs://``) and for fsspec URIs (``memory://`` and others) when fsspec is installed.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Optional, Tuple

from sgd import plugins

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_uri(path: str) -> bool:
    return bool(_URI.match(path))


class PyArrowStorage:
    """Copies checkpoint directories to and from a ``pyarrow.fs`` filesystem."""

    def __init__(self, fs: Any):
        self.fs = fs

    @classmethod
    def for_uri(cls, uri: str) -> Tuple[PyArrowStorage, str]:
        import pyarrow.fs as pafs

        scheme = uri.split("://", 1)[0]
        if scheme in _FILESYSTEMS:  # a filesystem object given by the caller (filesystem_uri)
            return cls(_FILESYSTEMS[scheme]), uri.split("://", 1)[1]
        try:
            fs, path = pafs.FileSystem.from_uri(uri)
        except Exception:
            import fsspec  # any fsspec filesystem, e.g. memory://

            fs = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(scheme)))
            path = uri.split("://", 1)[1]
            if scheme == "memory":
                path = "/" + path.lstrip("/")
        return cls(fs), path

    def upload_dir(self, local_dir: str, uri: str) -> None:
        import pyarrow.fs as pafs

        _, path = self.for_uri(uri)
        self.fs.create_dir(path, recursive=True)
        pafs.copy_files(local_dir, path, destination_filesystem=self.fs)

    def download_dir(self, uri: str, local_dir: str) -> None:
        import pyarrow.fs as pafs

        _, path = self.for_uri(uri)
        info = self.fs.get_file_info(path)
        if info.type != pafs.FileType.Directory:
            raise FileNotFoundError(f"no checkpoint directory at {uri}")
        os.makedirs(local_dir, exist_ok=True)
        pafs.copy_files(path, local_dir, source_filesystem=self.fs)

    def delete_dir(self, uri: str) -> None:
        _, path = self.for_uri(uri)
        self.fs.delete_dir(path)


#: Filesystem objects given by callers (``RunConfig(storage_filesystem=...)``), by the URI
#: scheme :func:`filesystem_uri` made up for each.
_FILESYSTEMS: Dict[str, Any] = {}


def filesystem_uri(fs: Any, path: str) -> str:
    """A URI standing for ``path`` on the ``pyarrow.fs.FileSystem`` object ``fs`` in this
    process (``sgdfs-<n>://<path>``), which :func:`storage_for` and every checkpoint read and
    write resolve to that object: how ``RunConfig(storage_filesystem=fs, storage_path=path)``
    reaches sgd's checkpoint storage. The scheme lives as long as the process; the same object
    always gets the same one."""
    scheme = next((name for name, known in _FILESYSTEMS.items() if known is fs), None)
    if scheme is None:
        scheme = f"sgdfs-{len(_FILESYSTEMS) + 1}"
        _FILESYSTEMS[scheme] = fs
    return f"{scheme}://{path}"


def path_on(fs: Any, path: str) -> str:
    """``path`` on the ``pyarrow.fs.FileSystem`` ``fs`` as a path or URI sgd reads: ``path``
    itself on a ``LocalFileSystem``, else :func:`filesystem_uri`.

    :raises TypeError: ``fs`` is not a ``pyarrow.fs.FileSystem``.
    """
    import pyarrow.fs as pafs

    if not isinstance(fs, pafs.FileSystem):
        raise TypeError(f"filesystem must be a pyarrow.fs.FileSystem, got {type(fs).__name__}")
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    return filesystem_uri(fs, path)


def filesystem_of(uri: str) -> Any:
    """The ``pyarrow.fs.FileSystem`` ``uri`` lives on (``LocalFileSystem`` for a local path)."""
    import pyarrow.fs as pafs

    if not is_uri(uri):
        return pafs.LocalFileSystem()
    storage = storage_for(uri)
    fs = getattr(storage, "fs", None)
    if isinstance(fs, pafs.FileSystem):
        return fs
    return pafs.FileSystem.from_uri(uri)[0]


def storage_for(uri: str, hook: Optional[Any] = None) -> Any:
    """The checkpoint storage object for ``uri``: the first ``sgd_checkpoint_storage`` hook
    that answers, else core's own ``pyarrow.fs`` storage.

    :param hook: the plugin manager (or its ``.hook``) to ask: a trainer's own
        (``trainer.plugin_manager``); by default the one :func:`sgd.plugins.using` made
        active, else the process-wide one.

    :raises ValueError: nothing handles the URI's scheme (the message says what to install).
    """
    if uri.split("://", 1)[0] in _FILESYSTEMS:
        return PyArrowStorage(_FILESYSTEMS[uri.split("://", 1)[0]])
    storage = plugins.current_hook(hook).sgd_checkpoint_storage(uri=uri)
    if storage is None:
        storage = _builtin_storage(uri)
    if storage is None:
        scheme = uri.split("://", 1)[0]
        raise ValueError(
            f"no checkpoint storage for {scheme}:// URIs; install pyarrow (and fsspec for fsspec-only "
            "schemes) or a plugin that provides it (see `sgd plugins`)."
        )
    return storage


def _builtin_storage(uri: str) -> Optional[PyArrowStorage]:
    if not is_uri(uri):
        return None
    try:
        storage, _ = PyArrowStorage.for_uri(uri)
    except Exception:  # pyarrow missing, or a scheme neither pyarrow nor fsspec knows
        return None
    return storage
