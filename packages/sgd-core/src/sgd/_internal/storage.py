"""Checkpoint storage: local paths are plain files; URIs go through the
``sgd_checkpoint_storage`` hook (:func:`sgd.plugins.get_storage`). Core's built-in plugin answers for any URI
that ``pyarrow.fs`` understands (``file://``, ``s3://``, ``gs://``, ``hdfs://``)
and for fsspec URIs (``memory://`` and others) when fsspec is installed.
"""

from __future__ import annotations

import os
import re
from typing import Any, Tuple

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
