"""Helpers shared by the loggers: secret redaction, flattening, value conversion.

Nothing here imports a heavy library; each logger imports its own on use.
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from sgd.redact import SECRET_KEY, is_secret_key, redact  # noqa: F401  (the one rule, re-exported here)

#: How non-finite floats are written where the format has no spelling for them (JSON).
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def flatten(value: Mapping[str, Any], sep: str = "/", prefix: str = "") -> Dict[str, Any]:
    """Flatten nested dicts into one level, joining keys with ``sep`` (``{"a": {"b": 1}}`` -> ``{"a/b": 1}``).

    Lists are kept as values (the loggers turn numeric lists into histograms).
    """
    out: Dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(item, Mapping) and item:
            out.update(flatten(item, sep, name))
        else:
            out[name] = item
    return out


def clean(value: Mapping[str, Any]) -> Dict[str, Any]:
    """Redact secrets, then flatten with ``/``: what every tabular or scalar logger sees."""
    return flatten(redact(value))


def _unwrap(value: Any) -> Any:
    """numpy scalars and 0-d arrays/tensors -> Python numbers; other values unchanged."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        try:
            return value.item()
        except Exception:  # an exotic object with .item(): leave it to the caller
            return value
    return value


def scalar(value: Any) -> Optional[float]:
    """``value`` as a float if it is a real number (bools count as 0/1), else ``None``.

    NaN and infinities are returned as they are; callers decide what to do with them.
    """
    value = _unwrap(value)
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):
            return None
    return None


def histogram_values(value: Any) -> Optional[List[float]]:
    """The finite numbers of a non-empty numeric list/tuple/array, else ``None``.

    Non-finite elements are dropped (histogram binning cannot place them).
    """
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) >= 1:
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        return None
    flat: List[float] = []

    def walk(items: Any) -> bool:
        for item in items:
            if isinstance(item, (list, tuple)):
                if not walk(item):
                    return False
                continue
            number = scalar(item)
            if number is None:
                return False
            if math.isfinite(number):
                flat.append(number)
        return True

    if not walk(value):
        return None
    return flat or None


def to_jsonable(value: Any) -> Any:
    """``value`` converted to what ``json.dumps(allow_nan=False)`` accepts, secrets removed.

    NaN and infinities become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
    numpy/torch values become numbers or lists; other unknown objects become ``str(obj)``.
    """
    value = _unwrap(value)
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return NON_FINITE["nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")]
    if isinstance(value, numbers.Real):
        return to_jsonable(float(value))
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items() if not is_secret_key(k)}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return to_jsonable(value.tolist())
    return str(value)


def resolve_dir(logdir: Optional[Union[str, os.PathLike]], run_dir: Union[str, os.PathLike]) -> Path:
    """The directory a logger writes to: the run directory when ``logdir`` is ``None``.

    ``~`` is expanded; a relative ``logdir`` is taken relative to the run directory.
    """
    if logdir is None:
        return Path(run_dir)
    path = Path(logdir).expanduser()
    return path if path.is_absolute() else Path(run_dir) / path


def check_worker(worker: Any, name: str = "worker_to_log") -> int:
    """Validate a single worker index."""
    if not isinstance(worker, int) or isinstance(worker, bool) or worker < 0:
        raise ValueError(f"{name} must be an int >= 0 (a world rank), got {worker!r}")
    return worker


def check_workers(workers: Any, name: str = "workers_to_log") -> Optional[List[int]]:
    """Normalise ``workers_to_log``: an int, a list of ints, or ``None`` (all) -> list or ``None``."""
    if workers is None:
        return None
    if isinstance(workers, int) and not isinstance(workers, bool):
        return [check_worker(workers, name)]
    if isinstance(workers, (list, tuple)) and workers:
        ranks = [check_worker(w, name) for w in workers]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"{name} lists a worker twice: {list(workers)!r}")
        return ranks
    raise ValueError(f"{name} must be an int, a non-empty list of ints, or None (all workers), got {workers!r}")


def select(results: Sequence[Dict[str, Any]], ranks: Optional[Iterable[int]], name: str) -> List[Dict[str, Any]]:
    """The dicts of ``ranks`` (all when ``None``) from one round, with a clear error for a missing rank."""
    if ranks is None:
        return list(results)
    ranks = list(ranks)
    missing = [r for r in ranks if r >= len(results)]
    if missing:
        raise ValueError(
            f"{name}={ranks if len(ranks) > 1 else ranks[0]!r} but this round has results from "
            f"{len(results)} worker(s) (ranks 0-{len(results) - 1}); pick ranks below {len(results)}."
        )
    return [results[r] for r in ranks]


def step_of(result: Mapping[str, Any], fallback: int) -> int:
    """The step a round is logged at: its ``_training_iteration``, else ``fallback``."""
    step = scalar(result.get("_training_iteration"))
    if step is None or not math.isfinite(step):
        return fallback
    return int(step)


def require(module: str, who: str, extra: str) -> Any:
    """Import ``module`` or raise ``ImportError`` naming the ``sgd-loggers`` extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{who} needs the '{module}' package, which is not installed: "
            f"pip install 'sgd-loggers[{extra}]'"
        ) from exc
