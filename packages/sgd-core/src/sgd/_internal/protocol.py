"""The wire protocol between a worker's session and the driver, in one place.

A worker buffers *items* ``(kind, data)``; the driver polls them in batches
(:meth:`sgd._internal.session.Session.poll`) and :class:`~sgd._internal.rounds.RoundCollector`
lines them up into *rounds* (one item per worker). :func:`decode_round` turns a round's raw
items into a :class:`Round`: what the rest of the driver sees.

Item kinds:

- ``REPORT``: a metrics dict (``sgd.report``). It may carry the checkpoint passed with it
  under :data:`CHECKPOINT_KEY` (``sgd.report(m, checkpoint=c)``); decoding takes it out.
- ``CHECKPOINT``: ``sgd.save_checkpoint`` state. Rank 0's is the state (encoded by the
  backend), a :class:`DirectCheckpoint` or a :class:`DirectoryFiles`; other ranks send
  ``None`` so the driver can check that every rank took part.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

REPORT = "report"
CHECKPOINT = "checkpoint"

#: Key of a report dict that carries the checkpoint passed with it; removed by :func:`decode_round`.
CHECKPOINT_KEY = "_sgd_checkpoint"

#: Autofilled keys every report carries on the wire and in ``results.jsonl``; the driver hands
#: them to callbacks and iterators only while :func:`detailed_metrics_enabled` is true.
DETAILED_AUTOFILLED_KEYS = ("_date", "_time_total_s", "_pid", "_hostname", "_node_ip")

#: The switch, under sgd's name and Ray Train 1.x's.
DETAILED_SWITCHES = ("SGD_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS", "TRAIN_RESULT_ENABLE_DETAILED_AUTOFILLED_METRICS")


def detailed_metrics_enabled() -> bool:
    """Whether the driver's environment asks for the detailed autofilled metrics, now (read at
    every round, so setting it after ``trainer.start()`` works, as in Ray Train)."""
    return any(os.environ.get(name) == "1" for name in DETAILED_SWITCHES)


def strip_detailed(results: List[Dict[str, Any]]) -> None:
    """Remove :data:`DETAILED_AUTOFILLED_KEYS` from each result, in place."""
    for result in results:
        if isinstance(result, dict):
            for key in DETAILED_AUTOFILLED_KEYS:
                result.pop(key, None)


@dataclass
class RemoteError:
    """A user exception captured on a worker, shipped to the driver."""

    exc_bytes: Optional[bytes]
    type_name: str
    message: str
    traceback: str
    world_rank: int
    pid: int
    hostname: str


class DirectCheckpoint:
    """A checkpoint rank 0 wrote itself into the driver's checkpoint folder (same node):
    only its temporary path and score travel; the driver finalises and renames it."""

    __slots__ = ("path", "score_values")

    def __init__(self, path: str, score_values: Dict[str, Any]):
        self.path = path
        self.score_values = score_values


class DirectoryFiles:
    """A directory checkpoint's files, sent to the driver (a worker not on the driver's node)."""

    __slots__ = ("files",)

    def __init__(self, files: Dict[str, bytes]):
        self.files = files


@dataclass
class DirectWrite:
    """Where and how rank 0 writes checkpoints itself (see :class:`DirectCheckpoint`)."""

    directory: str
    codec: str
    score_attribute: str


@dataclass
class Round:
    """One decoded round: every worker's item at the same position.

    :ivar kind: ``REPORT`` or ``CHECKPOINT``.
    :ivar results: for a report round, one metrics dict per worker (the checkpoint key
        removed); for a checkpoint round, the raw per-worker payloads.
    :ivar checkpoints: for a report round, the checkpoint each worker passed with its
        report (``None`` where it passed none).
    """

    kind: str
    results: List[Any]
    checkpoints: List[Any] = field(default_factory=list)

    @property
    def is_checkpoint(self) -> bool:
        return self.kind == CHECKPOINT

    @property
    def iteration(self) -> int:
        """``_training_iteration`` of a report round (0 for a checkpoint round)."""
        if self.kind != REPORT or not self.results:
            return 0
        return int(self.results[0].get("_training_iteration", 0))

    @property
    def has_reported_checkpoint(self) -> bool:
        return any(c is not None for c in self.checkpoints)

    @property
    def saved_state(self) -> Any:
        """Rank 0's payload of a checkpoint round."""
        return self.results[0]


def decode_round(kind: str, data: List[Any]) -> Round:
    """Decode one round of raw items (all of ``kind``) into a :class:`Round`."""
    if kind == CHECKPOINT:
        return Round(kind, data)
    checkpoints = [d.pop(CHECKPOINT_KEY, None) for d in data]
    return Round(kind, data, checkpoints)
