"""``DataConfig``: Ray Train 2.60's dataset settings of a trainer (``dataset_config=``): which
datasets are split among the workers, and Ray Data's execution options."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from sgd._common.public import public_module
from sgd.data.config import DatasetConfig

#: The dataset a trainer fits its preprocessor on and that AIR's rules split (Ray's
#: ``ray.train.TRAIN_DATASET_KEY``).
TRAIN_DATASET_KEY = "train"


@public_module("sgd.data")
@dataclass
class DataConfig:
    """Which datasets of ``datasets=`` are split among the workers (Ray Train 2.60's
    ``ray.train.DataConfig``), passed as a trainer's ``dataset_config=``.

    A split dataset reaches each worker as its own part of equal size, as in Ray (up to
    ``num_workers - 1`` rows of an epoch left out; sgd divides it deterministically and
    resumably where its plan allows, see :mod:`sgd.data`); any other goes whole to every
    worker. Without ``dataset_config``, an AIR trainer uses ``DataConfig()``: **every** dataset
    is split, as in Ray Train 2.60. (Ray AIR 2.x split only ``"train"``; its dict of
    :class:`sgd.DatasetConfig` keeps that meaning when it is passed instead.)

    :param datasets_to_split: ``"all"`` (the default), or a list of dataset names: only these
        are split. A name that is not among the trainer's datasets is an error at ``fit()``
        (Ray ignores it).
    :param execution_options: Ray Data ``ExecutionOptions`` for every dataset, or a dict of
        them by dataset name (the others keep Ray Data's current options), set on each
        dataset's context before it is split.
    :param enable_shard_locality: accepted for Ray compatibility; sgd's coordinated splits
        always pass the workers' nodes as locality hints, and its divided splits read where
        each worker runs.

    Ray's ``DataConfig.configure()`` (a subclass that hands out its own iterators) is not
    called by sgd: a subclass that overrides it is refused at ``fit()`` with ``ValueError``.
    """

    datasets_to_split: Union[str, List[str]] = "all"
    execution_options: Any = None
    enable_shard_locality: bool = True

    def __post_init__(self) -> None:
        names = self.datasets_to_split
        if isinstance(names, tuple):
            names = self.datasets_to_split = list(names)
        if names != "all" and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise TypeError(f"DataConfig(datasets_to_split=...) takes 'all' or a list of dataset names, "
                            f"got {type(names).__name__} {names!r}")
        if not isinstance(self.enable_shard_locality, bool):
            raise TypeError(f"DataConfig(enable_shard_locality=...) takes True or False, "
                            f"got {self.enable_shard_locality!r}")

    def split_names(self, datasets: Dict[str, Any]) -> List[str]:
        """The names of ``datasets`` (the trainer's) that are split.

        :raises ValueError: ``datasets_to_split`` names a dataset that is not in ``datasets``.
        """
        if self.datasets_to_split == "all":
            return list(datasets)
        unknown = [n for n in self.datasets_to_split if n not in datasets]
        if unknown:
            raise ValueError(f"DataConfig(datasets_to_split={self.datasets_to_split!r}) names {unknown}, which "
                             f"are not among the trainer's datasets ({sorted(datasets) or 'none'}); "
                             "pass names of datasets=, or 'all'")
        return [n for n in datasets if n in self.datasets_to_split]

    def execution_options_for(self, name: str) -> Optional[Any]:
        """The ``ExecutionOptions`` given for dataset ``name`` (a copy), or ``None`` (Ray Data's own)."""
        options = self.execution_options
        if isinstance(options, dict):
            options = options.get(name)
        return copy.deepcopy(options) if options is not None else None

    def check_supported(self) -> None:
        """:raises ValueError: a subclass overrides ``configure()``, which sgd does not call."""
        if "configure" in {n for c in type(self).__mro__ if c is not DataConfig for n in vars(c)}:
            raise ValueError(f"{type(self).__name__} overrides DataConfig.configure(), which sgd does not call "
                             "(sgd shards the datasets itself). Pass DataConfig(datasets_to_split=...) or a dict "
                             "of sgd.DatasetConfig by dataset name instead.")

    def apply_execution_options(self, datasets: Dict[str, Any]) -> Dict[str, Any]:
        """``datasets`` with the execution options set, each on a copy of its Ray Dataset."""
        out = dict(datasets)
        for name, ds in datasets.items():
            options = self.execution_options_for(name)
            if options is None or not hasattr(ds, "context"):
                continue
            ds = type(ds).copy(ds)
            ds.context.execution_options = options
            out[name] = ds
        return out


def split_configs(data_config: DataConfig, rules: Dict[str, DatasetConfig], datasets: Dict[str, Any]
                  ) -> Dict[str, DatasetConfig]:
    """The :class:`DatasetConfig` of every dataset of an AIR trainer given a :class:`DataConfig`:
    the trainer's rules (``_dataset_config``: which dataset the preprocessor is fitted on, which
    it transforms) with ``split`` set from ``datasets_to_split``.

    :raises ValueError: a name in ``datasets_to_split`` is not among ``datasets``, or the
        config overrides ``configure()``.
    """
    data_config.check_supported()
    split = set(data_config.split_names(datasets))
    resolved = {}
    for name in datasets:
        base = rules.get(name, rules.get("*", DatasetConfig()))
        # Ray's split is equal=True: every worker the same number of rows (up to n - 1 left out).
        resolved[name] = dataclasses.replace(base, split=name in split, equal=base.equal or name in split
                                             ).resolved(split=True)
    return resolved
