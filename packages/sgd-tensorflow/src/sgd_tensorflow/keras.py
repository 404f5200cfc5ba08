"""``sgd_tensorflow.keras``: Ray Train 2.60's ``ray.train.tensorflow.keras`` under sgd.

``ReportCheckpointCallback`` with Ray 2.60's arguments and meaning: by default every epoch's
end reports Keras' logs *and a checkpoint of the model*. (``sgd_tensorflow.ReportCheckpointCallback``
is sgd's older callback, for ``Trainer.run`` code: it saves no checkpoint unless asked.)

Importing this module imports TensorFlow (the callback is a Keras callback), as Ray's does: on a
worker, ``TensorflowConfig`` has chosen Keras (``TF_USE_LEGACY_KERAS``) before that.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import tensorflow as tf

import sgd
from sgd_tensorflow.checkpoint import TensorflowCheckpoint

__all__ = ["ReportCheckpointCallback"]

#: The Keras events (``on_<event>``) the callback can report and checkpoint at.
EVENTS = ("epoch_begin", "epoch_end", "train_batch_begin", "train_batch_end", "test_batch_begin", "test_batch_end",
          "predict_batch_begin", "predict_batch_end", "train_begin", "train_end", "test_begin", "test_end",
          "predict_begin", "predict_end")


def _events(value: Union[str, List[str]], what: str) -> List[str]:
    events = [value] if isinstance(value, str) else list(value)
    unknown = [e for e in events if e not in EVENTS]
    if unknown:
        raise ValueError(f"ReportCheckpointCallback({what}=...): unknown Keras event(s) {unknown}; "
                         f"the events are {list(EVENTS)} (the Keras hook names without 'on_')")
    return events


def _plain(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


class ReportCheckpointCallback(tf.keras.callbacks.Callback):
    """Ray Train's Keras callback: put it in ``model.fit(..., callbacks=[...])`` on every worker.

    At each event of ``report_metrics_on`` every worker calls :func:`sgd.report` with Keras'
    logs; at each event of ``checkpoint_on`` the report also carries a checkpoint of the model
    (a :class:`~sgd_tensorflow.TensorflowCheckpoint` of its weights and architecture, from rank 0:
    under ``MultiWorkerMirroredStrategy`` every worker holds the same weights). An event in both
    lists makes one report, with the checkpoint. Load the model with
    ``TensorflowCheckpoint.from_checkpoint(result.checkpoint).get_model(build_model)`` (or
    ``get_model(trusted=True)`` to rebuild it from its stored architecture).

    :param checkpoint_on: the Keras event(s) to checkpoint at (``"epoch_end"``, the default:
        every epoch); a name or a list of names of :data:`EVENTS`.
    :param report_metrics_on: the event(s) to report at (``"epoch_end"``).
    :param metrics: the logs to report: ``None`` (all), a name, a list of names, or a dict
        ``{reported name: Keras log name}``. A name Keras did not log raises ``KeyError``
        listing those it did.
    :raises ValueError: an event is not one of :data:`EVENTS`.
    """

    def __init__(
        self,
        checkpoint_on: Union[str, List[str]] = "epoch_end",
        report_metrics_on: Union[str, List[str]] = "epoch_end",
        metrics: Optional[Union[str, List[str], Dict[str, str]]] = None,
    ):
        super().__init__()
        self._checkpoint_on = _events(checkpoint_on, "checkpoint_on")
        self._report_metrics_on = _events(report_metrics_on, "report_metrics_on")
        if metrics is not None and not isinstance(metrics, (str, list, dict)):
            raise TypeError(f"ReportCheckpointCallback(metrics=...) takes None, a name, a list of names or a dict, "
                            f"got {type(metrics).__name__}")
        self._metrics = metrics

    def _reported(self, logs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        logs = logs or {}
        if self._metrics is None:
            return {key: _plain(value) for key, value in logs.items()}
        wanted = ({self._metrics: self._metrics} if isinstance(self._metrics, str) else
                  dict(self._metrics) if isinstance(self._metrics, dict) else {m: m for m in self._metrics})
        missing = [name for name in wanted.values() if name not in logs]
        if missing:
            raise KeyError(f"ReportCheckpointCallback: metrics {missing} are not in Keras' logs {sorted(logs)}")
        return {key: _plain(logs[name]) for key, name in wanted.items()}

    def _handle(self, event: str, logs: Optional[Dict[str, Any]]) -> None:
        checkpoint = event in self._checkpoint_on
        if not checkpoint and event not in self._report_metrics_on:
            return
        metrics = self._reported(logs)
        if checkpoint and sgd.world_rank() == 0:
            sgd.report(metrics, checkpoint=TensorflowCheckpoint.from_model(self.model))
        else:
            sgd.report(metrics)

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("epoch_begin", logs)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("epoch_end", logs)

    def on_train_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("train_batch_begin", logs)

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("train_batch_end", logs)

    def on_test_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("test_batch_begin", logs)

    def on_test_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("test_batch_end", logs)

    def on_predict_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("predict_batch_begin", logs)

    def on_predict_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("predict_batch_end", logs)

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("train_begin", logs)

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("train_end", logs)

    def on_test_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("test_begin", logs)

    def on_test_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("test_end", logs)

    def on_predict_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("predict_begin", logs)

    def on_predict_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("predict_end", logs)
