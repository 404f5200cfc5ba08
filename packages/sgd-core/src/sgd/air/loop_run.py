"""How :class:`sgd.air.DataParallelTrainer` starts its loop: the datasets as the workers get them
(Ray AIR's and Ray Train 2.60's dataset rules, the preprocessor fitted and applied) and the loop
started on an :class:`sgd.Trainer`; and the trainer as a Ray Tune trainable (through the
``sgd-tune`` plugin, whose trials start the loop the same way).

:class:`_LoopRun` and :class:`_TuneTrainable` are those parts of the trainer (mixins: the trainer's
``__init__`` sets the state declared here).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

from sgd.air.callback import user_callbacks_of
from sgd.air.config import CheckpointConfig, RunConfig
from sgd.air.outcome import ReturnValue
from sgd.air.preprocessing import fit_preprocessor, needs_fit
from sgd.callbacks import TrainingCallback
from sgd.data import DataConfig, DatasetConfig
from sgd.data.data_config import split_configs
from sgd.plugins import get_plugin_manager
from sgd.trainer import Trainer


class _LoopRun:
    """The datasets and the loop's start of :class:`sgd.air.DataParallelTrainer` (a mixin)."""

    _dataset_config: Dict[str, DatasetConfig]
    datasets: Optional[Dict[str, Any]]
    dataset_config: Union[DataConfig, Dict[str, DatasetConfig], None]
    preprocessor: Any
    run_config: RunConfig
    train_loop_per_worker: Callable[..., Any]
    train_loop_config: Dict[str, Any]
    resume_from_checkpoint: Any

    def dataset_configs(self) -> Dict[str, DatasetConfig]:
        """The config of every dataset passed, Ray AIR's way: the trainer's rules
        (:attr:`_dataset_config`) with the user's ``dataset_config`` merged in, resolved.

        :raises ValueError: a dataset marked ``required`` is missing, or more than one is to be fitted.
        """
        rules = type(self)._dataset_config
        datasets = self.datasets or {}
        if self.dataset_config is None or isinstance(self.dataset_config, DataConfig):
            return split_configs(self.dataset_config or DataConfig(), rules, datasets)
        user = dict(self.dataset_config)
        for name, config in user.items():
            if config.required and name not in datasets and name not in ("*", "default"):
                raise ValueError(f"dataset {name!r} is required (DatasetConfig(required=True)) and was not passed; "
                                 f"passed: {', '.join(map(str, datasets)) or 'none'}")
        resolved = {}
        for name in datasets:
            base = rules.get(name, rules.get("*", DatasetConfig()))
            for key in ("*", "default", name):
                if key in user:
                    base = user[key].merged(base)
            resolved[name] = base.resolved(split=True)
        fitted = [n for n, c in resolved.items() if c.fit]
        if self.preprocessor is not None and len(fitted) > 1:
            raise ValueError(f"the preprocessor can be fitted on one dataset; DatasetConfig(fit=True) is set for "
                             f"{', '.join(fitted)}")
        return resolved

    def preprocess_datasets(self) -> Tuple[Optional[Dict[str, Any]], Dict[str, DatasetConfig]]:
        """The datasets as the workers get them (the preprocessor fitted and applied) and their configs."""
        configs = self.dataset_configs()
        if self.datasets is None:
            return None, configs
        datasets = dict(self.datasets)
        if isinstance(self.dataset_config, DataConfig):
            datasets = self.dataset_config.apply_execution_options(datasets)
        p = self.preprocessor
        if p is None:
            return datasets, configs
        fit_on = [n for n, c in configs.items() if c.fit]
        if fit_on and needs_fit(p):
            fit_preprocessor(p, fit_on[0], datasets[fit_on[0]])
        for name, ds in datasets.items():
            if configs[name].transform is not False and hasattr(ds, "map_batches"):
                datasets[name] = p.transform(ds)
        return datasets, configs

    def run_on(self, trainer: Trainer, callbacks: Optional[Sequence[Any]] = None,
               prepared: Optional[Tuple[Optional[Dict[str, Any]], Dict[str, DatasetConfig]]] = None) -> Any:
        """Start this trainer's loop on ``trainer`` (an :class:`sgd.Trainer` made by
        :meth:`make_trainer`, started); the :class:`sgd.TrainingIterator`. ``fit()`` and
        sgd-tune's trials run it. The datasets are preprocessed first (unless ``prepared``, what
        :meth:`preprocess_datasets` returned, is given); rank 0's return value of the loop is the
        run's (:class:`sgd.air.outcome.ReturnValue`), the others' are dropped."""
        datasets, configs = prepared if prepared is not None else self.preprocess_datasets()
        checkpoint_config = self.run_config.checkpoint_config or CheckpointConfig()
        own = [c for c in (self.run_config.callbacks or []) if isinstance(c, TrainingCallback)]
        users = user_callbacks_of(self, self.run_config.callbacks)  # Ray 2.x's UserCallbacks; None: none
        iterator = trainer.run_iterator(
            ReturnValue(self.train_loop_per_worker),
            config=self.train_loop_config,
            dataset=datasets,
            checkpoint=self.resume_from_checkpoint,  # a restored run's own latest wins
            checkpoint_strategy=checkpoint_config.to_strategy(),
            callbacks=[*own, *([users] if users is not None else []), *(callbacks or [])],
            dataset_config=configs or None,
            preprocessor=self.preprocessor,
        )
        if users is not None:
            users.checkpoint_for = iterator.checkpoint_for
        return iterator


class _TuneTrainable:
    """:class:`sgd.air.DataParallelTrainer` as a Ray Tune function trainable (a mixin)."""

    def as_trainable(self) -> Any:
        """A Ray Tune function trainable running this trainer per trial (needs ``sgd-tune``).

        ``param_space={"train_loop_config": {...}}`` values are merged into
        ``train_loop_config``. ``tune.Tuner(trainer, ...)`` works too: the trainer is callable.
        """

        trainable = get_plugin_manager().hook.sgd_tune_trainable(trainer=self, train_func=None, dataset=None)
        if trainable is None:
            raise ImportError(f"{type(self).__name__}.as_trainable needs the sgd-tune package: pip install sgd-tune")
        return trainable

    def __call__(self, config: Dict[str, Any]) -> Any:
        """Run as a Ray Tune function trainable (``tune.Tuner(trainer, param_space=...)``)."""
        return self.as_trainable()(config)

    @property
    def _resources(self) -> Any:
        # What Ray Tune reads off a function trainable to reserve resources for a trial.
        return getattr(self.as_trainable(), "_resources", None)

    @property
    def __mixins__(self) -> tuple:
        """Classes Ray Tune mixes into the trainable it makes of this trainer (sgd-tune's keeps
        the workers between trials when Tune reuses the actor, and shuts them down after)."""
        return tuple(getattr(self.as_trainable(), "__mixins__", ()))
