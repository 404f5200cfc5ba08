"""Entry point of sgd-xgboost: declares the ``"xgboost"`` and ``"lightgbm"`` backends.
Glue only; imports neither framework."""

import sgd
from sgd_xgboost.config import LightGBMConfig, XGBoostConfig


@sgd.hookimpl
def sgd_backends():
    return [
        sgd.BackendSpec("xgboost", XGBoostConfig, provider="sgd-xgboost"),
        sgd.BackendSpec("lightgbm", LightGBMConfig, provider="sgd-xgboost"),
    ]
