"""The install hint for a missing Hugging Face package."""

from __future__ import annotations

from sgd_torch._deps import require_for

INSTALL_HINT = 'pip install "sgd-torch[huggingface]"'


def require(*names: str) -> None:
    """Raise an ``ImportError`` with the install line if one of ``names`` is not importable."""
    require_for("sgd_torch.huggingface", INSTALL_HINT, *names)
