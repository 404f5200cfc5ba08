"""Checkpoints of boosted models: a directory holding the model in its framework's own format
(XGBoost's UBJSON ``model.ubj``, or JSON ``model.json``; LightGBM's text ``model.txt``) and
``sgd_xgboost.json``, which says which framework and version wrote it. Never pickle.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Optional

import sgd

__all__ = ["XGBOOST_MODEL", "LIGHTGBM_MODEL", "META_FILE", "XGBoostCheckpoint", "LightGBMCheckpoint",
           "load_xgboost_model", "load_lightgbm_model",
           "checkpoint_dir_of"]

XGBOOST_MODEL = "model.ubj"
LIGHTGBM_MODEL = "model.txt"
META_FILE = "sgd_xgboost.json"

_OTHER = {"xgboost": "LightGBMTrainer", "lightgbm": "XGBoostTrainer"}


@contextmanager
def write_checkpoint(framework: str, version: str, filename: str, save: Any, rounds: int) -> Iterator[Any]:
    """A temporary directory with the model (``save(path)``) and the metadata, as an
    :class:`sgd.Checkpoint`; the directory is removed when the block ends (``sgd.report``
    takes the content before it returns)."""
    with tempfile.TemporaryDirectory(prefix="sgd-xgboost-") as tmp:
        save(os.path.join(tmp, filename))
        meta = {"framework": framework, "version": version, "model_file": filename, "rounds": rounds}
        with open(os.path.join(tmp, META_FILE), "w") as f:
            json.dump(meta, f)
        yield sgd.Checkpoint.from_directory(tmp)


@contextmanager
def checkpoint_dir_of(checkpoint: Any) -> Iterator[str]:
    """A local directory with the content of ``checkpoint`` (an :class:`sgd.Checkpoint`, any
    object with ``as_directory()``, or a path)."""
    if isinstance(checkpoint, (str, os.PathLike)):
        path = os.fspath(checkpoint)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no checkpoint directory at {path}")
        yield path
        return
    as_directory = getattr(checkpoint, "as_directory", None)
    if as_directory is None:
        raise TypeError(f"expected an sgd.Checkpoint or a path, got {type(checkpoint).__name__}")
    with as_directory() as d:
        yield d


def read_meta(directory: str) -> Optional[Dict[str, Any]]:
    path = os.path.join(directory, META_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)  # type: ignore[no-any-return]


def _model_path(directory: str, framework: str, filename: Optional[str], defaults: tuple) -> str:
    meta = read_meta(directory)
    if meta is not None and meta.get("framework") != framework:
        raise ValueError(
            f"the checkpoint in {directory} holds a {meta.get('framework')} model ({meta.get('model_file')}), not "
            f"a {framework} one: load it with sgd_xgboost.{_OTHER.get(framework, '?')}.get_model")
    names = [filename] if filename else ([meta["model_file"]] if meta else []) + list(defaults)
    for name in names:
        if os.path.isfile(os.path.join(directory, name)):
            return os.path.join(directory, name)
    present = sorted(os.listdir(directory))
    raise ValueError(f"no {framework} model ({' or '.join(names)}) in the checkpoint in {directory}; "
                     f"it holds: {', '.join(present) or '(nothing)'}")


def _version_note(directory: str, framework: str, installed: str) -> str:
    meta = read_meta(directory)
    if meta is None:
        return ""
    written = meta.get("version")
    return f" (written by {framework} {written}; this is {installed})" if written != installed else ""


def load_xgboost_model(checkpoint: Any, filename: Optional[str] = None) -> Any:
    """The ``xgboost.Booster`` saved in ``checkpoint``.

    :raises ValueError: the checkpoint holds no XGBoost model (another framework's, or none),
        or XGBoost cannot read it (the message says which versions wrote and reads it).
    """
    import xgboost

    with checkpoint_dir_of(checkpoint) as d:
        path = _model_path(d, "xgboost", filename, (XGBOOST_MODEL, "model.json"))
        booster = xgboost.Booster()
        try:
            booster.load_model(path)
        except xgboost.core.XGBoostError as exc:
            raise ValueError(f"XGBoost cannot load {path}{_version_note(d, 'xgboost', xgboost.__version__)}: "
                             f"{str(exc).splitlines()[0]}") from exc
        return booster


def load_lightgbm_model(checkpoint: Any, filename: Optional[str] = None) -> Any:
    """The ``lightgbm.Booster`` saved in ``checkpoint``.

    :raises ValueError: the checkpoint holds no LightGBM model (another framework's, or none),
        or LightGBM cannot read it.
    """
    import lightgbm

    with checkpoint_dir_of(checkpoint) as d:
        path = _model_path(d, "lightgbm", filename, (LIGHTGBM_MODEL,))
        try:
            return lightgbm.Booster(model_file=path)
        except lightgbm.basic.LightGBMError as exc:
            raise ValueError(f"LightGBM cannot load {path}{_version_note(d, 'lightgbm', lightgbm.__version__)}: "
                             f"{exc}") from exc


def _from_model(cls: Any, framework: str, version: str, booster: Any, preprocessor: Any, path: Optional[str]) -> Any:
    """A checkpoint directory (``path``, else a new temporary one) holding ``booster`` as
    ``cls.MODEL_FILENAME``, the metadata and, if given, the preprocessor."""
    directory = path if path is not None else tempfile.mkdtemp(prefix="sgd-xgboost-")
    if not os.path.isdir(directory):
        raise ValueError(f"{cls.__name__}.from_model(path=...) must be an existing directory, got {path!r}")
    booster.save_model(os.path.join(directory, cls.MODEL_FILENAME))
    meta = {"framework": framework, "version": version, "model_file": cls.MODEL_FILENAME,
            "rounds": _rounds_of(booster)}
    with open(os.path.join(directory, META_FILE), "w") as f:
        json.dump(meta, f)
    if preprocessor is not None:
        from sgd.checkpoint.preprocessor import PREPROCESSOR_FILE, encode_preprocessor

        with open(os.path.join(directory, PREPROCESSOR_FILE), "wb") as f:
            f.write(encode_preprocessor(preprocessor))
    return cls.from_directory(directory)


def _rounds_of(booster: Any) -> Optional[int]:
    rounds = getattr(booster, "num_boosted_rounds", None) or getattr(booster, "current_iteration", None)
    return int(rounds()) if callable(rounds) else None


class XGBoostCheckpoint(sgd.Checkpoint):
    """Ray Train's ``XGBoostCheckpoint``: a checkpoint directory holding an XGBoost model
    (``model.json``, as Ray writes it). Ray 2.60 deprecates it in favour of
    ``RayTrainReportCallback.get_model``; both read each other's checkpoints here."""

    MODEL_FILENAME = "model.json"

    @classmethod
    def from_model(cls, booster: Any, *, preprocessor: Any = None, path: Optional[str] = None) -> XGBoostCheckpoint:
        """A checkpoint of ``booster`` (an ``xgboost.Booster``).

        :param preprocessor: a fitted Ray Data preprocessor kept with the model.
        :param path: an existing, empty directory to write to; ``None``: a new temporary one.
        :raises ValueError: ``path`` is not a directory.
        """
        import xgboost

        return _from_model(cls, "xgboost", xgboost.__version__, booster, preprocessor, path)  # type: ignore[no-any-return]

    def get_model(self) -> Any:
        """The ``xgboost.Booster`` in this checkpoint (also one a report callback wrote)."""
        return load_xgboost_model(self)


class LightGBMCheckpoint(sgd.Checkpoint):
    """Ray Train's ``LightGBMCheckpoint``: a checkpoint directory holding a LightGBM model
    (``model.txt``)."""

    MODEL_FILENAME = LIGHTGBM_MODEL

    @classmethod
    def from_model(cls, booster: Any, *, preprocessor: Any = None, path: Optional[str] = None) -> LightGBMCheckpoint:
        """A checkpoint of ``booster`` (a ``lightgbm.Booster``); arguments as
        :meth:`XGBoostCheckpoint.from_model`."""
        import lightgbm

        return _from_model(cls, "lightgbm", lightgbm.__version__, booster, preprocessor, path)  # type: ignore[no-any-return]

    def get_model(self) -> Any:
        """The ``lightgbm.Booster`` in this checkpoint."""
        return load_lightgbm_model(self)
