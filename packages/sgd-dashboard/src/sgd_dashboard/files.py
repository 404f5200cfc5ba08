"""Every file the dashboard reads goes through here: resolved inside the results folder (a symlink
that leads out of it is refused, as are ``..`` and absolute names), and read in capped amounts.

The browser never names a file: runs, logs and checkpoints are addressed by the ids of the
server's own index (:mod:`sgd_dashboard.index`), which maps them to paths found by walking the
folder. This module is the second fence: a path the index found is still checked here, so a
symlink planted inside a run folder cannot make the server read ``/etc/passwd``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, List, Optional, Tuple, Union

from sgd.errors import PicklableError

#: The most bytes one JSON settings/status file may have to be read (a larger one is shown as damaged).
MAX_JSON_BYTES = 4 << 20


class OutsideRoot(PicklableError, PermissionError):
    """A path resolves outside the results folder (``..``, an absolute name, a symlink out)."""


class Root:
    """The results folder the dashboard serves (or a single run folder), resolved once.

    :param path: the folder given on the command line.
    :raises FileNotFoundError: it is not a directory.
    """

    def __init__(self, path: Union[str, os.PathLike]):
        given = Path(path).expanduser()
        if not given.is_dir():
            raise FileNotFoundError(
                f"{given} is not a directory: pass a results folder (default: $SGD_RESULTS_DIR or ~/sgd_results) "
                "or one run's folder")
        self.path = Path(os.path.realpath(given))
        self._prefix = str(self.path).rstrip(os.sep) + os.sep

    def inside(self, path: Union[str, os.PathLike]) -> bool:
        """Whether ``path``, with every symlink resolved, is the root or below it."""
        real = os.path.realpath(path)
        return real == str(self.path) or real.startswith(self._prefix)

    def check(self, path: Union[str, os.PathLike]) -> Path:
        """``path`` if it is inside the root (:meth:`inside`).

        :raises OutsideRoot: it resolves elsewhere.
        """
        if not self.inside(path):
            raise OutsideRoot(f"{path} lies outside the results folder {self.path}")
        return Path(path)

    def child(self, folder: Path, name: str) -> Path:
        """The file ``name`` (a plain file name, no separator) of ``folder``, checked inside the root.

        :raises OutsideRoot: ``name`` is not a plain name, or the file resolves elsewhere.
        """
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
            raise OutsideRoot(f"{name!r} is not a plain file name")
        return self.check(folder / name)

    def member(self, folder: Path, name: str) -> Path:
        """The file ``name`` of ``folder``, a folder already found inside the root: only a symlink
        (one ``lstat``) needs resolving, which :meth:`check` does.

        :raises OutsideRoot: it is a symlink that leads out of the root.
        """
        path = folder / name
        if os.path.islink(path):
            self.check(path)
        return path

    def relative(self, path: Path) -> str:
        """``path`` relative to the root, ``"."`` for the root itself (the run's display name)."""
        try:
            rel = path.relative_to(self.path)
        except ValueError:
            rel = Path(os.path.relpath(os.path.realpath(path), self.path))
        return rel.as_posix() if rel.parts else "."


def stat_key(path: Path) -> Optional[Tuple[int, int]]:
    """``(size, mtime_ns)`` of a file, ``None`` if it cannot be read: what a cache compares."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def read_bytes(root: Root, path: Path, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
    """At most ``max_bytes`` of ``path`` from ``offset`` (``b""`` when it is missing).

    :raises OutsideRoot: ``path`` resolves outside the root.
    """
    root.check(path)
    try:
        with open(path, "rb") as f:
            if offset:
                f.seek(offset)
            return f.read(max_bytes)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return b""


def read_json(root: Root, path: Path, checked: bool = False) -> Tuple[Optional[Any], Optional[str]]:
    """``(value, problem)``: the JSON value of a small file, or ``None`` and why it could not be read
    (``None`` and ``None`` when the file does not exist).

    :param checked: ``path`` is already known to be inside the root (:meth:`Root.member`).
    """
    try:
        if not checked:
            root.check(path)
    except OutsideRoot as exc:
        return None, str(exc)
    try:
        size = path.stat().st_size
    except OSError:
        return None, None
    if size > MAX_JSON_BYTES:
        return None, f"{path.name} has {size} bytes, more than the {MAX_JSON_BYTES} the dashboard reads"
    try:
        return json.loads(path.read_bytes()), None
    except (OSError, ValueError) as exc:
        return None, f"{path.name} is damaged ({type(exc).__name__}: {exc})"


def tail_lines(root: Root, path: Path, count: int, window: int = 1 << 16, max_bytes: int = 64 << 20) -> List[bytes]:
    """The last ``count`` complete lines of ``path`` (a last line without its newline, still being
    written, left out), read from the end; at most ``max_bytes`` are looked at."""
    root.check(path)
    try:
        f = open(path, "rb")
    except OSError:
        return []
    with f:
        size = f.seek(0, os.SEEK_END)
        while True:
            start = max(0, size - window)
            f.seek(start)
            data = f.read(size - start)
            end = data.rfind(b"\n")
            lines = data[:end].split(b"\n") if end >= 0 else []
            if start > 0:
                lines = lines[1:]  # may begin mid-line
            lines = [ln for ln in lines if ln.strip()]
            if len(lines) >= count or start == 0 or window >= max_bytes:
                return lines[-count:] if count else []
            window *= 4


def folder_bytes(root: Root, folder: Path, max_files: int = 10_000) -> int:
    """The summed size of the files below ``folder`` (symlinks not followed), up to ``max_files``."""
    total, seen = 0, 0
    stack = [folder]
    while stack and seen < max_files:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            seen += 1
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                elif e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total
