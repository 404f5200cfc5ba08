"""Shipping ``sgd run``'s script to hosts that do not have it (as ``ray job submit --working-dir`` does).

On a real cluster the driver's files are on the driver's disk only. The launcher packs the
script's directory (for ``-m``, the working directory) into a zip, at most
:data:`SHIP_LIMIT_BYTES`, leaving out version-control folders, caches and virtualenvs. A worker
that finds the script at its path uses it there (one machine, a shared file system); one that does
not unpacks the bundle once per host, under a folder named by its content hash, and runs the copy.

The bundle comes from this run's own driver, but it is unpacked like any archive from elsewhere:
a member whose name is absolute or climbs out of the folder is refused.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional

logger = logging.getLogger("sgd")

#: Largest bundle (bytes) the launcher ships; a larger directory ships the script file alone.
SHIP_LIMIT_BYTES = int(float(os.environ.get("SGD_RUN_SHIP_LIMIT_MB", "100")) * (1 << 20))
#: Folders never shipped.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".nox", ".tox", ".venv", "venv", "node_modules",
                       ".mypy_cache", ".pytest_cache", ".ruff_cache", "sgd_results"})


@dataclass(frozen=True)
class Bundle:
    """A directory packed for the workers: ``root`` is its path on the driver."""

    root: str
    data: bytes
    digest: str

    def __repr__(self) -> str:  # not the bytes
        return f"Bundle({self.root!r}, {len(self.data)} bytes, {self.digest[:12]})"


def pack(root: str, must_include: Optional[str] = None, limit: int = SHIP_LIMIT_BYTES) -> Optional[Bundle]:
    """Zip ``root`` (its files, recursively, minus :data:`SKIP_DIRS`); when it exceeds
    ``limit``, only ``must_include`` (a file under ``root``), with a warning. ``None`` when even
    that does not fit or there is nothing to ship."""
    base = Path(root)
    files = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            size = path.stat().st_size
            total += size
            files.append(path)
            if total > limit:
                break
        if total > limit:
            break
    if total > limit:
        logger.warning("sgd run: %s holds more than %d MB; shipping only the script to hosts that lack it "
                       "(SGD_RUN_SHIP_LIMIT_MB raises the limit)", root, limit >> 20)
        files = [Path(must_include)] if must_include else []
        if files and files[0].stat().st_size > limit:
            return None
    if not files:
        return None
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            info = zipfile.ZipInfo(path.relative_to(base).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (path.stat().st_mode & 0o777) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    data = buffer.getvalue()
    return Bundle(str(base), data, hashlib.sha256(data).hexdigest())


def unpack(bundle: Bundle, into: Optional[str] = None) -> str:
    """The bundle's files on this host: unpacked once under ``into`` (default: a folder of the
    system's temporary directory named by the content hash); returns that folder.

    :raises ValueError: a member's name is absolute or leaves the folder.
    """
    parent = Path(into or os.path.join(tempfile.gettempdir(), "sgd_run"))
    target = parent / bundle.digest[:24]
    if target.is_dir():
        return str(target)
    parent.mkdir(parents=True, exist_ok=True)
    import shutil

    staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=parent))
    try:
        with zipfile.ZipFile(io.BytesIO(bundle.data)) as archive:
            for info in archive.infolist():
                name = PurePosixPath(info.filename)
                if name.is_absolute() or ".." in name.parts or not name.parts:
                    raise ValueError(f"refusing to unpack {info.filename!r}: it is not a path inside the bundle")
                dest = staging.joinpath(*name.parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(archive.read(info))
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    os.chmod(dest, mode)
        os.rename(staging, target)  # atomic: a concurrent worker of the same host wins or loses whole
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not target.is_dir():  # another worker of this host unpacked it first: use theirs
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return str(target)
