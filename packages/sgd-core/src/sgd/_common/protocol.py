"""The wire protocol between a worker's session and the driver, in one place.

A worker buffers *items* ``(kind, data)``; the driver polls them in batches
(:meth:`sgd._worker.session.Session.poll`) and :class:`~sgd.group.rounds.RoundCollector`
lines them up into *rounds* (one item per worker). :func:`decode_round` turns a round's raw
items into a :class:`Round`: what the rest of the driver sees.

Item kinds:

- ``REPORT``: a metrics dict (``sgd.report``). Once polled, it carries its ``results.jsonl``
  text (encoded by the worker's poll, in a loop over the batch: the driver writes a round by
  joining N strings, with no per-value work). A plain report travels as the three-item
  ``(REPORT, metrics, text)``, the metrics dict holding the user's values and sgd's three
  per-report fields only, so that the driver lines a round up without touching a dict
  (:func:`decode_items`). A report that carries the checkpoint passed with it keeps the
  two-item form: the checkpoint under :data:`CHECKPOINT_KEY` (``sgd.report(m, checkpoint=c)``),
  the detailed autofilled values as one dict under :data:`DETAIL_KEY`, its text under
  :data:`LINE_KEY`. A plain report leaves the detailed values in its text only (the driver reads
  them back from it when asked: :meth:`Round.detail`). Decoding takes the three keys out.
- ``CHECKPOINT``: ``sgd.save_checkpoint``. Rank 0 sends the :class:`WrittenCheckpoint` it wrote
  its state into; other ranks send ``None`` so the driver can check that every rank took part.
- ``NOTE``: what the backend's run-end hooks said on the worker (:func:`sgd.backend.on_worker_run_end`),
  with the reply that ends a run that returned; taken out by the collector, like ``LOG``.
- ``ELASTIC``: a run of ``sgd.elastic`` at the reset barrier, or announcing that it recovers in
  place (``sgd._worker.resets``); taken out by the collector (``sgd.group.resets``).
- ``LOG``: what a worker on another host than the driver's printed since its last poll
  (``(rank, bytes)``, for ``run_dir/logs/rank_N.log``); at most one, always the batch's last
  item, taken out by the collector before rounds are lined up (:mod:`sgd._worker.rank_logs`).

A checkpoint passed with a report (under :data:`CHECKPOINT_KEY`) is a :class:`WrittenCheckpoint`
too: whatever the checkpoint (a dict, a directory, a shard), only a path and scores travel.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from sgd._common.json_values import finite, json_default
from sgd.redact import are_clean_flat, is_clean_flat, redact

REPORT = "report"
CHECKPOINT = "checkpoint"
LOG = "log"
NOTE = "note"
ELASTIC = "elastic"

#: Key of a report dict that carries the checkpoint passed with it; removed by :func:`decode_round`.
CHECKPOINT_KEY = "_sgd_checkpoint"

#: Autofilled keys every report carries on the wire and in ``results.jsonl``; the driver hands
#: them to callbacks and iterators only while :func:`detailed_metrics_enabled` is true.
DETAILED_AUTOFILLED_KEYS = ("_date", "_time_total_s", "_pid", "_hostname", "_node_ip")

#: Key of a report that holds :data:`DETAILED_AUTOFILLED_KEYS` as one dict (so that leaving them
#: out costs one ``pop`` per report, not five); on the wire only with a checkpoint.
DETAIL_KEY = "_sgd_detail"

#: Key of a polled report that holds its ``results.jsonl`` text (see :func:`encode_line`).
LINE_KEY = "_sgd_line"

_WIRE_KEYS = (CHECKPOINT_KEY, DETAIL_KEY, LINE_KEY)

#: Keys sgd adds to every report of a worker (besides what the worker reported): the ones
#: always handed on, the detailed ones and the wire's.
AUTOFILLED_KEYS = ("_training_iteration", "_timestamp", "_time_this_iter_s")
_STAMPED = frozenset((*AUTOFILLED_KEYS, *DETAILED_AUTOFILLED_KEYS, *_WIRE_KEYS))


def reported_only(row: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of ``row`` with only what the worker reported: without :data:`AUTOFILLED_KEYS`,
    :data:`DETAILED_AUTOFILLED_KEYS` and the wire's keys (what Ray 2.60's ``Result.metrics`` and
    ``ReportedCheckpoint.metrics`` hold)."""
    return {k: v for k, v in row.items() if k not in _STAMPED}

#: One item as it travels: ``(kind, data)``, or ``(REPORT, metrics, text)`` for a plain report.
Item = Tuple[Any, ...]

#: Every report in every worker goes through one encoder (``json.dumps`` with options builds a
#: new one per call: a third of the cost of a small report).
_STRICT_JSON = json.JSONEncoder(default=json_default, allow_nan=False)
#: Its C core, called directly for the common report (flat, plain values): the Python layers of
#: ``JSONEncoder.encode`` are a third of that report's cost. No circularity check: a flat row of
#: plain values cannot hold a cycle.
_FLAT_JSON = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, json_default, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, False,
) if getattr(json.encoder, "c_make_encoder", None) is not None else None


def encode_line(data: Dict[str, Any]) -> str:
    """One report as ``results.jsonl`` keeps it: JSON, secrets dropped (:mod:`sgd.redact`), the
    detailed values in, the checkpoint out; non-finite floats spelled as strings, other values
    as :func:`~sgd._common.json_values.json_default` makes them. Never raises."""
    row = {k: v for k, v in data.items() if k not in _WIRE_KEYS}
    detail = data.get(DETAIL_KEY)
    if detail:
        row.update(detail)
    if _FLAT_JSON is not None and is_clean_flat(row):
        try:
            return "".join(_FLAT_JSON(row, 0))
        except (ValueError, TypeError):  # a float that is not finite, a key JSON cannot hold: below
            pass
    row = redact(row)
    try:
        return _STRICT_JSON.encode(row)
    except ValueError:
        pass
    except TypeError:  # keys JSON cannot hold (tuples...): those entries are left out
        return json.dumps(finite(row), default=json_default, skipkeys=True)
    return json.dumps(finite(row), default=json_default)


#: Between two rows of one encoder call over several flat rows: ``}, {"`` occurs nowhere inside a
#: row of plain values (a ``"`` inside a JSON string is always escaped), so it splits them exactly.
_ROW_BREAK = '}, {"'


def encode_heads(rows: List[Dict[str, Any]]) -> Optional[List[str]]:
    """What :func:`encode_line` makes of each of ``rows`` (reports with none of the wire keys),
    each without its closing brace, so that more values can be joined on as text; from one
    encoder call for all of them (per row, the call costs as much as the encoding). ``None``
    unless every row is the common report: not empty, no key that names a secret, only plain
    values, floats JSON can hold. Never raises."""
    if _FLAT_JSON is None or not rows or not all(rows) or not are_clean_flat(rows):
        return None
    try:
        text = "".join(_FLAT_JSON(rows, 0))
    except (ValueError, TypeError):  # a float that is not finite, a key JSON cannot hold
        return None
    pieces = text[3:-2].split(_ROW_BREAK)  # the list's '[{"' and '}]' off
    if len(pieces) != len(rows):
        return None
    return ['{"' + piece for piece in pieces]


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
    """A user exception captured on a worker, shipped to the driver.

    ``peer_failure``: the exception is a :class:`sgd.errors.PeerFailureError` (decided on the
    worker, so the driver need not unpickle it to know).
    """

    exc_bytes: Optional[bytes]
    type_name: str
    message: str
    traceback: str
    world_rank: int
    pid: int
    hostname: str
    peer_failure: bool = False


class WrittenCheckpoint:
    """The one thing that travels to the driver for a checkpoint: the temporary folder in the
    run's checkpoint folder (on the driver's disk) that a worker wrote it into, directly or
    through the run's file server (:mod:`sgd.storage.staging`), and what the strategy scores
    it by. The driver checks the path, numbers the folder and renames it into place
    (:meth:`sgd.storage.manager.CheckpointManager.register`). ``pending``: the write goes on in
    the background (an asynchronous save); the driver commits it once sgd's metadata file
    appears in it, which the workers write last. ``name``: the folder name it is committed
    under (``sgd.report(checkpoint_dir_name=...)``; ``None``: ``checkpoint_NNNNNN``);
    ``validation``: the report's ``validation=`` (``False``: none)."""

    __slots__ = ("path", "score_values", "pending", "name", "validation")

    def __init__(self, path: str, score_values: Optional[Dict[str, Any]] = None, pending: bool = False,
                 name: Optional[str] = None, validation: Any = False):
        self.path = path
        self.score_values = dict(score_values or {})
        self.pending = pending
        self.name = name
        self.validation = validation

    def __repr__(self) -> str:
        return f"WrittenCheckpoint({self.path!r}{', pending' if self.pending else ''})"


@dataclass
class CheckpointTarget:
    """Where a run's workers write their checkpoints (every worker gets it): the run's checkpoint
    folder as the driver sees it, the codec of dict checkpoints, the attribute scored, and
    whether a write must reach the disk before it is reported (``durable``: fsynced). A run that
    keeps no checkpoint (``num_to_keep=0``) reads each one back at once and deletes it, so its
    writes skip the fsyncs."""

    directory: str
    codec: str
    score_attribute: str
    durable: bool = True


@dataclass
class StartRequest:
    """What a run's start call tells a worker besides its dataset shard and the run information:
    the same for every worker with as many preloads pending (``sgd.group.starts`` pickles each
    form once and every call carries the bytes).

    :ivar user_code: ``(train_func, encode, checkpoint)``, or its pickle (bytes) while
        ``preloads`` preloads are pending on the worker (unpickled once they finished).
    :ivar first_poll: answer the run's first poll with the start call too: up to that many items,
        what the run made within ``first_wait_s``, and its end if it comes within
        ``first_linger_s`` after them (``0``: the call returns ``None`` once the run started).
    """

    user_code: Any
    preloads: int = 0
    max_pending: int = 1024
    start_iteration: int = 0
    checkpoint_target: Optional[CheckpointTarget] = None
    reforms: bool = False  # the backend can re-form the group in place (sgd.elastic)
    first_poll: int = 0
    first_wait_s: float = 0.0
    first_linger_s: float = 0.0


@dataclass
class Round:
    """One decoded round: every worker's item at the same position.

    :ivar kind: ``REPORT`` or ``CHECKPOINT``.
    :ivar results: for a report round, one metrics dict per worker (the checkpoint key
        removed); for a checkpoint round, the per-worker payloads (rank 0's a
        :class:`WrittenCheckpoint`, the others ``None``).
    :ivar checkpoints: for a report round, the :class:`WrittenCheckpoint` each worker passed
        with its report (``None`` where it passed none).
    :ivar lines: for a report round, each report's ``results.jsonl`` text (``None`` where
        the worker sent none: :meth:`json_line` encodes those on the driver).
    :ivar details: for a report round, each report's detailed autofilled values as they travelled
        (only with a checkpoint; ``None`` where they are read back from the report's line).
    """

    kind: str
    results: List[Any]
    checkpoints: List[Any] = field(default_factory=list)
    lines: List[Optional[str]] = field(default_factory=list)
    details: List[Optional[Dict[str, Any]]] = field(default_factory=list)

    def json_line(self) -> str:
        """The round as one ``results.jsonl`` line (a JSON list, one object per worker)."""
        if None not in self.lines:
            return "[" + ", ".join(self.lines) + "]"  # type: ignore[arg-type]
        return "[" + ", ".join(
            line if line is not None else encode_line({**r, DETAIL_KEY: d})
            for line, r, d in zip(self.lines, self.results, self.details)
        ) + "]"

    def detail(self, index: int) -> Optional[Dict[str, Any]]:
        """Worker ``index``'s detailed autofilled values: as they travelled, or read back from its
        ``results.jsonl`` text (which holds them: JSON keeps these values exactly)."""
        detail = self.details[index] if index < len(self.details) else None
        if detail is None and index < len(self.lines) and self.lines[index] is not None:
            row = json.loads(self.lines[index])  # type: ignore[arg-type]
            detail = {k: row[k] for k in DETAILED_AUTOFILLED_KEYS if k in row} or None
        return detail

    def add_details(self) -> None:
        """Put the detailed autofilled values into :attr:`results` (when they are asked for)."""
        for i, result in enumerate(self.results):
            detail = self.detail(i)
            if detail:
                result.update(detail)

    def full_result(self, index: int) -> Dict[str, Any]:
        """Worker ``index``'s result with its detailed values, whatever the switch says."""
        detail = self.detail(index)
        return {**self.results[index], **detail} if detail else self.results[index]

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
        return self.checkpoints.count(None) != len(self.checkpoints)

    @property
    def saved_state(self) -> Any:
        """Rank 0's payload of a checkpoint round (a :class:`WrittenCheckpoint`)."""
        return self.results[0]


def decode_round(kind: str, data: List[Any]) -> Round:
    """Decode one round of item data (all of ``kind``) into a :class:`Round`."""
    if kind == CHECKPOINT:
        return Round(kind, data)
    checkpoints = [d.pop(CHECKPOINT_KEY, None) for d in data]
    lines = [d.pop(LINE_KEY, None) for d in data]
    details = [d.pop(DETAIL_KEY, None) for d in data]
    return Round(kind, data, checkpoints, lines, details)


def decode_items(items: List[Item]) -> Round:
    """Decode one round of raw items (one per worker, all of the first item's kind) into a
    :class:`Round`. A round of plain reports (every item ``(REPORT, metrics, text)``) is one
    transposition, touching no dict: the driver's cost per round at N workers."""
    n = len(items)
    if n and min(map(len, items)) == 3:  # in C: only plain reports have three parts
        _, results, texts = zip(*items)
        return Round(REPORT, list(results), [None] * n, list(texts), [None] * n)
    round_ = decode_round(items[0][0] if n else REPORT, [item[1] for item in items])
    if round_.lines:  # plain reports beside one that carries a checkpoint: their texts
        for i, item in enumerate(items):
            if len(item) == 3:
                round_.lines[i] = item[2]
    return round_


def plain_report(metrics: Dict[str, Any], line: str) -> Item:
    """A polled report with no checkpoint, as it travels: ``(REPORT, metrics, text)``."""
    return (REPORT, metrics, line)
