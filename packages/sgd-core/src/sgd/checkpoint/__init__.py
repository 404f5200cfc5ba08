"""Checkpoints: the format, integrity checks, storage URIs.

- :mod:`sgd.checkpoint.format`: :class:`Checkpoint` (a directory or a dict),
  :class:`CheckpointStrategy` (what to keep), the on-disk layout and its metadata.
- :mod:`sgd.checkpoint.codecs`: how a dict's state becomes one file (``sgd.codecs`` is the
  same module under its older public name).
- :mod:`sgd.checkpoint.integrity`: digests, confinement to the directory, disk-full errors.
- :mod:`sgd.checkpoint.storage`: local paths and URIs (the ``sgd_checkpoint_storage`` hook).
- The driver's ``CheckpointManager`` (registering what workers write into the run's checkpoint
  folder, committing, keeping the top K, mirroring) is :mod:`sgd.storage.manager`;
  ``sgd.checkpoint.manager`` is its deprecated old name.

This module only re-exports the public names.
"""

from sgd.checkpoint.codecs import TRUST_ENV
from sgd.checkpoint.format import (
    DEFAULT_CODEC,
    METADATA_FILE,
    SHARDED_KEY,
    Checkpoint,
    CheckpointError,
    CheckpointIntegrityError,
    CheckpointStrategy,
    UntrustedCheckpointError,
    is_sharded,
    newest_loadable,
    write_dict_dir,
    write_directory_metadata,
    write_files,
    write_sharded_metadata,
)

__all__ = [
    "DEFAULT_CODEC",
    "METADATA_FILE",
    "SHARDED_KEY",
    "TRUST_ENV",
    "Checkpoint",
    "CheckpointError",
    "CheckpointIntegrityError",
    "CheckpointStrategy",
    "UntrustedCheckpointError",
    "is_sharded",
    "newest_loadable",
    "write_dict_dir",
    "write_directory_metadata",
    "write_files",
    "write_sharded_metadata",
]
