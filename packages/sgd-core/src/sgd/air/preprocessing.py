"""The preprocessor of an AIR-style trainer (a Ray Data ``Preprocessor``): recognised without
importing Ray Data, fitted on one dataset with an error that names the dataset and its columns."""

from __future__ import annotations

from typing import Any


def is_preprocessor(value: Any) -> bool:
    return any(f"{c.__module__}.{c.__name__}" == "ray.data.preprocessor.Preprocessor" for c in type(value).__mro__)


def needs_fit(p: Any) -> bool:
    try:
        status = p.fit_status()
    except AttributeError:
        return True
    return getattr(status, "name", str(status)) not in ("FITTED", "NOT_FITTABLE")


def fit_preprocessor(p: Any, name: str, ds: Any) -> None:
    """Fit ``p`` on dataset ``name``; a failure names the dataset and the columns."""
    try:
        p.fit(ds)
    except Exception as exc:
        try:
            columns = list(ds.schema().names)
        except Exception:
            columns = []
        wanted = [c for c in (getattr(p, "columns", None) or []) if c not in columns] if columns else []
        missing = f"; columns it needs that dataset {name!r} lacks: {', '.join(map(str, wanted))}" if wanted else ""
        raise ValueError(
            f"the preprocessor {type(p).__name__} failed to fit on dataset {name!r} (columns: "
            f"{', '.join(map(str, columns)) or 'unknown'}){missing}: {type(exc).__name__}: {exc}") from exc
