"""Checkpoints: ``Checkpoint`` (a directory or a dict), ``CheckpointStrategy`` (what to keep).

A dict checkpoint on disk is a directory holding ``state.<suffix>`` and
``.sgd_checkpoint.json``: which registered codec wrote it (see :mod:`sgd.codecs`;
``"sgd"`` by default, ``"torch"`` for torch) and the sha256 and size of every file.

Loading verifies every file, confines the metadata to the checkpoint directory and never
unpickles arbitrary objects unless the caller opts in: ``trusted=True`` or
``SGD_TRUST_CHECKPOINTS=1`` (:class:`UntrustedCheckpointError` otherwise).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple, Union

from sgd.checkpoint import integrity
from sgd.checkpoint.codecs import TRUST_ENV, get_codec, resolve_trusted
from sgd.checkpoint.encoded import EncodedState, decode_state
from sgd.checkpoint.preprocessor import PREPROCESSOR_FILE, PREPROCESSOR_KEY, decode_preprocessor
from sgd.checkpoint.storage import is_uri, path_on, storage_for
from sgd.checkpoint.user_metadata import UserMetadata, write_local
from sgd.errors import CheckpointError, CheckpointIntegrityError, UntrustedCheckpointError

logger = logging.getLogger("sgd")

METADATA_FILE = integrity.METADATA_FILE
DEFAULT_CODEC = "sgd"
#: The key of the dict a sharded checkpoint loads as (``Checkpoint.to_dict()``,
#: ``sgd.load_checkpoint()``): its directory. The rest of the dict is its metadata.
SHARDED_KEY = "_sharded_checkpoint"

__all__ = ["Checkpoint", "CheckpointStrategy", "CheckpointError", "CheckpointIntegrityError",
           "UntrustedCheckpointError", "TRUST_ENV", "SHARDED_KEY"]


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


class Checkpoint(UserMetadata):
    """A checkpoint: a directory (local or remote through the storage hook) or an in-memory dict.

    ``Checkpoint.from_dict(d).to_dict() == d``; ``to_directory`` writes a
    directory any ``Checkpoint.from_directory`` can read.

    :param trusted: for a directory, whether :meth:`to_dict` may unpickle arbitrary objects
        from it. ``None`` (default) follows ``SGD_TRUST_CHECKPOINTS=1``; otherwise only
        tensors and plain data load, and :class:`UntrustedCheckpointError` says what needs more.
    :param filesystem: Ray Train's: the ``pyarrow.fs.FileSystem`` ``path`` is on (``path`` then
        without a URI prefix); it may be passed second, as Ray's ``Checkpoint(path, filesystem)``.
        The checkpoint is read through it in this process.

    Ray Train's ``get_metadata()``, ``set_metadata(dict)``, ``update_metadata(dict)`` and
    ``filesystem`` are there too (:class:`~sgd.checkpoint.user_metadata.UserMetadata`).
    """

    def __init__(self, path: Optional[Union[str, os.PathLike]] = None, data: Optional[Dict[str, Any]] = None,
                 codec: str = DEFAULT_CODEC, trusted: Optional[bool] = None, *, filesystem: Any = None):
        if filesystem is None and data is not None and type(data).__module__.startswith("pyarrow"):
            data, filesystem = None, data  # Ray's Checkpoint(path, filesystem)
        if filesystem is not None and path is not None:
            path = path_on(filesystem, os.fspath(path))
        if (path is None) == (data is None):
            raise ValueError("a Checkpoint has either a path or a dict, not both or neither")
        self._path = str(path) if path is not None else None
        self._data = data
        self._codec = codec
        self.trusted = trusted

    # --- constructors ---------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Dict[str, Any], codec: str = DEFAULT_CODEC) -> Checkpoint:
        if not isinstance(data, dict):
            raise TypeError(f"Checkpoint.from_dict takes a dict, got {type(data).__name__}")
        return cls(data=data, codec=codec)

    @classmethod
    def from_directory(cls, path: Union[str, os.PathLike], trusted: Optional[bool] = None) -> Checkpoint:
        """The checkpoint in ``path`` (a local directory or a storage URI).

        :param trusted: allow :meth:`to_dict` to unpickle arbitrary objects (see the class).
        """

        if not is_uri(str(path)) and not Path(path).is_dir():
            raise FileNotFoundError(f"no checkpoint directory at {path}")
        return cls(path=path, trusted=trusted)

    @classmethod
    def newest_in(cls, folder: Union[str, os.PathLike], trusted: Optional[bool] = None) -> Optional[Checkpoint]:
        """The newest checkpoint in a run's ``checkpoints`` folder that verifies, loaded;
        ``None`` if the folder holds none. ``folder`` may be a storage URI (``s3://...``): a
        driver with nothing on its local disk resumes with ``trainer.run(f, checkpoint=...)``.
        Newer checkpoints that do not verify are skipped with a warning naming each.

        :raises CheckpointIntegrityError: there are checkpoints and none verifies.
        """

        if not is_uri(str(folder)):
            state, _, _ = newest_loadable(Path(folder), trusted)
            return cls.from_dict(state) if state is not None else None
        tmp = tempfile.mkdtemp(prefix="sgd_checkpoints_")
        try:
            storage_for(str(folder)).download_dir(str(folder), tmp)
            state, _, _ = newest_loadable(Path(tmp), trusted)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return cls.from_dict(state) if state is not None else None

    # --- accessors ------------------------------------------------------------------

    @property
    def path(self) -> Optional[str]:
        """The directory (or URI) this checkpoint lives in; ``None`` for a dict checkpoint."""
        return self._path

    def to_dict(self) -> Dict[str, Any]:
        """The checkpoint's state. A directory that was not written from a dict gives
        ``{"_directory_files": {relative_path: bytes}}``.

        :raises CheckpointIntegrityError: a file does not verify, the metadata is altered,
            or the state does not decode (the message names the checkpoint and the file).
        :raises UntrustedCheckpointError: the state needs pickle and the checkpoint is not trusted.
        """
        if self._data is not None:
            return self._data
        with self.as_directory() as local:
            return _read_dict(Path(local), resolve_trusted(self.trusted), self._path or local)

    def to_encoded(self) -> Any:
        """As :meth:`to_dict`, verified the same way, but a dict checkpoint's state is left
        encoded (an :class:`~sgd.checkpoint.encoded.EncodedState`, decoded by whoever needs it):
        reading it does not import the framework its codec needs."""
        if self._data is not None:
            return self._data
        with self.as_directory() as local:
            return _read_dict(Path(local), resolve_trusted(self.trusted), self._path or local, decode=False)

    def to_directory(self, path: Optional[Union[str, os.PathLike]] = None) -> str:
        """Write the checkpoint to ``path`` (a new temporary directory if ``None``); returns it."""

        target = str(path) if path is not None else tempfile.mkdtemp(prefix="sgd_checkpoint_")
        if is_uri(target):
            with self.as_directory() as local:
                storage_for(target).upload_dir(local, target)
            return target
        if self._data is not None:
            write_dict_dir(self._data, Path(target), self._codec)
            if self._user_metadata:
                write_local(Path(target), self._user_metadata)
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

        if self._path is not None and not is_uri(self._path):
            yield self._path
            return
        tmp = tempfile.mkdtemp(prefix="sgd_checkpoint_")
        try:
            if self._path is not None:
                storage_for(self._path).download_dir(self._path, tmp)
            else:
                assert self._data is not None
                write_dict_dir(self._data, Path(tmp), self._codec)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def get_preprocessor(self, trusted: Optional[bool] = None) -> Any:
        """The preprocessor kept with this checkpoint (an AIR trainer's ``preprocessor=``, or
        ``TorchCheckpoint.from_model(model, preprocessor=...)``), or ``None``.

        Ray Data's own preprocessors load without running code named by the file; any other is
        pickled and loads only with ``trusted=True`` (or the checkpoint's own ``trusted``, or
        ``SGD_TRUST_CHECKPOINTS=1``): :class:`UntrustedCheckpointError` otherwise.
        """
        trust = self.trusted if trusted is None else trusted
        if self._data is not None:
            kept = self._data.get(PREPROCESSOR_KEY)
            if kept is None:
                return None
            if not isinstance(kept, (bytes, bytearray)):
                return kept  # put there by hand, as an object
            return decode_preprocessor(kept, trust, "in memory")
        with self.as_directory() as local:
            meta = integrity.read_metadata(Path(local), self._path or local)
            integrity.verify(Path(local), meta, self._path or local)
            path = Path(local) / PREPROCESSOR_FILE
            if not path.is_file():
                return None
            return decode_preprocessor(path.read_bytes(), trust, self._path or local)

    def __repr__(self) -> str:
        if self._path:  # Ray Train 2.60's form: Checkpoint(filesystem=local, path=/runs/x/checkpoint_000001)
            scheme, sep, rest = self._path.partition("://")
            return f"Checkpoint(filesystem={scheme if sep else 'local'}, path={rest if sep else self._path})"
        return f"Checkpoint(dict with {len(self._data or {})} keys)"


def write_dict_dir(data: Dict[str, Any], directory: Path, codec: str = DEFAULT_CODEC,
                   extra_meta: Optional[Dict[str, Any]] = None, hook: Optional[Any] = None,
                   fsync: bool = True) -> None:
    """Write ``data`` into ``directory`` with the registered ``codec`` (files are fsynced;
    the metadata records each file's sha256 and size).

    :param hook: the plugin manager whose codecs count (a trainer's own); see
        :func:`sgd.codecs.registered_codecs`.
    :param fsync: ``False`` for a folder read back and deleted at once (``num_to_keep=0``).

    :raises OSError: with ``errno.ENOSPC`` and "the disk is full" when space ran out,
        whichever library was writing.
    """
    c = get_codec(codec, hook=hook)
    state_file = directory / f"state.{c.suffix}"
    kept = data.get(PREPROCESSOR_KEY) if isinstance(data, dict) else None
    if isinstance(kept, (bytes, bytearray)):  # a preprocessor: its own file (see sgd.checkpoint.preprocessor)
        data = {k: v for k, v in data.items() if k != PREPROCESSOR_KEY}
        write_files({PREPROCESSOR_FILE: bytes(kept)}, directory, fsync=fsync)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(state_file, "wb") as f:
            needs_trust = c.save(data, f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    except Exception as exc:
        if integrity.is_disk_full(exc, directory if directory.exists() else None):
            raise integrity.disk_full_error(exc, state_file) from exc
        raise
    meta: Dict[str, Any] = {"format": "dict", "codec": c.name, "state_file": state_file.name,
                            "files": {state_file.name: integrity.file_digest(state_file)}}
    if isinstance(kept, (bytes, bytearray)):
        meta["files"][PREPROCESSOR_FILE] = integrity.file_digest(directory / PREPROCESSOR_FILE)
    if needs_trust:
        meta["needs_trust"] = needs_trust
    _write_metadata(directory, {**meta, **(extra_meta or {})}, fsync=fsync)


def _write_metadata(directory: Path, meta: Dict[str, Any], fsync: bool = True) -> None:
    # Written under another name and renamed: whoever sees the file sees all of it (the driver
    # commits an asynchronously written checkpoint once it appears).
    target = directory / METADATA_FILE
    partial = directory / f"{METADATA_FILE}.partial"
    try:
        with open(partial, "w") as f:
            json.dump(meta, f)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(partial, target)
    except OSError as exc:
        if integrity.is_disk_full(exc):
            raise integrity.disk_full_error(exc, target) from exc
        raise


def write_directory_metadata(directory: Path, extra_meta: Optional[Dict[str, Any]] = None,
                             digests: Optional[Dict[str, Dict[str, Any]]] = None) -> None:
    """Mark ``directory`` as a directory checkpoint (its files are the checkpoint, as they are)
    and record each file's sha256 and size (``digests``: those of files that lie elsewhere, the
    metadata written apart and sent after them: see :mod:`sgd.storage.staging`)."""
    files = integrity.digest_files(directory) if digests is None else digests
    _write_metadata(directory, {"format": "directory", "files": files, **(extra_meta or {})})


def write_sharded_metadata(directory: Path, files: Dict[str, Dict[str, Any]], metadata: Dict[str, Any],
                           writer: str) -> None:
    """Mark ``directory`` as a sharded checkpoint: every worker wrote its own shard into it
    (``writer`` names the format, e.g. ``"torch.distributed.checkpoint"``). ``files`` holds
    the digest of every file (each worker hashes its own), so the driver reads none of them;
    ``metadata`` (JSON values) is what the checkpoint loads as."""
    _write_metadata(directory, {"format": "sharded", "writer": writer, "metadata": metadata, "files": files})


def is_sharded(state: Optional[Dict[str, Any]]) -> bool:
    """Whether ``state`` is what a sharded checkpoint loads as (its directory and metadata)."""
    return isinstance(state, dict) and isinstance(state.get(SHARDED_KEY), str)


def write_files(files: Dict[str, bytes], directory: Path, overwrite: bool = True, fsync: bool = True) -> None:
    """Write ``{relative_path: bytes}`` under ``directory`` (fsynced unless ``fsync=False``)."""
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
            if fsync:
                os.fsync(f.fileno())


def _read_dict(directory: Path, trusted: bool, where: str, decode: bool = True) -> Any:
    """The state of the checkpoint in ``directory``, verified. ``decode=False``: a dict
    checkpoint's state as an :class:`~sgd.checkpoint.encoded.EncodedState` (what a restart
    sends its workers, which decode it), not decoded here."""
    meta = integrity.read_metadata(directory, where)
    integrity.verify(directory, meta, where)
    if meta.get("format") == "dict":
        c = get_codec(meta.get("codec"), where)
        state_file = integrity.confined(directory, meta.get("state_file"), where)
        preprocessor = None
        if PREPROCESSOR_FILE in (meta.get("files") or {}):
            preprocessor = integrity.confined(directory, PREPROCESSOR_FILE, where).read_bytes()
        if not decode:
            return EncodedState(str(meta.get("codec")), state_file.read_bytes(), trusted, where,
                                meta.get("needs_trust"), preprocessor, state_file.name)
        with open(state_file, "rb") as f:
            return decode_state(c, f, trusted, where, meta.get("needs_trust"), preprocessor, state_file.name)
    if meta.get("format") == "sharded":
        # Every shard stays where it is: the workers read their parts (sgd_torch.load_sharded_checkpoint).
        metadata = meta.get("metadata")
        if not isinstance(metadata, dict) or not isinstance(meta.get("files"), dict) or not meta["files"]:
            raise CheckpointIntegrityError(f"checkpoint {where}: its sharded metadata is malformed")
        return {**metadata, SHARDED_KEY: where if is_uri(where) else str(directory.resolve())}
    files = {}
    for name in integrity.checkpoint_files(directory):
        files[name] = integrity.confined(directory, name, where).read_bytes()
    return {"_directory_files": files}


def _filed_under(path: Path) -> int:
    """The report a checkpoint is filed under, from its metadata (0 when unreadable)."""
    try:
        return int(json.loads((path / METADATA_FILE).read_text()).get("iteration") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def newest_loadable(checkpoint_dir: Path, trusted: Optional[bool] = None, max_iteration: Optional[int] = None
                    ) -> Tuple[Optional[Dict[str, Any]], int, Optional[Path]]:
    """The state, iteration and path of the newest checkpoint that verifies and decodes.

    Each newer one that does not is skipped with a warning naming it. With ``max_iteration``
    (the last report delivered), one filed under a later report (saved before a report that
    was never delivered) is passed over for an earlier one, when there is one.

    :raises CheckpointIntegrityError: there are checkpoints and none of them verifies.
    :raises UntrustedCheckpointError: the newest good one needs pickle and the caller did not opt in.
    """
    found = integrity.checkpoint_dirs(checkpoint_dir)
    if max_iteration is not None:
        earlier = [(i, p) for i, p in found if _filed_under(p) <= max_iteration]
        if earlier and len(earlier) < len(found):
            logger.info("resuming from %s: the newer checkpoints go with reports that were not delivered",
                        earlier[-1][1])
            found = earlier
    problems = []
    for _, path in reversed(found):
        try:
            state = Checkpoint.from_directory(path, trusted=trusted).to_dict()
            meta = integrity.read_metadata(path, str(path))
        except CheckpointIntegrityError as exc:
            logger.warning("skipping checkpoint %s, which does not verify: %s", path, exc)
            problems.append(str(exc))
            continue
        try:
            iteration = int(meta.get("iteration", 0))
        except (TypeError, ValueError):
            iteration = 0
        return state, iteration, path
    if found:
        raise CheckpointIntegrityError(
            f"none of the {len(found)} checkpoints in {checkpoint_dir} verifies, so there is nothing to resume "
            f"from: {'; '.join(problems)}. Restore from a copy, or start a new run (pass checkpoint=None).")
    return None, 0, None
