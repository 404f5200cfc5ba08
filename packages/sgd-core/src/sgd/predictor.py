"""Prediction from a checkpoint, as Ray AIR had it: a ``Predictor`` per framework
(``sgd_torch.TorchPredictor``, ``sgd_tensorflow.TensorflowPredictor``) and a
:class:`BatchPredictor` that scores a Ray Dataset.

Ray later replaced ``BatchPredictor`` with ``Dataset.map_batches`` over a class that loads the
model once per actor; both work here: ``BatchPredictor.predict`` *is* that ``map_batches`` call
(:class:`ScoringWrapper` is the class), and a loop of your own over ``map_batches`` with a
``Predictor`` inside works the same (docs/air.md shows both).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

from sgd.checkpoint import Checkpoint

__all__ = ["Predictor", "BatchPredictor", "ScoringWrapper"]


class Predictor:
    """Base of the framework predictors: the model and the checkpoint's preprocessor.

    ``predict(data)`` takes a pandas ``DataFrame`` (the result: a ``DataFrame`` with a
    ``"predictions"`` column, one row per output row), a numpy array (a numpy array) or a dict
    of numpy arrays (a dict ``{"predictions": array}``); the preprocessor, if any, transforms
    the batch first (``transform_batch``). As in Ray AIR, the model gets a ``DataFrame`` of one
    column as that column's array (a column of scalars: shape ``(rows,)``; a tensor column: the
    tensors stacked) and a ``DataFrame`` of several columns as a dict of arrays by column name
    (combine columns into one with ``ray.data.preprocessors.Concatenator``).
    """

    def __init__(self, preprocessor: Any = None):
        self._preprocessor = preprocessor

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, *args: Any, **kwargs: Any) -> Predictor:
        """A predictor of the model in ``checkpoint`` (each framework's own arguments)."""
        raise NotImplementedError

    def get_preprocessor(self) -> Any:
        return self._preprocessor

    def set_preprocessor(self, preprocessor: Any) -> None:
        self._preprocessor = preprocessor

    def predict(self, data: Any, **kwargs: Any) -> Any:
        """Predictions for ``data`` (see the class)."""
        import numpy as np

        try:
            import pandas as pd
        except ImportError:  # pragma: no cover - pandas ships with Ray Data
            pd = None
        if pd is not None and isinstance(data, pd.DataFrame):
            if self._preprocessor is not None:
                data = self._preprocessor.transform_batch(data)
            out = np.asarray(self._predict_numpy(_frame_to_arrays(data), **kwargs))
            return pd.DataFrame({"predictions": _rows(out)})
        if isinstance(data, dict):
            arrays = {k: np.asarray(v) for k, v in data.items()}
            if self._preprocessor is not None:
                arrays = self._preprocessor.transform_batch(arrays)
            single = next(iter(arrays.values())) if len(arrays) == 1 else arrays
            return {"predictions": np.asarray(self._predict_numpy(single, **kwargs))}
        if isinstance(data, np.ndarray):
            return np.asarray(self._predict_numpy(data, **kwargs))
        raise TypeError(f"{type(self).__name__}.predict takes a pandas DataFrame, a numpy array or a dict of arrays, "
                        f"got {type(data).__name__}")

    def _predict_numpy(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def _frame_to_arrays(frame: Any) -> Any:
    """A DataFrame as the model's input, Ray AIR's way: one column as its array (tensors
    stacked), several as a dict of arrays by column name."""
    import numpy as np

    arrays = {}
    for name in frame.columns:
        # Column by column: Ray Data's pyarrow-backed columns each convert to their own dtype.
        column = frame[name].to_numpy()
        if column.dtype == object and len(column) and isinstance(column[0], (np.ndarray, list)):
            column = np.stack([np.asarray(v) for v in column])
        arrays[str(name)] = column
    if len(arrays) == 1:
        return next(iter(arrays.values()))
    return arrays


def _rows(out: Any) -> List[Any]:
    if out.ndim == 2 and out.shape[1] == 1:
        return list(out[:, 0])
    return list(out)


class ScoringWrapper:
    """The class ``map_batches`` runs in each scoring actor: the predictor is made once per
    actor (``predictor_cls.from_checkpoint``), then every batch is scored."""

    def __init__(self, checkpoint: Checkpoint, predictor_cls: Type[Predictor], predictor_kwargs: Dict[str, Any],
                 predict_kwargs: Dict[str, Any], feature_columns: Optional[Sequence[str]],
                 keep_columns: Optional[Sequence[str]]):
        self.predictor = predictor_cls.from_checkpoint(checkpoint, **predictor_kwargs)
        self.predict_kwargs = predict_kwargs
        self.feature_columns = list(feature_columns) if feature_columns else None
        self.keep_columns = list(keep_columns or [])

    def __call__(self, batch: Any) -> Any:
        features = batch[self.feature_columns] if self.feature_columns else batch
        out = self.predictor.predict(features, **self.predict_kwargs)
        for column in self.keep_columns:
            out[column] = batch[column].to_numpy()
        return out


class BatchPredictor:
    """Scores a Ray Dataset with a framework predictor made from a checkpoint (Ray AIR's
    ``BatchPredictor``): ``BatchPredictor.from_checkpoint(result.checkpoint, TorchPredictor).predict(ds)``.

    :param checkpoint: the checkpoint (a directory one must be readable where the scoring
        actors run: one machine, or a shared filesystem).
    :param predictor_cls: ``TorchPredictor``, ``TensorflowPredictor`` or any :class:`Predictor`.
    :param predictor_kwargs: passed to ``predictor_cls.from_checkpoint`` (``model=...``).
    """

    def __init__(self, checkpoint: Checkpoint, predictor_cls: Type[Predictor], **predictor_kwargs: Any):
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"BatchPredictor takes an sgd.Checkpoint, got {type(checkpoint).__name__}")
        if not (isinstance(predictor_cls, type) and issubclass(predictor_cls, Predictor)):
            raise TypeError(f"predictor_cls must be a Predictor class (TorchPredictor...), got {predictor_cls!r}")
        # Made once here, so a wrong checkpoint (another framework, a state dict without a
        # model) fails now with the predictor's own error, not inside the scoring actors.
        predictor_cls.from_checkpoint(checkpoint, **predictor_kwargs)
        self.checkpoint = checkpoint
        self.predictor_cls = predictor_cls
        self.predictor_kwargs = predictor_kwargs

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, predictor_cls: Type[Predictor],
                        **predictor_kwargs: Any) -> BatchPredictor:
        return cls(checkpoint, predictor_cls, **predictor_kwargs)

    def get_preprocessor(self) -> Any:
        return self.checkpoint.get_preprocessor()

    def predict(self, data: Any, *, feature_columns: Optional[Sequence[str]] = None,
                keep_columns: Optional[Sequence[str]] = None, batch_size: int = 4096, min_scoring_workers: int = 1,
                max_scoring_workers: Optional[int] = None, num_cpus_per_worker: Optional[float] = None,
                num_gpus_per_worker: Optional[float] = None, ray_remote_args: Optional[Dict[str, Any]] = None,
                **predict_kwargs: Any) -> Any:
        """The predictions, a Ray Dataset (lazy): one ``"predictions"`` column, plus ``keep_columns``.

        :raises TypeError: ``data`` is not a Ray Dataset.
        :raises ValueError: ``data`` has no rows, or names columns it does not have.
        """
        if not (hasattr(data, "map_batches") and hasattr(data, "schema")):
            raise TypeError(f"BatchPredictor.predict takes a Ray Dataset, got {type(data).__name__}")
        if data.limit(1).count() == 0:
            raise ValueError("BatchPredictor.predict: the dataset has no rows to predict on")
        names = list(data.schema().names)
        wanted = [*(feature_columns or []), *(keep_columns or [])]
        missing = [c for c in wanted if c not in names]
        if missing:
            raise ValueError(f"BatchPredictor.predict: the dataset has no column {', '.join(map(repr, missing))} "
                             f"(columns: {', '.join(names)})")
        if min_scoring_workers < 1 or (max_scoring_workers is not None and max_scoring_workers < min_scoring_workers):
            raise ValueError("min_scoring_workers must be >= 1 and max_scoring_workers >= min_scoring_workers")
        concurrency: Tuple[int, int] = (min_scoring_workers, max_scoring_workers or max(min_scoring_workers, 2))
        remote = dict(ray_remote_args or {})
        if num_cpus_per_worker is not None:
            remote["num_cpus"] = num_cpus_per_worker
        if num_gpus_per_worker is not None:
            remote["num_gpus"] = num_gpus_per_worker
        return data.map_batches(
            ScoringWrapper, batch_format="pandas", batch_size=batch_size, concurrency=concurrency,
            fn_constructor_kwargs={"checkpoint": self.checkpoint, "predictor_cls": self.predictor_cls,
                                   "predictor_kwargs": self.predictor_kwargs, "predict_kwargs": predict_kwargs,
                                   "feature_columns": feature_columns, "keep_columns": keep_columns},
            **remote)
