"""The one rule for secrets: a dict key that looks like a credential never reaches a file.

sgd's run directory (``trainer.json``, ``results.jsonl``, checkpoint metadata) and every
logger of sgd-loggers apply it. A key is a secret when it contains, in any case,
``api_key`` (also ``api-key``, ``apikey``), ``token``, ``password`` or ``secret``; the
rule applies at any depth of nested dicts, lists and tuples.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Mapping

__all__ = ["SECRET_KEY", "is_secret_key", "redact"]

#: Keys that look like secrets: matched case-insensitively anywhere in a key.
SECRET_KEY = re.compile(r"api[_-]?key|token|password|secret", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def _secret_name(key: str) -> bool:
    return SECRET_KEY.search(key) is not None


def is_secret_key(key: Any) -> bool:
    """Whether a dict key looks like it names a secret (``*api_key*``, ``*token*``, ...)."""
    return isinstance(key, str) and _secret_name(key)


def redact(value: Any) -> Any:
    """A copy of ``value`` without any dict entry whose key looks like a secret.

    Recurses into dicts, lists and tuples (kept as tuples); other values are returned as they are.
    """
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items() if not is_secret_key(k)}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, tuple):
        return tuple(redact(v) for v in value)
    return value
