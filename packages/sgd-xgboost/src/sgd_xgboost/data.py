"""Training data into XGBoost and LightGBM: a worker's Ray Data shard, a pandas DataFrame, NumPy.

``data`` may be anything :func:`sgd.get_dataset_shard` returns for a Ray Dataset (it is read
in batches, once per pass), a Ray Dataset, a ``pandas.DataFrame``, a 2-D NumPy array (the
label column is then a column index), a dict of equal-length columns, or an ``(X, y)`` pair
(then ``label_column`` is ``None``).

:func:`to_quantile_dmatrix` streams the batches into XGBoost's quantised matrix through an
``xgboost.DataIter``: the raw shard is never held in memory as a whole, only one batch of it
and the quantised result (XGBoost reads the batches twice: once to sketch the quantiles, which
the workers merge, once to fill the matrix). :func:`to_dmatrix` and :func:`to_lgb_dataset`
need the raw values and concatenate the batches once.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["to_dmatrix", "to_quantile_dmatrix", "to_lgb_dataset", "label_error", "columns_of"]

#: rows per batch read from a Ray Data shard
DEFAULT_BATCH_SIZE = 65536

Label = Union[str, int, None]


def label_error(label_column: Any, columns: Sequence[Any], where: str = "the dataset") -> ValueError:
    """The error for a label column that is not there, naming the columns that are."""
    shown = ", ".join(map(repr, list(columns)[:50])) + (" ..." if len(columns) > 50 else "")
    return ValueError(f"label column {label_column!r} is not in {where}; its columns are: {shown or '(none)'}")


def columns_of(data: Any) -> Optional[List[Any]]:
    """The column names of ``data`` without reading it, where they can be known."""
    import pandas as pd

    if isinstance(data, pd.DataFrame):
        return list(data.columns)
    if isinstance(data, dict):
        return list(data)
    if isinstance(data, np.ndarray) and data.ndim == 2:
        return list(range(data.shape[1]))
    schema = getattr(data, "schema", None)
    if callable(schema):
        try:
            names = schema().names
        except Exception:  # a shard whose schema needs a pass: find out while reading
            return None
        return list(names) if names is not None else None
    return None


def _frames(data: Any, batch_size: Optional[int]) -> Callable[[], Iterator[Any]]:
    """A function that starts one pass over ``data`` as pandas DataFrames (or ``(X, y)`` pairs)."""
    import pandas as pd

    if isinstance(data, tuple) and len(data) == 2:
        return lambda: iter([data])
    if isinstance(data, pd.DataFrame):
        return lambda: iter([data])
    if isinstance(data, np.ndarray):
        if data.ndim != 2:
            raise ValueError(f"a NumPy array of training data must be 2-D (rows, columns), got shape {data.shape}")
        return lambda: iter([pd.DataFrame(data)])
    if isinstance(data, dict):
        return lambda: iter([pd.DataFrame(data)])
    if hasattr(data, "iter_batches"):
        return lambda: iter(data.iter_batches(batch_format="pandas", batch_size=batch_size))
    raise TypeError(
        f"cannot read training data of type {type(data).__name__}: pass a Ray Dataset or shard "
        "(sgd.get_dataset_shard(name)), a pandas DataFrame, a 2-D NumPy array, a dict of columns or an (X, y) pair"
    )


def _split(batch: Any, label_column: Label, feature_columns: Optional[Sequence[Any]], where: str
           ) -> Tuple[Any, Any]:
    if isinstance(batch, tuple):
        if label_column is not None:
            raise ValueError(f"{where} is an (X, y) pair: its labels are y, so pass label_column=None")
        return batch
    if label_column is None:
        x, y = batch, None
    else:
        if label_column not in batch.columns:
            raise label_error(label_column, list(batch.columns), where)
        y = batch[label_column]
        x = batch.drop(columns=[label_column])
    if feature_columns is not None:
        missing = [c for c in feature_columns if c not in x.columns]
        if missing:
            raise ValueError(f"feature columns {missing} are not in {where}; its columns are: {list(batch.columns)}")
        x = x[list(feature_columns)]
    return x, y


def numpy_dtypes(frame: Any) -> Any:
    """``frame`` with its Arrow-backed numeric columns (what Ray Data's pandas batches hold)
    as NumPy ones, which LightGBM requires; other columns unchanged."""
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        return frame
    arrow = [c for c, t in frame.dtypes.items() if isinstance(t, pd.ArrowDtype)]
    if not arrow:
        return frame
    converted = {}
    for column in arrow:
        kind = frame[column].dtype.numpy_dtype.kind
        if kind in "fiub":
            has_nulls = bool(frame[column].isna().any())
            dtype = np.float64 if has_nulls and kind in "iub" else frame[column].dtype.numpy_dtype
            converted[column] = frame[column].to_numpy(dtype=dtype, na_value=np.nan if has_nulls else None)
    return frame.assign(**converted) if converted else frame


def _concat(data: Any, label_column: Label, feature_columns: Optional[Sequence[Any]], batch_size: Optional[int],
            where: str) -> Tuple[Any, Any]:
    import pandas as pd

    xs, ys = [], []
    for batch in _frames(data, batch_size)():
        x, y = _split(numpy_dtypes(batch), label_column, feature_columns, where)
        xs.append(x)
        ys.append(y)
    if not xs:
        return _empty(data, label_column, feature_columns, where)
    if len(xs) == 1:
        return xs[0], ys[0]
    x = pd.concat(xs, ignore_index=True) if isinstance(xs[0], pd.DataFrame) else np.concatenate(xs)
    if ys[0] is None:
        return x, None
    y = pd.concat(ys, ignore_index=True) if isinstance(ys[0], pd.Series) else np.concatenate(ys)
    return x, y


def _empty(data: Any, label_column: Label, feature_columns: Optional[Sequence[Any]], where: str) -> Tuple[Any, Any]:
    """A shard with no rows (more workers than blocks): an empty frame of the dataset's columns,
    so that this worker still takes part in the collective calls."""
    import pandas as pd

    columns = columns_of(data)
    if columns is None:
        raise ValueError(f"{where} has no rows on worker rank {_rank()} and its columns cannot be known; "
                         "give every worker data (fewer workers, or repartition the dataset)")
    frame = pd.DataFrame({c: np.zeros(0, dtype=np.float32) for c in columns})
    return _split(frame, label_column, feature_columns, where)


def _rank() -> int:
    import warnings

    import sgd

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sgd.world_rank()


def to_dmatrix(data: Any, label_column: Label = None, *, feature_columns: Optional[Sequence[Any]] = None,
               batch_size: Optional[int] = DEFAULT_BATCH_SIZE, where: str = "the dataset", **dmatrix_kwargs: Any
               ) -> Any:
    """An ``xgboost.DMatrix`` of ``data`` (for ``tree_method="exact"`` or ``"approx"``, or
    anything that needs the raw values). ``dmatrix_kwargs`` go to ``xgboost.DMatrix``.

    :raises ValueError: ``label_column`` is not a column of ``data`` (the message lists them).
    """
    import xgboost

    x, y = _concat(data, label_column, feature_columns, batch_size, where)
    return xgboost.DMatrix(x, label=y, **dmatrix_kwargs)


def to_quantile_dmatrix(data: Any, label_column: Label = None, *, ref: Any = None,
                        feature_columns: Optional[Sequence[Any]] = None,
                        batch_size: Optional[int] = DEFAULT_BATCH_SIZE, where: str = "the dataset",
                        **kwargs: Any) -> Any:
    """An ``xgboost.QuantileDMatrix`` of ``data`` (``tree_method="hist"``, XGBoost's default),
    streamed batch by batch. Call it on every worker at the same time inside a run of the
    ``"xgboost"`` backend: the workers merge their quantile sketches. Pass ``ref=`` the training
    matrix for an evaluation set. ``kwargs`` go to ``xgboost.QuantileDMatrix`` (``max_bin``...).

    :raises ValueError: ``label_column`` is not a column of ``data`` (the message lists them).
    """
    import pandas as pd
    import xgboost

    if isinstance(data, (pd.DataFrame, np.ndarray, dict, tuple)):  # in memory already: no iterator
        x, y = _concat(data, label_column, feature_columns, batch_size, where)
        return xgboost.QuantileDMatrix(x, label=y, ref=ref, **kwargs)
    batches = _BatchIter(_frames(data, batch_size), label_column, feature_columns, where, data)
    return xgboost.QuantileDMatrix(batches, ref=ref, **kwargs)


def _make_batch_iter_class() -> type:
    import xgboost

    class BatchIter(xgboost.DataIter):
        """Hands XGBoost one batch of a shard at a time; XGBoost calls ``reset`` between passes."""

        def __init__(self, start: Callable[[], Iterator[Any]], label_column: Label,
                     feature_columns: Optional[Sequence[Any]], where: str, data: Any):
            super().__init__(release_data=True)
            self._start = start
            self._label = label_column
            self._features = feature_columns
            self._where = where
            self._data = data
            self._it: Optional[Iterator[Any]] = None
            self._seen = 0

        def reset(self) -> None:
            self._it = None

        def next(self, input_data: Callable[..., None]) -> bool:
            first = self._it is None
            if first:
                self._it = self._start()
                self._seen = 0
            assert self._it is not None
            try:
                batch = next(self._it)
            except StopIteration:
                if self._seen == 0:  # an empty shard: one empty batch keeps the columns right
                    self._seen = 1
                    x, y = _empty(self._data, self._label, self._features, self._where)
                    input_data(data=x, label=y)
                    return True
                return False
            self._seen += 1
            x, y = _split(batch, self._label, self._features, self._where)
            input_data(data=x, label=y)
            return True

    return BatchIter


_BATCH_ITER: Optional[type] = None


def _BatchIter(*args: Any) -> Any:
    global _BATCH_ITER
    if _BATCH_ITER is None:  # xgboost is imported on first use only
        _BATCH_ITER = _make_batch_iter_class()
    return _BATCH_ITER(*args)


def to_lgb_dataset(data: Any, label_column: Label = None, *, reference: Any = None,
                   feature_columns: Optional[Sequence[Any]] = None, params: Optional[Dict[str, Any]] = None,
                   batch_size: Optional[int] = DEFAULT_BATCH_SIZE, where: str = "the dataset",
                   **dataset_kwargs: Any) -> Any:
    """A ``lightgbm.Dataset`` of ``data``; ``reference=`` the training set for a validation set.
    ``params`` and ``dataset_kwargs`` go to ``lightgbm.Dataset``. The raw values are freed once
    LightGBM has binned them.

    :raises ValueError: ``label_column`` is not a column of ``data`` (the message lists them).
    """
    import lightgbm

    x, y = _concat(data, label_column, feature_columns, batch_size, where)
    return lightgbm.Dataset(x, label=y, reference=reference, params=params, free_raw_data=True, **dataset_kwargs)
