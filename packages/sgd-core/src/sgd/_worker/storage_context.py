"""What ``sgd.get_context().get_storage()`` returns: the fields of Ray Train's ``StorageContext``
that user code reads, for the run's folder."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sgd._common.public import public_module


@public_module("sgd.session")
@dataclass(frozen=True)
class StorageContext:
    """Where this run is kept (Ray Train's ``get_context().get_storage()``, a developer API).

    sgd keeps a run's folder on the driver's disk (a storage URI, or
    ``RunConfig(storage_filesystem=...)``, receives copies of its checkpoints), so
    ``storage_filesystem`` is a ``pyarrow.fs.LocalFileSystem`` and the paths are on the driver's
    host. A worker on another host reaches that folder only through sgd (its checkpoints and
    reports); write your own files to shared storage of your choosing there.

    :ivar storage_fs_path: the folder the run's folder is in (``RunConfig(storage_path)``, or
        the results root).
    :ivar experiment_dir_name: the run's folder's name (``RunConfig(name)``).
    """

    storage_fs_path: str
    experiment_dir_name: str

    @classmethod
    def for_run_dir(cls, run_dir: str) -> StorageContext:
        """The storage of the run whose folder is ``run_dir``."""
        path = Path(run_dir)
        return cls(storage_fs_path=path.parent.as_posix(), experiment_dir_name=path.name)

    @property
    def storage_filesystem(self) -> Any:
        """``pyarrow.fs.LocalFileSystem()``: the run's folder is on the driver's disk."""
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem()

    @property
    def storage_path(self) -> str:
        """Ray's name of :attr:`storage_fs_path` as it was given."""
        return self.storage_fs_path

    @property
    def experiment_fs_path(self) -> str:
        """The run's folder (``storage_path/name``)."""
        return Path(self.storage_fs_path, self.experiment_dir_name).as_posix()

    @property
    def checkpoint_fs_path(self) -> str:
        """The folder the run's kept checkpoints are committed in."""
        return Path(self.experiment_fs_path, "checkpoints").as_posix()

    @property
    def local_working_directory(self) -> str:
        """This worker's working directory."""
        return os.getcwd()

    def build_checkpoint_path_from_name(self, name: str) -> str:
        """Where a checkpoint committed as ``name`` lies (``checkpoint_fs_path/name``)."""
        return Path(self.checkpoint_fs_path, name).as_posix()

    def __str__(self) -> str:
        return (f"StorageContext<storage_filesystem='local', storage_fs_path='{self.storage_fs_path}', "
                f"experiment_dir_name='{self.experiment_dir_name}'>")
