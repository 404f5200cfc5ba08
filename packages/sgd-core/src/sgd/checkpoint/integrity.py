"""Checkpoint integrity: per-file sha256 and size recorded at write, verified at load;
metadata confined to its directory; "the disk is full" said plainly; restore from the
newest checkpoint that verifies.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Iterable, List, Optional, Tuple

from sgd.checkpoint.codecs import get_codec
from sgd.checkpoint.user_metadata import USER_METADATA_FILE
from sgd.errors import CheckpointError, CheckpointIntegrityError

logger = logging.getLogger("sgd")

METADATA_FILE = ".sgd_checkpoint.json"
_CHUNK = 1 << 20
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# What libraries that write through their own C++ writers say instead of raising ENOSPC
# (torch.save: "[enforce fail at inline_container.cc] . unexpected pos N vs M").
_DISK_FULL_WORDS = ("no space left", "unexpected pos", "disk quota exceeded", "file too large")


def _integrity_error(message: str) -> Exception:

    return CheckpointIntegrityError(message)


# --- digests ---------------------------------------------------------------------------


def file_digest(path: Path) -> Dict[str, Any]:
    """``{"sha256": hex, "size": bytes}`` of one file."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"sha256": h.hexdigest(), "size": size}


def checkpoint_files(directory: Path) -> List[str]:
    """The checkpoint's files (POSIX relative paths), sgd's metadata file left out."""
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                  if (p.is_file() or p.is_symlink()) and p.name != METADATA_FILE)


def digest_files(directory: Path, names: Optional[Iterable[str]] = None) -> Dict[str, Dict[str, Any]]:
    """Digests of ``names`` (default: every file) under ``directory``."""
    return {n: file_digest(directory / n) for n in (checkpoint_files(directory) if names is None else names)}


def complete_digests(directory: Path, meta: Dict[str, Any]) -> None:
    """Add digests for files ``meta["files"]`` does not list yet (other ranks' shards merged in)."""
    files = meta.setdefault("files", {})
    missing = [n for n in checkpoint_files(directory) if n not in files]
    files.update(digest_files(directory, missing))


# --- confinement and verification ------------------------------------------------------


def confined(directory: Path, name: Any, where: str) -> Path:
    """``directory / name`` if ``name`` is a relative path that stays inside ``directory``."""
    if not isinstance(name, str) or not name:
        raise _integrity_error(f"checkpoint {where}: the metadata names file {name!r}, which is not a file name")
    pure = PurePosixPath(name)
    if pure.is_absolute() or os.path.isabs(name) or ".." in pure.parts or "\\" in name:
        raise _integrity_error(
            f"checkpoint {where}: the metadata names file {name!r}, outside the checkpoint directory; "
            "only relative paths inside it are allowed. The metadata was altered or not written by sgd."
        )
    path = directory / pure
    root = directory.resolve()
    if not path.resolve().is_relative_to(root):  # a symlink pointing out
        raise _integrity_error(f"checkpoint {where}: file {name!r} leads outside the checkpoint directory")
    return path


def read_metadata(directory: Path, where: str) -> Dict[str, Any]:
    """The checkpoint's metadata; ``{}`` if it has none (a plain directory)."""
    meta_file = directory / METADATA_FILE
    if not meta_file.exists():
        return {}
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as exc:
        raise _integrity_error(f"checkpoint {where}: cannot read {METADATA_FILE} ({exc})") from exc
    if not isinstance(meta, dict):
        raise _integrity_error(f"checkpoint {where}: {METADATA_FILE} does not hold a JSON object")
    return meta


def verify(directory: Path, meta: Dict[str, Any], where: str) -> None:
    """Check every file against the size and sha256 in ``meta`` (raises naming the file).

    Checkpoints written before sgd recorded digests (no ``files`` entry) pass unchecked. The
    user's metadata file (``.metadata.json``, :mod:`sgd.checkpoint.user_metadata`) is not held to
    its digest: ``set_metadata`` may change it after the write.
    """
    files = meta.get("files")
    if files is None:
        return
    if not isinstance(files, dict):
        raise _integrity_error(f"checkpoint {where}: the metadata's file list is malformed")
    for name, want in files.items():
        if name == USER_METADATA_FILE:  # the user's metadata may change after the write (set_metadata)
            continue
        path = confined(directory, name, where)
        if not isinstance(want, dict):
            raise _integrity_error(f"checkpoint {where}: the metadata's entry for {name!r} is malformed")
        if not path.is_file():
            raise _integrity_error(f"checkpoint {where}: file {name!r} is missing")
        size = path.stat().st_size
        if size != want.get("size"):
            raise _integrity_error(
                f"checkpoint {where}: file {name!r} has {size} bytes, {want.get('size')} were written "
                "(cut short or changed)")
        if file_digest(path)["sha256"] != want.get("sha256"):
            raise _integrity_error(f"checkpoint {where}: file {name!r} does not match its sha256 (changed or damaged)")
    if meta.get("format") == "directory":
        extra = [n for n in checkpoint_files(directory) if n not in files and n != USER_METADATA_FILE]
        if extra:
            raise _integrity_error(f"checkpoint {where}: file {extra[0]!r} is not among the files it was written with")


def check(directory: Path) -> Optional[str]:
    """``None`` if the checkpoint verifies, else why not (for listings: ``sgd runs show``)."""

    try:
        meta = read_metadata(directory, str(directory))
        verify(directory, meta, str(directory))
        if meta.get("format") == "dict":
            confined(directory, meta.get("state_file"), str(directory))

            get_codec(meta.get("codec"), str(directory))
    except CheckpointError as exc:
        return str(exc)
    return None


# --- disk full -------------------------------------------------------------------------------


def is_disk_full(exc: BaseException, directory: Optional[Path] = None) -> bool:
    """Whether ``exc`` (from any writer: ``open().write``, ``torch.save``, numpy...) means no space left."""
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
            return True
        text = str(e).lower()
        if any(w in text for w in _DISK_FULL_WORDS):
            return True
        e = e.__cause__ or e.__context__
    if directory is not None:
        try:
            return shutil.disk_usage(directory).free == 0
        except OSError:
            return False
    return False


def disk_full_error(exc: BaseException, path: Path) -> OSError:
    return OSError(errno.ENOSPC, f"could not write checkpoint file {path}: the disk is full "
                                 f"({type(exc).__name__}: {exc})")


# --- restore -------------------------------------------------------------------------------


def checkpoint_dirs(checkpoint_dir: Path) -> List[Tuple[int, Path]]:
    """``(number, path)`` of every finished checkpoint folder, oldest first: the numbered
    ``checkpoint_NNNNNN`` ones, and those committed under a name of the user's
    (``sgd.report(checkpoint_dir_name=...)``), whose number is in their metadata."""
    found = []
    for p in checkpoint_dir.glob("*"):
        name = p.name
        if name.startswith("."):
            continue  # a temporary folder, the index of reported checkpoints
        suffix = name[len("checkpoint_"):] if name.startswith("checkpoint_") else ""
        if suffix.isdigit():
            if (p / METADATA_FILE).exists():
                found.append((int(suffix), p))
            continue
        number = _named_number(p)
        if number is not None:
            found.append((number, p))
    return sorted(found)


def _named_number(folder: Path) -> Optional[int]:
    """The number sgd gave a checkpoint committed under a name of the user's (``None``: not one)."""
    try:
        meta = json.loads((folder / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return None
    number = meta.get("id") if isinstance(meta, dict) else None
    return number if isinstance(number, int) and not isinstance(number, bool) and number > 0 else None
