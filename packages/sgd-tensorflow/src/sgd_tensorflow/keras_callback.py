"""``ReportCheckpointCallback``: Keras ``fit`` metrics (and weights) to sgd."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import tensorflow as tf

import sgd

_EVENTS = ("epoch_end", "train_batch_end")


def _plain(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


class ReportCheckpointCallback(tf.keras.callbacks.Callback):
    """A Keras callback that reports ``fit``'s metrics through :func:`sgd.report` and
    optionally saves the model weights with :func:`sgd.save_checkpoint`.

    Add it to ``model.fit(..., callbacks=[...])`` on every worker (sgd needs every
    worker to report and checkpoint the same number of times; under
    ``MultiWorkerMirroredStrategy`` they do).

    :param metrics: which of Keras' logs to report: ``None`` for all, a list of names,
        or a dict ``{reported name: Keras log name}``.
    :param report_on: ``"epoch_end"`` (one report per epoch, with ``epoch``, counted
        from 0 as Keras does) or ``"train_batch_end"`` (one per batch, with ``batch``).
    :param checkpoint_on: ``None`` (no checkpoints), ``"epoch_end"`` or
        ``"train_batch_end"``: save ``weights=model.get_weights()`` (a list of numpy
        arrays) and ``epoch`` (epochs completed) at that event, after the report.
    """

    def __init__(
        self,
        metrics: Optional[Union[List[str], Dict[str, str]]] = None,
        report_on: str = "epoch_end",
        checkpoint_on: Optional[str] = None,
    ):
        super().__init__()
        if report_on not in _EVENTS:
            raise ValueError(f"report_on must be one of {_EVENTS}, got {report_on!r}")
        if checkpoint_on is not None and checkpoint_on not in _EVENTS:
            raise ValueError(f"checkpoint_on must be None or one of {_EVENTS}, got {checkpoint_on!r}")
        self._metrics = metrics
        self._report_on = report_on
        self._checkpoint_on = checkpoint_on
        self._epoch = 0

    def _select(self, logs: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        logs = logs or {}
        if self._metrics is None:
            return {k: _plain(v) for k, v in logs.items()}
        names = self._metrics if isinstance(self._metrics, dict) else {m: m for m in self._metrics}
        missing = [log for log in names.values() if log not in logs]
        if missing:
            raise KeyError(f"ReportCheckpointCallback: metrics {missing} not in Keras logs {sorted(logs)}")
        return {name: _plain(logs[log]) for name, log in names.items()}

    def _handle(self, event: str, logs: Optional[Dict[str, Any]], extra: Dict[str, Any]) -> None:
        if event == self._report_on:
            sgd.report(**extra, **self._select(logs))
        if event == self._checkpoint_on:
            sgd.save_checkpoint(epoch=self._epoch, weights=self.model.get_weights())

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._handle("train_batch_end", logs, {"epoch": self._epoch, "batch": batch})

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._epoch = epoch + 1
        self._handle("epoch_end", logs, {"epoch": epoch})
