"""``XGBoostTrainer`` and ``LightGBMTrainer``, in both of Ray Train's shapes.

Ray 2.60's shape runs your function on every worker::

    XGBoostTrainer(train_loop_per_worker, train_loop_config=..., scaling_config=..., datasets=...)

The older Ray 2.x shape needs no function: the trainer builds the matrices from the datasets
(``"train"`` to train on, every other one to evaluate), boosts ``num_boost_round`` trees,
reports every round and checkpoints as ``run_config.checkpoint_config`` says::

    XGBoostTrainer(params={...}, label_column="target", datasets={"train": ds}, num_boost_round=10)

Either way ``fit()`` returns an :class:`sgd.Result`; ``XGBoostTrainer.get_model(result.checkpoint)``
is the booster.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from sgd.air import CheckpointConfig, DataParallelTrainer, RunConfig, ScalingConfig
from sgd.data import DatasetConfig
from sgd_xgboost import _params
from sgd_xgboost.checkpoints import load_lightgbm_model, load_xgboost_model
from sgd_xgboost.config import LightGBMConfig, XGBoostConfig

__all__ = ["XGBoostTrainer", "LightGBMTrainer"]

#: Ray's default for the older shape
DEFAULT_ROUNDS = 10


class _BoostingTrainer(DataParallelTrainer):
    _framework = ""
    _config_arg = ""

    def check_settings(self) -> None:
        """The older shape (``params=``) runs its own boosting loop and honours
        ``CheckpointConfig(checkpoint_frequency=, checkpoint_at_end=)``; with your own
        ``train_loop_per_worker``, your loop checkpoints, and the fields are refused at ``fit()``
        as for any :class:`~sgd.air.DataParallelTrainer`."""
        if not self._legacy:
            super().check_settings()

    def __init__(
        self,
        train_loop_per_worker: Optional[Callable[..., Any]] = None,
        *,
        train_loop_config: Optional[Dict[str, Any]] = None,
        backend_config: Any = None,
        scaling_config: Optional[ScalingConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
        resume_from_checkpoint: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
        preprocessor: Any = None,
        label_column: Optional[str] = None,
        params: Optional[Dict[str, Any]] = None,
        num_boost_round: Optional[int] = None,
        dmatrix_params: Optional[Dict[str, Dict[str, Any]]] = None,
        train_kwargs: Optional[Dict[str, Any]] = None,
        validation_config: Any = None,
    ):
        older = {"label_column": label_column, "params": params, "num_boost_round": num_boost_round,
                 "dmatrix_params": dmatrix_params, **({"**train_kwargs": train_kwargs} if train_kwargs else {})}
        given_older = [k for k, v in older.items() if v is not None]
        self._legacy = train_loop_per_worker is None
        if not self._legacy:
            if given_older:
                raise ValueError(
                    f"{type(self).__name__} takes either train_loop_per_worker (Ray 2.60's shape) or "
                    f"params=/label_column=/num_boost_round= (the older shape), not both; got "
                    f"train_loop_per_worker and {', '.join(given_older)}")
        else:
            if train_loop_config is not None:
                raise ValueError(f"train_loop_config goes with train_loop_per_worker; in the older shape pass "
                                 f"params= to {type(self).__name__}")
            scaling = scaling_config or ScalingConfig()
            train_loop_per_worker, train_loop_config, dataset_config = self._legacy_setup(
                label_column, params, num_boost_round, datasets, dataset_config, dmatrix_params,
                dict(train_kwargs or {}), scaling, run_config)
        assert train_loop_per_worker is not None
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=backend_config,
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint,
            preprocessor=preprocessor,
            metadata=metadata,
            validation_config=validation_config,
        )

    # --- the older shape -------------------------------------------------------------

    def _legacy_setup(self, label_column: Optional[str], params: Optional[Dict[str, Any]],
                      num_boost_round: Optional[int], datasets: Optional[Dict[str, Any]],
                      dataset_config: Optional[Dict[str, DatasetConfig]],
                      dmatrix_params: Optional[Dict[str, Dict[str, Any]]], train_kwargs: Dict[str, Any],
                      scaling: ScalingConfig, run_config: Optional[RunConfig]) -> tuple:
        name = type(self).__name__
        if not label_column:
            raise ValueError(f"{name}(params=...) needs label_column=, the name of the label column of every "
                             "dataset (or pass train_loop_per_worker)")
        if not isinstance(datasets, dict) or "train" not in datasets:
            got = sorted(datasets) if isinstance(datasets, dict) else datasets
            raise ValueError(f"{name}(params=...) needs datasets={{'train': ...}} (the training data; other names "
                             f"are evaluated each round), got {got!r}")
        rounds = DEFAULT_ROUNDS if num_boost_round is None else num_boost_round
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds <= 0:
            raise ValueError(f"num_boost_round must be a positive int, got {num_boost_round!r}")
        for key, data in datasets.items():
            columns = _cheap_columns(data)
            if columns is not None and label_column not in columns:
                from sgd_xgboost.data import label_error  # numpy: not when the plugin is discovered

                raise label_error(label_column, columns, f"dataset {key!r}")
        unknown = sorted(set(dmatrix_params or {}) - set(datasets))
        if unknown:
            raise ValueError(f"dmatrix_params names datasets {unknown} that are not in datasets= "
                             f"({', '.join(sorted(datasets))})")
        checked = self._check_params(params, scaling)
        self._given_params = dict(params or {})  # a Tune trial's params= merge into these
        cc = (run_config.checkpoint_config if run_config is not None else None) or CheckpointConfig()
        at_end = True if cc.checkpoint_at_end is None else cc.checkpoint_at_end
        config = {
            "label_column": label_column,
            "params": checked,
            "num_boost_round": rounds,
            "dataset_names": ["train", *sorted(k for k in datasets if k != "train")],
            "dmatrix_params": dmatrix_params or {},
            "train_kwargs": train_kwargs,
            "checkpoint_frequency": cc.checkpoint_frequency,
            "checkpoint_at_end": at_end,
            # In-memory data reaches every worker whole; each takes its share of the rows
            # (sgd_xgboost._loops.shard_of). A split evaluation set stays whole, as configured.
            "rank_rows": sorted(k for k, v in datasets.items() if _in_memory(v) and self._split(k, dataset_config)),
        }
        self.label_column = label_column
        self.params = checked
        self.num_boost_round = rounds
        return self._legacy_loop(), config, self._legacy_dataset_config(datasets, dataset_config)

    def apply_param_space(self, space: Dict[str, Any]) -> Dict[str, Any]:
        """A Tune trial's ``param_space`` in the older shape, as Ray 2.x's GBDT trainers took it:
        ``"params"`` (a dict) merged into the trainer's ``params`` and checked again against the
        trial's ``scaling_config``; ``"num_boost_round"`` replaces the trainer's. In Ray 2.60's
        shape, tune ``param_space={"train_loop_config": {...}}`` instead."""
        left = dict(space)
        if not self._legacy:
            return left
        name = type(self).__name__
        config = dict(self.train_loop_config)
        trial_params = left.pop("params", None) or {}
        if not isinstance(trial_params, dict):
            raise ValueError(f"{name}: param_space['params'] must be a dict of boosting parameters, "
                             f"got {type(trial_params).__name__}")
        params = {**self._given_params, **trial_params}
        config["params"] = self._check_params(params, self.scaling_config)  # the trial's workers
        if "num_boost_round" in left:
            rounds = left.pop("num_boost_round")
            if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds <= 0:
                raise ValueError(f"{name}: param_space['num_boost_round'] must be a positive int, got {rounds!r}")
            config["num_boost_round"] = rounds
        self.train_loop_config = config
        self.params, self.num_boost_round = config["params"], config["num_boost_round"]
        return left

    def _check_params(self, params: Optional[Dict[str, Any]], scaling: ScalingConfig) -> Dict[str, Any]:
        raise NotImplementedError

    def _legacy_loop(self) -> Callable[[Dict[str, Any]], None]:
        raise NotImplementedError

    def _legacy_dataset_config(self, datasets: Dict[str, Any], given: Optional[Dict[str, DatasetConfig]]
                               ) -> Optional[Dict[str, DatasetConfig]]:
        return given

    def _split(self, name: str, given: Optional[Dict[str, DatasetConfig]]) -> bool:
        """Whether dataset ``name`` is divided among the workers in the older shape."""
        config = (self._legacy_dataset_config({name: None}, given) or {}).get(name)
        return config is None or config.split is not False

def _in_memory(data: Any) -> bool:
    import numpy as np
    import pandas as pd

    return isinstance(data, (pd.DataFrame, np.ndarray, dict, tuple))


def _cheap_columns(data: Any) -> Optional[List[Any]]:
    """The columns of ``data`` when knowing them costs no pass over it."""
    from sgd_xgboost.data import columns_of  # numpy: not when the plugin is discovered

    try:
        return columns_of(data)
    except Exception:
        return None


class XGBoostTrainer(_BoostingTrainer):
    """Distributed XGBoost on sgd workers (the ``"xgboost"`` backend).

    Ray 2.60's shape: ``XGBoostTrainer(train_loop_per_worker, *, train_loop_config=None,
    xgboost_config=None, scaling_config=None, run_config=None, datasets=None, dataset_config=None,
    resume_from_checkpoint=None, metadata=None, preprocessor=None, validation_config=None)``
    (``validation_config``: Ray 2.60's :class:`sgd.ValidationConfig`); inside the loop,
    ``xgboost.train(...)`` is one distributed job (build the matrices with
    :func:`sgd_xgboost.to_quantile_dmatrix` from ``sgd.get_dataset_shard(name)``, report with
    :class:`sgd_xgboost.xgboost.RayTrainReportCallback`, Ray's name, or
    :class:`sgd_xgboost.XGBoostReportCallback`, the same callback).

    The older shape: ``XGBoostTrainer(*, datasets={"train": ..., "valid": ...}, label_column=,
    params=, num_boost_round=10, dmatrix_params=None, scaling_config=..., run_config=...,
    resume_from_checkpoint=None, preprocessor=None, **train_kwargs)`` (``train_kwargs`` go to
    ``xgboost.train``). ``preprocessor``, in either shape: a Ray Data preprocessor applied to every
    dataset and kept in every checkpoint, as in Ray AIR. A Tune search over ``param_space={"params":
    {...}, "num_boost_round": ...}`` merges into these (:meth:`apply_param_space`).
    ``params`` are checked against the workers: a GPU without GPUs is a ``ValueError``;
    ``nthread`` defaults to, and is lowered with a warning to, the CPUs each worker reserves.
    ``num_boost_round`` counts the trees of the final model, also when resuming from a checkpoint.
    Checkpoints every ``run_config.checkpoint_config.checkpoint_frequency`` rounds and at the end.
    """

    _default_backend_config = XGBoostConfig

    def __init__(
        self,
        train_loop_per_worker: Optional[Callable[..., Any]] = None,
        *,
        train_loop_config: Optional[Dict[str, Any]] = None,
        xgboost_config: Optional[XGBoostConfig] = None,
        scaling_config: Optional[ScalingConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
        resume_from_checkpoint: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
        preprocessor: Any = None,
        label_column: Optional[str] = None,
        params: Optional[Dict[str, Any]] = None,
        num_boost_round: Optional[int] = None,
        dmatrix_params: Optional[Dict[str, Dict[str, Any]]] = None,
        validation_config: Any = None,
        **train_kwargs: Any,
    ):
        if xgboost_config is not None and not isinstance(xgboost_config, XGBoostConfig):
            raise TypeError(f"xgboost_config must be a sgd_xgboost.XGBoostConfig, got {type(xgboost_config).__name__}")
        super().__init__(
            train_loop_per_worker, train_loop_config=train_loop_config, backend_config=xgboost_config,
            scaling_config=scaling_config, run_config=run_config, datasets=datasets, dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint, metadata=metadata, preprocessor=preprocessor,
            label_column=label_column,
            params=params, num_boost_round=num_boost_round, dmatrix_params=dmatrix_params, train_kwargs=train_kwargs,
            validation_config=validation_config,
        )

    def _check_params(self, params: Optional[Dict[str, Any]], scaling: ScalingConfig) -> Dict[str, Any]:
        return _params.xgboost_params(params, scaling)

    def _legacy_loop(self) -> Callable[[Dict[str, Any]], None]:
        from sgd_xgboost._loops import xgboost_loop

        return xgboost_loop

    @classmethod
    def get_model(cls, checkpoint: Any, filename: Optional[str] = None) -> Any:
        """The ``xgboost.Booster`` in ``checkpoint`` (``result.checkpoint``, or a path).

        :raises ValueError: the checkpoint holds no XGBoost model (a LightGBM one, or none),
            or this XGBoost cannot read it (the message names both versions).
        """
        return load_xgboost_model(checkpoint, filename)


class LightGBMTrainer(_BoostingTrainer):
    """Distributed LightGBM on sgd workers (the ``"lightgbm"`` backend).

    The same two shapes as :class:`XGBoostTrainer` (``lightgbm_config=`` instead of
    ``xgboost_config=``). In Ray 2.60's shape, merge :func:`sgd_xgboost.get_network_params`
    into the ``params`` of ``lightgbm.train`` with ``tree_learner="data"``. In the older shape
    the trainer does that; the training set is split among the workers and every other dataset
    is given whole to each (LightGBM computes evaluation metrics on each worker's own rows, so
    whole sets give every worker the metrics of the whole set), unless ``dataset_config`` says
    otherwise.
    """

    _default_backend_config = LightGBMConfig

    def __init__(
        self,
        train_loop_per_worker: Optional[Callable[..., Any]] = None,
        *,
        train_loop_config: Optional[Dict[str, Any]] = None,
        lightgbm_config: Optional[LightGBMConfig] = None,
        scaling_config: Optional[ScalingConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        dataset_config: Optional[Dict[str, DatasetConfig]] = None,
        resume_from_checkpoint: Any = None,
        metadata: Optional[Dict[str, Any]] = None,
        preprocessor: Any = None,
        label_column: Optional[str] = None,
        params: Optional[Dict[str, Any]] = None,
        num_boost_round: Optional[int] = None,
        dmatrix_params: Optional[Dict[str, Dict[str, Any]]] = None,
        validation_config: Any = None,
        **train_kwargs: Any,
    ):
        if lightgbm_config is not None and not isinstance(lightgbm_config, LightGBMConfig):
            raise TypeError(
                f"lightgbm_config must be a sgd_xgboost.LightGBMConfig, got {type(lightgbm_config).__name__}")
        super().__init__(
            train_loop_per_worker, train_loop_config=train_loop_config, backend_config=lightgbm_config,
            scaling_config=scaling_config, run_config=run_config, datasets=datasets, dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint, metadata=metadata, preprocessor=preprocessor,
            label_column=label_column,
            params=params, num_boost_round=num_boost_round, dmatrix_params=dmatrix_params, train_kwargs=train_kwargs,
            validation_config=validation_config,
        )

    def _check_params(self, params: Optional[Dict[str, Any]], scaling: ScalingConfig) -> Dict[str, Any]:
        return _params.lightgbm_params(params, scaling)

    def _legacy_loop(self) -> Callable[[Dict[str, Any]], None]:
        from sgd_xgboost._loops import lightgbm_loop

        return lightgbm_loop

    def _legacy_dataset_config(self, datasets: Dict[str, Any], given: Optional[Dict[str, DatasetConfig]]
                               ) -> Optional[Dict[str, DatasetConfig]]:
        out = {k: DatasetConfig(split=False) for k in datasets if k != "train"}
        out.update(given or {})
        return out

    @classmethod
    def get_model(cls, checkpoint: Any, filename: Optional[str] = None) -> Any:
        """The ``lightgbm.Booster`` in ``checkpoint`` (``result.checkpoint``, or a path).

        :raises ValueError: the checkpoint holds no LightGBM model (an XGBoost one, or none).
        """
        return load_lightgbm_model(checkpoint, filename)

