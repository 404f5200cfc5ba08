"""The one rule for secrets: a dict key that looks like a credential never reaches a file.

sgd's run directory (``trainer.json``, ``results.jsonl``, checkpoint metadata) and every
logger of sgd-loggers apply it. A key is a secret when it contains, in any case,
``api_key`` (also ``api-key``, ``apikey``), ``token``, ``password`` or ``secret``; the
rule applies at any depth of nested dicts, lists and tuples.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from itertools import chain
from typing import Any, List

__all__ = ["SECRET_KEY", "is_secret_key", "redact", "redact_text"]

#: Keys that look like secrets: matched case-insensitively anywhere in a key.
SECRET_KEY = re.compile(r"api[_-]?key|token|password|secret", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def _secret_name(key: str) -> bool:
    return SECRET_KEY.search(key) is not None


@functools.lru_cache(maxsize=1024)
def _no_secret_keys(keys: tuple) -> bool:
    return not any(is_secret_key(k) for k in keys)


def is_secret_key(key: Any) -> bool:
    """Whether a dict key looks like it names a secret (``*api_key*``, ``*token*``, ...)."""
    return isinstance(key, str) and _secret_name(key)


#: Types returned as they are without a look inside (the common report values): the check
#: runs on every value of every report round, so it must stay cheap.
_LEAVES = frozenset({str, int, float, bool, type(None)})


def _all_leaves(value: dict) -> bool:
    return all(map(_LEAVES.__contains__, map(type, value.values())))  # one loop in C


def is_clean_flat(value: dict) -> bool:
    """Whether :func:`redact` keeps this dict as it is: no key names a secret and every value is
    a leaf (the common report; its key set is asked once)."""
    return _no_secret_keys(tuple(value)) and _all_leaves(value)


def are_clean_flat(rows: List[dict]) -> bool:
    """:func:`is_clean_flat` for each of ``rows`` (a worker's batch of reports), asked at once:
    their keys together, their values in one loop in C."""
    return _no_secret_keys(tuple(set().union(*rows))) and all(
        map(_LEAVES.__contains__, map(type, chain.from_iterable(map(dict.values, rows)))))


def redact(value: Any) -> Any:
    """A copy of ``value`` without any dict entry whose key looks like a secret.

    Recurses into dicts (any mapping), lists and tuples (kept as tuples); other values are
    returned as they are.
    """
    if type(value) in _LEAVES:
        return value
    if isinstance(value, dict):
        if _no_secret_keys(tuple(value)):  # a report's keys repeat every round: asked once
            if _all_leaves(value):
                return dict(value)
            return {k: redact(v) for k, v in value.items()}
        return {k: redact(v) for k, v in value.items() if not is_secret_key(k)}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, tuple):
        return tuple(redact(v) for v in value)
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items() if not is_secret_key(k)}
    return value


#: ``name=value``, ``name: value``, ``"name": "value"`` where the name looks like a secret: from the
#: secret word on (what comes before it in the name stays), the value up to the next space, comma,
#: quote or bracket. Anchored on the word, so that the search stays linear in the text.
_SECRET_ASSIGNMENT = re.compile(
    r"""(?P<name>(?:api[_-]?key|token|password|secret)[\w.-]{0,64}?)(?P<sep>["']?\s{0,8}[:=]\s{0,8}["']?)"""
    r"""(?P<value>[^\s"',)}\]]+)""", re.IGNORECASE)
_BEARER = re.compile(r"(?P<name>\bBearer\s+)(?P<value>[A-Za-z0-9._~+/=-]+)")


def redact_text(text: str) -> str:
    """``text`` (an error message, a traceback, a log line) with the value of every
    ``name=value`` / ``name: value`` whose name looks like a secret (the rule of
    :data:`SECRET_KEY`), and every ``Bearer`` token, replaced by ``***``."""
    text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m['name']}{m['sep']}***", text)
    return _BEARER.sub(lambda m: f"{m['name']}***", text)
