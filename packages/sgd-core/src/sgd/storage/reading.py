"""Reading run directories back: the one reader of what :class:`sgd.Trainer` writes into a run
folder (``logdir/run_NNN``; an AIR trainer's ``storage_path/name``) (the writer is
:mod:`sgd.storage.run_dir`; the public name of this module is :mod:`sgd.runs`). ``sgd runs ls`` /
``sgd runs show``, :meth:`sgd.Result.from_path` and :meth:`sgd.Trainer.restore` all read through here.

Everything here only reads: a run that is still going is not disturbed. A run whose driver
was killed shows ``DRIVER_DIED`` when the driver ran on this host (its pid is gone), else
``RUNNING`` (its ``status.json`` was never closed); ``Trainer.restore`` resumes it.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union

from sgd._common.public import public_module
from sgd.checkpoint import METADATA_FILE
from sgd.checkpoint.integrity import check, checkpoint_dirs
from sgd.storage.errors import RunFormatError, RunNotFoundError
from sgd.utils import results_root

__all__ = [
    "RUN_FORMAT_VERSION",
    "RunInfo",
    "check_format",
    "checkpoints",
    "find_run",
    "find_runs",
    "is_run_dir",
    "last_iteration",
    "last_results",
    "read_settings",
    "result_rows",
    "run_info",
    "run_status",
    "run_summary",
    "resolve_run_dir",
]

#: One JSON line per delivered report round (a list of per-worker dicts).
RESULTS_FILE = "results.jsonl"
#: The trainer's settings (what ``Trainer.restore`` rebuilds the trainer from).
SETTINGS_FILE = "trainer.json"
#: ``{"status": ..., "time": ..., "pid": ..., "host": ..., "attempt": ...}`` of the run's driver.
STATUS_FILE = "status.json"
#: The version of the run folder's format, kept in ``trainer.json`` as ``format_version`` (a run
#: without one was written before 2026-11-29, in format 1). A reader refuses a newer one.
RUN_FORMAT_VERSION = 1
#: What a run folder holds, for the messages of the errors that say a folder is not one.
RUN_FOLDER_FILES = f"{SETTINGS_FILE}, {STATUS_FILE}, {RESULTS_FILE}, checkpoints/"

_RUN = re.compile(r"^run_(\d+)$")
#: How deep ``find_runs`` looks below the folder it is given (results root / logdir / run_NNN).
MAX_DEPTH = 3


@public_module("sgd.runs")
@dataclass
class RunInfo:
    """One line of ``sgd runs ls``."""

    path: str
    status: str
    iterations: int
    #: when the run started (``trainer.json`` written), seconds since the epoch.
    started: Optional[float]
    #: the latest complete checkpoint's folder name, ``None`` if there is none.
    latest_checkpoint: Optional[str]


#: ``sgd stacks`` writes this file into a running job's run directory; its driver answers by
#: writing every worker's stacks to :data:`STACKS_FILE` there (within about a second).
STACKS_REQUEST = "stacks.request"
STACKS_FILE = "stacks.txt"

def is_run_dir(path: Union[str, os.PathLike]) -> bool:
    """Whether ``path`` holds an sgd run (``trainer.json`` or ``status.json``)."""
    p = Path(path)
    return (p / SETTINGS_FILE).is_file() or (p / STATUS_FILE).is_file()


def _natural_key(path: Path) -> List[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_runs(root: Union[str, os.PathLike]) -> List[Path]:
    """Every run directory at or below ``root`` (a results root, a logdir or a run), in path order.

    :raises FileNotFoundError: ``root`` is not a directory.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")

    def walk(path: Path, depth: int) -> Iterator[Path]:
        if is_run_dir(path):
            yield path
            return  # a run's own folders (checkpoints/...) hold no runs
        if depth >= MAX_DEPTH:
            return
        try:
            children = [Path(e.path) for e in os.scandir(path) if e.is_dir() and not e.name.startswith(".")]
        except OSError:
            return
        for child in children:
            yield from walk(child, depth + 1)

    return sorted(walk(root, 0), key=_natural_key)


def find_run(path: Union[str, os.PathLike]) -> Path:
    """The run ``path`` names, in either layout: a run folder itself (an AIR trainer's
    ``storage_path/name``, or a ``run_NNN``), or a folder of numbered runs (a ``Trainer``'s
    logdir, an AIR experiment written before 2026-11-29): its latest ``run_NNN``.

    :raises RunNotFoundError: no run there (the message says what a run folder holds).
    :raises RunFormatError: the run was written by a newer sgd (:func:`check_format`).
    """
    given = Path(path).expanduser()
    if is_run_dir(given):
        return check_format(given.resolve())
    if given.is_dir():
        runs = sorted((p for p in given.iterdir() if _RUN.match(p.name) and is_run_dir(p)),
                      key=lambda p: int(_RUN.match(p.name).group(1)))  # type: ignore[union-attr]
        if runs:
            return check_format(runs[-1].resolve())
        what = "a folder that holds no sgd run"
    else:
        what = "a file, not a folder" if given.exists() else "no such folder"
    raise RunNotFoundError(
        f"{given} is not an sgd run directory ({what}): a run folder holds {RUN_FOLDER_FILES} (an AIR trainer's "
        "storage_path/name, or a Trainer's logdir/run_NNN); pass result.path, or the folder of numbered runs.")


def check_format(run: Path) -> Path:
    """``run``, if this sgd reads its format (``format_version`` in ``trainer.json``).

    :raises RunFormatError: it was written by a newer sgd.
    """
    read = _read_json(run / SETTINGS_FILE)
    settings: Dict[str, Any] = read if isinstance(read, dict) else {}
    version = settings.get("format_version", 1)
    if isinstance(version, int) and version > RUN_FORMAT_VERSION:
        raise RunFormatError(
            f"{run} was written by a newer sgd ({settings.get('sgd_version', 'unknown version')}, run format "
            f"{version}); this sgd ({sgd_version()}) reads run formats up to {RUN_FORMAT_VERSION}. Upgrade sgd "
            "(pip install -U sgd-core) to read or resume it.")
    return run


@functools.lru_cache(maxsize=1)
def sgd_version() -> str:
    """The installed sgd-core's version (what a run folder records it was written by); looked up
    once per process (a scan of the installed distributions, which every run start asked again)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("sgd-core")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def resolve_run_dir(path: Union[str, os.PathLike]) -> Path:
    """The run directory ``path`` names (:func:`find_run`), else the one it names under the
    results root.

    :raises RunNotFoundError: no run directory there.
    """
    given = Path(path).expanduser()
    try:
        return find_run(given)
    except RunNotFoundError:
        if given.is_absolute():
            raise
    return find_run(results_root() / given)


# --- reading the files ---------------------------------------------------------------


def _read_json(path: Path) -> Optional[Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _status(run: Path) -> Dict[str, Any]:
    data = _read_json(run / STATUS_FILE)
    if not isinstance(data, dict):
        return {"status": "UNKNOWN", "time": None}
    status = str(data.get("status", "UNKNOWN"))
    if status == "RUNNING" and _driver_gone(data):
        status = "DRIVER_DIED"
    return {"status": status, "time": data.get("time")}


def run_status(run: Union[str, os.PathLike]) -> str:
    """The run's status: ``RUNNING``, ``FINISHED``, ``ERRORED``, ``INTERRUPTED``, ``DRIVER_DIED``
    (a ``RUNNING`` run whose driver on this host is gone) or ``UNKNOWN`` (no readable status)."""
    return str(_status(Path(run))["status"])


def _driver_gone(data: Dict[str, Any]) -> bool:
    """A RUNNING run whose driver ran on this host under a pid that no longer exists."""
    import os
    import socket

    pid = data.get("pid")
    if not isinstance(pid, int) or data.get("host") != socket.gethostname():
        return False  # another machine's driver (or an old run): cannot tell
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _started(run: Path) -> Optional[float]:
    for name in (SETTINGS_FILE, STATUS_FILE):
        try:
            return (run / name).stat().st_mtime
        except OSError:
            continue
    return None


def last_results(run: Union[str, os.PathLike]) -> Optional[List[Dict[str, Any]]]:
    """The last complete line of ``results.jsonl`` (one dict per worker), read from the end."""
    path = Path(run) / RESULTS_FILE
    try:
        f = open(path, "rb")
    except OSError:
        return None
    with f:
        size = f.seek(0, os.SEEK_END)
        window = 1 << 16
        while True:
            start = max(0, size - window)
            f.seek(start)
            lines = f.read(size - start).split(b"\n")
            if start > 0:
                lines = lines[1:]  # may begin mid-line
            for line in reversed(lines):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except ValueError:
                    continue  # cut short by a crash
                if isinstance(value, list) and value and isinstance(value[0], dict):
                    return value
            if start == 0:
                return None
            window *= 4


def result_rows(run: Union[str, os.PathLike]) -> List[List[Dict[str, Any]]]:
    """Every complete line of ``results.jsonl`` in order (a line cut short by a crash ends it)."""
    rows: List[List[Dict[str, Any]]] = []
    try:
        f = open(Path(run) / RESULTS_FILE, encoding="utf-8")
    except OSError:
        return rows
    with f:
        for line in f:
            try:
                value = json.loads(line)
            except ValueError:
                break
            if not (isinstance(value, list) and value and isinstance(value[0], dict)):
                break
            rows.append(value)
    return rows


def last_iteration(run: Union[str, os.PathLike]) -> int:
    """``_training_iteration`` of the last complete round in ``results.jsonl`` (0 if none)."""
    return _iteration(last_results(run))


def read_settings(run: Union[str, os.PathLike]) -> Dict[str, Any]:
    """The trainer settings in ``trainer.json``.

    :raises FileNotFoundError: ``run`` is not a run directory.
    """
    path = Path(run) / SETTINGS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{Path(run)} is not an sgd run directory (no {SETTINGS_FILE})")
    return json.loads(path.read_text())


def _iteration(results: Optional[List[Dict[str, Any]]]) -> int:
    if not results:
        return 0
    try:
        return int(results[0].get("_training_iteration", 0))
    except (TypeError, ValueError):
        return 0


def checkpoints(run: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    """The run's complete checkpoints, oldest first: name, path, id, iteration, score, time, metrics."""
    found = []
    for _, p in checkpoint_dirs(Path(run) / "checkpoints"):
        meta = _read_json(p / METADATA_FILE)
        if not isinstance(meta, dict):
            continue  # not finished (a checkpoint is complete once its metadata is in)
        found.append({
            "name": p.name,
            "path": str(p),
            "id": meta.get("id"),
            "iteration": meta.get("iteration"),
            "score": meta.get("score"),
            "time": meta.get("timestamp"),
            "metrics": meta.get("metrics"),  # the report it came with (sgd.report(checkpoint=))
        })
    return sorted(found, key=lambda c: (c["id"] if isinstance(c["id"], int) else -1, c["name"]))


def _unverified(found: List[Dict[str, Any]]) -> List[Dict[str, str]]:

    bad = []
    for c in found:
        problem = check(Path(c["path"]))
        if problem is not None:
            bad.append({"name": c["name"], "problem": problem})
    return bad


def _best(found: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """As the checkpoint manager ranks them: highest score (NaN/None worst), then newest."""
    if not found:
        return None

    def key(c: Dict[str, Any]) -> Any:
        score = c["score"]
        ok = isinstance(score, (int, float)) and not math.isnan(score)
        return (score if ok else -math.inf, c["id"] if isinstance(c["id"], int) else -1)

    return max(found, key=key)


# --- summaries -----------------------------------------------------------------------------


def run_info(run: Union[str, os.PathLike]) -> RunInfo:
    """The one-line summary of a run directory (cheap: reads the end of ``results.jsonl`` only)."""
    path = Path(run)
    found = checkpoints(path)
    return RunInfo(
        path=str(path),
        status=_status(path)["status"],
        iterations=_iteration(last_results(path)),
        started=_started(path),
        latest_checkpoint=found[-1]["name"] if found else None,
    )


def run_summary(run: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Everything ``sgd runs show`` prints about a run directory, as a JSON-able dict."""
    path = Path(run)
    settings = _read_json(path / SETTINGS_FILE)
    settings = settings if isinstance(settings, dict) else {}
    status = _status(path)
    found = checkpoints(path)
    best = _best(found)
    last = last_results(path)
    workers = settings.get("num_workers")
    return {
        "path": str(path),
        "status": status["status"],
        "status_time": status["time"],
        "started": _started(path),
        "backend": settings.get("backend"),
        "backend_config": settings.get("backend_config", {}),
        "num_workers": workers,
        "use_gpu": settings.get("use_gpu"),
        "resources_per_worker": settings.get("resources_per_worker"),
        "max_retries": settings.get("max_retries"),
        "iterations": _iteration(last),
        "checkpoints": len(found),
        # Checkpoints whose files do not match what was written (or whose metadata was altered):
        # restore skips them.
        "unverified_checkpoints": _unverified(found),
        "latest_checkpoint": found[-1] if found else None,
        "best_checkpoint": best,
        "final_metrics": last[0] if last else None,
        "final_metrics_per_worker": last,
    }
