"""The training functions of the older trainer shape (``params=, label_column=, datasets=,
num_boost_round=``), run on every worker. Each resumes from the checkpoint the run starts
from (after a failure: the last one of the run) and boosts up to ``num_boost_round`` trees in
all, so a restart neither loses nor repeats a round."""

from __future__ import annotations

from typing import Any, Dict

import sgd
from sgd_xgboost.checkpoints import load_lightgbm_model, load_xgboost_model
from sgd_xgboost.data import to_dmatrix, to_lgb_dataset, to_quantile_dmatrix


def _where(name: str) -> str:
    return f"dataset {name!r}"


def shard_of(name: str, config: Dict[str, Any]) -> Any:
    """This worker's part of dataset ``name``: a Ray Dataset arrives split by sgd; in-memory
    data (pandas, NumPy) arrives whole and this worker takes its contiguous share of the rows."""
    data = sgd.get_dataset_shard(name)
    if name in config.get("rank_rows", ()):
        data = rows_of_rank(data, sgd.world_rank(), sgd.world_size())
    return data


def rows_of_rank(data: Any, rank: int, size: int) -> Any:
    """Rows ``[rank * n // size, (rank + 1) * n // size)`` of in-memory ``data``."""
    if isinstance(data, dict):
        return {k: rows_of_rank(v, rank, size) for k, v in data.items()}
    if isinstance(data, tuple):
        return tuple(rows_of_rank(v, rank, size) for v in data)
    n = len(data)
    start, end = rank * n // size, (rank + 1) * n // size
    return data.iloc[start:end] if hasattr(data, "iloc") else data[start:end]


def xgboost_loop(config: Dict[str, Any]) -> None:
    import xgboost

    from sgd_xgboost.xgboost_callback import XGBoostReportCallback

    label = config["label_column"]
    params = dict(config["params"])
    names = config["dataset_names"]
    dmatrix_params = config.get("dmatrix_params") or {}
    quantile = params.get("tree_method", "hist") in ("hist", "auto")

    def matrix(name: str, ref: Any = None) -> Any:
        shard = shard_of(name, config)
        kwargs = dict(dmatrix_params.get(name, {}))
        if quantile:
            if params.get("max_bin") is not None:
                kwargs.setdefault("max_bin", params["max_bin"])
            return to_quantile_dmatrix(shard, label, ref=ref, where=_where(name), **kwargs)
        return to_dmatrix(shard, label, where=_where(name), **kwargs)

    dtrain = matrix("train")
    evals = [(dtrain, "train")] + [(matrix(name, ref=dtrain), name) for name in names if name != "train"]

    checkpoint = sgd.get_checkpoint()
    booster = load_xgboost_model(checkpoint) if checkpoint is not None else None
    done = booster.num_boosted_rounds() if booster is not None else 0
    remaining = config["num_boost_round"] - done
    if remaining <= 0:
        return
    kwargs = dict(config.get("train_kwargs") or {})
    kwargs.setdefault("verbose_eval", False)
    callbacks = list(kwargs.pop("callbacks", None) or [])
    callbacks.append(XGBoostReportCallback(frequency=config["checkpoint_frequency"],
                                           checkpoint_at_end=config["checkpoint_at_end"],
                                           num_boost_round=config["num_boost_round"]))
    xgboost.train(params, dtrain, num_boost_round=remaining, evals=evals, xgb_model=booster, callbacks=callbacks,
                  **kwargs)


def lightgbm_loop(config: Dict[str, Any]) -> None:
    import lightgbm

    from sgd_xgboost.config import get_network_params
    from sgd_xgboost.lightgbm_callback import LightGBMReportCallback

    label = config["label_column"]
    params = {**config["params"], **get_network_params()}
    names = config["dataset_names"]
    dataset_params = config.get("dmatrix_params") or {}
    dtrain = to_lgb_dataset(shard_of("train", config), label, params=params, where=_where("train"),
                            **dataset_params.get("train", {}))
    valid_sets, valid_names = [dtrain], ["train"]
    for name in names:
        if name != "train":
            valid_sets.append(to_lgb_dataset(shard_of(name, config), label, reference=dtrain,
                                             where=_where(name), **dataset_params.get(name, {})))
            valid_names.append(name)

    checkpoint = sgd.get_checkpoint()
    booster = load_lightgbm_model(checkpoint) if checkpoint is not None else None
    done = booster.current_iteration() if booster is not None else 0
    remaining = config["num_boost_round"] - done
    if remaining <= 0:
        return
    kwargs = dict(config.get("train_kwargs") or {})
    callbacks = list(kwargs.pop("callbacks", None) or [])
    callbacks.append(LightGBMReportCallback(frequency=config["checkpoint_frequency"],
                                            checkpoint_at_end=config["checkpoint_at_end"]))
    lightgbm.train(params, dtrain, num_boost_round=remaining, valid_sets=valid_sets, valid_names=valid_names,
                   init_model=booster, callbacks=callbacks, **kwargs)
