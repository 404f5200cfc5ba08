"""Checkpoint codecs (the public name plugin packages import): the module is
:mod:`sgd.checkpoint.codecs`, re-exported here whole."""

from sgd.checkpoint.codecs import *  # noqa: F403
from sgd.checkpoint.codecs import __all__  # noqa: F401
