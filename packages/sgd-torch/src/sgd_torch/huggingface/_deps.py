"""The install hint for a missing Hugging Face package."""

from __future__ import annotations

import importlib.util

INSTALL_HINT = 'pip install "sgd-torch[huggingface]"'


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[name] is None (import blocked)
        return False


def require(*names: str) -> None:
    """Raise an ``ImportError`` with the install line if one of ``names`` is not importable.

    Only looks the packages up (no import): the driver of a run never needs them loaded.
    """
    missing = [name for name in names if not _installed(name)]
    if missing:
        raise ImportError(
            f"sgd_torch.huggingface needs {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL_HINT}"
        )
