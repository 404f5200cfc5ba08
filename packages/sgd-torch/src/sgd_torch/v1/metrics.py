"""Metrics of a pass: per-batch averages on a worker, v1's reduction over workers."""

from __future__ import annotations

import numbers
from typing import Any, Dict, List, Optional

import torch

NUM_SAMPLES = "num_samples"
BATCH_COUNT = "batch_count"


class Meters:
    """Sample-weighted averages of per-batch metrics, and each metric's last value."""

    def __init__(self) -> None:
        self._sums: Dict[str, float] = {}
        self._counts: Dict[str, int] = {}
        self._last: Dict[str, Any] = {}
        self.batch_count = 0
        self.num_samples = 0

    def update(self, metrics: Optional[Dict[str, Any]]) -> None:
        metrics = dict(metrics or {})
        n = int(metrics.pop(NUM_SAMPLES, 1))
        self.batch_count += 1
        self.num_samples += n
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            self._last[key] = value
            if isinstance(value, numbers.Number) and not isinstance(value, bool):
                self._sums[key] = self._sums.get(key, 0.0) + float(value) * n  # type: ignore[arg-type]
                self._counts[key] = self._counts.get(key, 0) + n

    def summary(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {BATCH_COUNT: self.batch_count, NUM_SAMPLES: self.num_samples}
        for key, last in self._last.items():
            if key in self._sums:
                out[key] = self._sums[key] / max(self._counts[key], 1)
                out[f"last_{key}"] = last
            else:
                out[key] = last
        return out


def reduce_stats(worker_stats: List[Dict[str, Any]]) -> Dict[str, Any]:
    """v1's reduction of per-worker metrics: ``num_samples`` summed, other numbers averaged
    (kept as they are when every worker has the same value, as ``epoch``), anything else
    taken from rank 0."""
    stats = [s for s in worker_stats if s]
    if not stats:
        return {}
    keys: List[str] = []
    for s in stats:
        keys.extend(k for k in s if k not in keys)
    out: Dict[str, Any] = {}
    for key in keys:
        values = [s[key] for s in stats if key in s]
        numeric = all(isinstance(v, numbers.Number) and not isinstance(v, bool) for v in values)
        if key == NUM_SAMPLES and numeric:
            out[key] = sum(values)
        elif numeric and all(v == values[0] for v in values):
            out[key] = values[0]
        elif numeric:
            out[key] = float(sum(values)) / len(values)
        else:
            out[key] = values[0]
    return out
