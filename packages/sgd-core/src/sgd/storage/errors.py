"""The errors of a run folder: none there, one written by a newer sgd, one another driver holds."""

from __future__ import annotations

from sgd._common.public import public_module
from sgd.errors import PicklableError

__all__ = ["RunFormatError", "RunInUseError", "RunNotFoundError"]


@public_module("sgd")
class RunNotFoundError(PicklableError, FileNotFoundError, RuntimeError):
    """A folder given as a run (``Result.from_path``, ``restore``) holds no sgd run.

    A ``FileNotFoundError``, and a ``RuntimeError`` as Ray 2.60's ``Result.from_path`` raises
    for a folder that is not a run, so code written for either catches it.
    """


@public_module("sgd")
class RunFormatError(PicklableError, ValueError):
    """The run was written by a newer sgd, in a run format this one does not read."""


@public_module("sgd")
class RunInUseError(PicklableError, RuntimeError):
    """Another driver is running in this run folder (it holds the folder's lock) right now."""
