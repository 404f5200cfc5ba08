"""sgd-xgboost: distributed XGBoost and LightGBM on sgd, written against sgd's public API only.

The backends (``"xgboost"``, ``"lightgbm"``), their configs and the trainers import neither
framework; the report callbacks (which subclass XGBoost's) and the data helpers import theirs
on first use.

Ray Train 2.60's modules are here under renamed imports: ``sgd_xgboost.xgboost`` is
``ray.train.xgboost`` and ``sgd_xgboost.lightgbm`` is ``ray.train.lightgbm`` (each with its own
``RayTrainReportCallback``); importing ``sgd_xgboost`` imports neither.
"""

from typing import Any

from sgd_xgboost.checkpoints import load_lightgbm_model, load_xgboost_model
from sgd_xgboost.config import LightGBMConfig, XGBoostConfig, XGBoostPeerError, get_network_params
from sgd_xgboost.trainer import LightGBMTrainer, XGBoostTrainer

# Plugin discovery imports this package in every sgd process (the `sgd` CLI too): the callbacks
# (XGBoost, LightGBM) and the data helpers (numpy) load on first use.
_LAZY = {"XGBoostReportCallback": "xgboost_callback", "LightGBMReportCallback": "lightgbm_callback",
         "to_dmatrix": "data", "to_lgb_dataset": "data", "to_quantile_dmatrix": "data"}

__version__ = "0.1.0"
__all__ = [
    "LightGBMConfig",
    "LightGBMTrainer",
    "XGBoostConfig",
    "XGBoostPeerError",
    "XGBoostTrainer",
    "get_network_params",
    "load_lightgbm_model",
    "load_xgboost_model",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    # Plugin discovery imports this package in every sgd process: XGBoost only when used.
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(f"sgd_xgboost.{_LAZY[name]}")
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(f"sgd_xgboost.{name} needs its framework: pip install 'sgd-xgboost' ({exc})") from exc
        return getattr(module, name)
    raise AttributeError(f"module 'sgd_xgboost' has no attribute {name!r}")
