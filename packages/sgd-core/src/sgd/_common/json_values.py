"""Values as strict JSON can hold them: what the run directory and checkpoint metadata write."""

from __future__ import annotations

import math
from typing import Any


def json_default(value: Any) -> Any:
    """``json.dumps(default=)``: arrays and tensors as lists, numpy scalars as numbers, else ``repr``."""
    if hasattr(value, "tolist"):  # numpy arrays and torch tensors
        try:
            return value.tolist()
        except Exception:
            pass
    if hasattr(value, "item"):
        try:
            return value.item()
        except Exception:
            pass
    return repr(value)


def finite(value: Any) -> Any:
    """``value`` with non-finite floats spelled as strings (strict JSON has no NaN/Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        # Strict JSON has no NaN/Infinity; spelled as sgd-loggers spells them.
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
