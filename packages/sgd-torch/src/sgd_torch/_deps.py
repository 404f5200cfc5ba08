"""Install hints for missing optional packages (Hugging Face, Lightning)."""

from __future__ import annotations

import importlib.util


def installed(name: str) -> bool:
    """Whether ``name`` can be imported (looked up, not imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[name] is None (import blocked)
        return False


def require_for(module: str, hint: str, *names: str) -> None:
    """Raise an ``ImportError`` naming ``module``, the missing ones of ``names`` and ``hint``.

    Only looks the packages up (no import): the driver of a run never needs them loaded.
    """
    missing = [name for name in names if not installed(name)]
    if missing:
        raise ImportError(
            f"{module} needs {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {hint}"
        )
