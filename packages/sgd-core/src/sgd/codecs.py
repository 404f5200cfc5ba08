"""Checkpoint codecs (the public name plugin packages import): the module is
:mod:`sgd.checkpoint.codecs`, re-exported here whole."""

from sgd.checkpoint.codecs import (
    TRUST_ENV,
    Codec,
    PickleCodec,
    SafeCodec,
    find_unsafe,
    get_codec,
    is_safe_format,
    load_safe,
    registered_codecs,
    resolve_trusted,
    save_safe,
    untrusted_error,
)

__all__ = [
    "TRUST_ENV",
    "Codec",
    "PickleCodec",
    "SafeCodec",
    "find_unsafe",
    "get_codec",
    "is_safe_format",
    "load_safe",
    "registered_codecs",
    "resolve_trusted",
    "save_safe",
    "untrusted_error",
]
