"""What the report callbacks of both frameworks share: choosing and naming the metrics."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

Metrics = Union[str, List[str], Dict[str, str], None]


def select(flat: Dict[str, float], metrics: Metrics) -> Dict[str, float]:
    """``flat`` (``"<dataset>-<metric>"`` -> value) narrowed and renamed as ``metrics`` says:
    ``None`` keeps all; a name or list of names keeps those; a dict maps report keys to names.

    :raises KeyError: a named metric was not computed (the message lists those that were).
    """
    if metrics is None:
        return dict(flat)
    wanted = {metrics: metrics} if isinstance(metrics, str) else (
        dict(metrics) if isinstance(metrics, dict) else {m: m for m in metrics})
    missing = [name for name in wanted.values() if name not in flat]
    if missing:
        raise KeyError(f"metrics {missing} were not computed; the evaluation gives: {sorted(flat)} "
                       "(named '<dataset>-<metric>', from evals=/valid_sets= and eval_metric)")
    return {key: flat[name] for key, name in wanted.items()}


def finish(metrics: Dict[str, Any], postprocess: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]]
           ) -> Dict[str, Any]:
    return postprocess(metrics) if postprocess is not None else metrics


def check_frequency(frequency: Any) -> int:
    if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 0:
        raise ValueError(f"frequency must be an int >= 0 (0: checkpoint only at the end), got {frequency!r}")
    return frequency
