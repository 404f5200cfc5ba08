"""``sgd_xgboost.lightgbm``: Ray Train 2.60's ``ray.train.lightgbm`` under sgd.

Every name of that module's ``__all__`` is here with Ray's signature and meaning, so Ray code
moves over by renaming its import::

    from ray.train.lightgbm import LightGBMTrainer, RayTrainReportCallback, get_network_params
    from sgd_xgboost.lightgbm import LightGBMTrainer, RayTrainReportCallback, get_network_params

``RayTrainReportCallback`` here is LightGBM's (XGBoost's is in ``sgd_xgboost.xgboost``).
Importing this module does not import LightGBM; the callback does when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

from sgd_xgboost.checkpoints import LIGHTGBM_MODEL, LightGBMCheckpoint
from sgd_xgboost.config import LightGBMConfig, get_network_params
from sgd_xgboost.lightgbm_callback import LightGBMReportCallback
from sgd_xgboost.trainer import LightGBMTrainer

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RayTrainReportCallback", "LightGBMCheckpoint", "LightGBMTrainer", "LightGBMConfig",
           "get_network_params", "normalize_pandas_for_lightgbm"]


class RayTrainReportCallback(LightGBMReportCallback):
    """Ray Train's LightGBM report callback: pass it to ``lightgbm.train(callbacks=[...])`` in a
    training function.

    Every boosting round, every worker calls :func:`sgd.report` with the round's evaluation
    results, keyed ``"<dataset>-<metric>"`` (``"valid-binary_logloss"``; ``lightgbm.cv``'s are
    ``"<dataset>-<metric>-mean"`` and ``"...-stdv"``). Rank 0 attaches a checkpoint holding the
    model (``filename``, LightGBM's text format) every ``frequency`` rounds and, with
    ``checkpoint_at_end``, with the last round's report; the other ranks report the metrics
    only. Load the model with :meth:`get_model`.

    :param metrics: the results to report: ``None`` (all), a name, a list of names, or a dict
        ``{reported key: "<dataset>-<metric>"}``. A name LightGBM did not compute raises
        ``KeyError`` listing those it did.
    :param filename: the model's file name in the checkpoint.
    :param frequency: checkpoint every this many rounds; ``0`` (the default): none during
        training.
    :param checkpoint_at_end: checkpoint with the last round's report.
    :param results_postprocessing_fn: ``fn(metrics) -> metrics`` applied before each report.
    """

    CHECKPOINT_NAME = LIGHTGBM_MODEL

    def __init__(
        self,
        metrics: Optional[Union[str, List[str], Dict[str, str]]] = None,
        filename: str = CHECKPOINT_NAME,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None,
    ):
        super().__init__(metrics=metrics, filename=filename, frequency=frequency, checkpoint_at_end=checkpoint_at_end,
                         results_postprocessing_fn=results_postprocessing_fn)

    @classmethod
    def get_model(cls, checkpoint: Any, filename: str = CHECKPOINT_NAME) -> Any:
        """The ``lightgbm.Booster`` saved in ``checkpoint`` by this callback.

        :raises ValueError: the checkpoint holds no LightGBM model under that name.
        """
        return super().get_model(checkpoint, filename)


def normalize_pandas_for_lightgbm(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its Arrow-backed numeric and boolean columns (``int64[pyarrow]``...) turned
    into pandas' nullable NumPy dtypes (``Int64``, ``UInt8``, ``Float32``, ``boolean``), which
    ``lightgbm.Dataset`` accepts; other columns are left as they are (no copy of them).

    Ray Data's ``to_pandas()`` keeps Arrow-backed dtypes for Arrow data, and LightGBM refuses
    them: call this on such a frame before building the ``Dataset``.
    """
    import pandas as pd
    import pyarrow as pa

    mapping: Dict[Any, str] = {}
    for column, dtype in df.dtypes.items():
        if not isinstance(dtype, pd.ArrowDtype):
            continue
        arrow = dtype.pyarrow_dtype
        if pa.types.is_boolean(arrow):
            mapping[column] = "boolean"
        elif pa.types.is_signed_integer(arrow):
            mapping[column] = f"Int{arrow.bit_width}"
        elif pa.types.is_unsigned_integer(arrow):
            mapping[column] = f"UInt{arrow.bit_width}"
        elif pa.types.is_floating(arrow):
            mapping[column] = f"Float{max(arrow.bit_width, 32)}"  # pandas has no Float16
    return df.astype(mapping) if mapping else df  # copy-on-write: the other columns are not copied
