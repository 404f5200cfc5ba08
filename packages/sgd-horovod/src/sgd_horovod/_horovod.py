"""Finding Horovod, with an install hint when it is missing.

Horovod is not a dependency of sgd-horovod (see ``pyproject.toml``): its only release is a
source distribution that must be patched to build against current torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

INSTALL_HINT = (
    "Horovod 0.28.1 has no wheel on PyPI and its source distribution does not build against "
    "torch >= 2.1 as it comes. Build and install a patched wheel (PyTorch + Gloo, cached after the "
    "first build) into this Python with `python scripts/build_horovod.py --install -c constraints.txt` "
    "from the sgd repository; see docs/horovod.md."
)


def horovod_available() -> bool:
    """Whether ``horovod`` can be imported here (without importing it)."""
    return importlib.util.find_spec("horovod") is not None


def require_horovod(module: str = "horovod", where: str = "") -> ModuleType:
    """Import ``module`` (``horovod`` or one of its submodules) or raise an ``ImportError``
    that says how to install Horovod.

    :param where: where it is missing, for the message (``"on worker rank 1"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        place = f" {where}" if where else ""
        raise ImportError(
            f"sgd-horovod needs Horovod, which cannot be imported{place} ({exc}). {INSTALL_HINT}"
        ) from exc
