"""A run's events: ``events.jsonl`` in the run folder, one JSON line per thing that happened to the
run (not per report: reports are ``results.jsonl``'s). The driver's controller writes them where it
decides (:class:`EventLog`); anyone reads them back with :func:`read_events` (public as
:mod:`sgd.runs`), also while the run goes on, also from a copied folder with no Ray.

Every line is an object with ``"v"`` (the format's version, :data:`EVENTS_FORMAT_VERSION`),
``"time"`` (seconds since the epoch, as ``time.time()``) and ``"event"`` (its kind, one of
:data:`EVENT_KINDS`), then the kind's own fields (``docs/events.md`` lists them). A reader skips
kinds it does not know and keeps going past a line it cannot read (it reports it), so a newer sgd
may add kinds and fields; a change that alters an existing field raises the version.
"""

from __future__ import annotations

import json
import os
import time
import traceback as _traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Union

from sgd._common.json_values import finite, json_default
from sgd._common.public import public_module
from sgd.redact import redact, redact_text

#: The run folder's event log.
EVENTS_FILE = "events.jsonl"
#: The version every line of ``events.jsonl`` carries as ``"v"``.
EVENTS_FORMAT_VERSION = 1
#: A traceback or error message kept in an event is cut to this many characters (its end kept:
#: the frame that raised and the message).
MAX_TEXT = 16_384
#: A reader reads at most this many bytes of ``events.jsonl`` per call (it comes back for more).
READ_CHUNK = 8 << 20

#: Every kind this sgd writes (see ``docs/events.md`` for each kind's fields).
EVENT_KINDS = (
    "run_started",  # a driver took the run (a new run, or one resumed): driver_attempt, pid, host, ...
    "attempt_started",  # the training functions started: attempt, num_workers, iteration, checkpoint, workers
    "worker_failed",  # rank, host, pid, error_type, message, traceback, phase, died
    "host_lost",  # node_ip, node_id, ranks
    "drain_notice",  # hosts (node_ip, node_id, deadline)
    "resize",  # from, to, reason
    "reformed",  # in place (sgd.elastic): from, to, survivors (rank, pid), attempt
    "restart",  # attempt, max_failures, checkpoint, iteration, num_workers
    "checkpoint_persisted",  # checkpoint, iteration, bytes
    "checkpoint_deleted",  # checkpoint, iteration
    "checkpoint_rejected",  # a restart passed over a checkpoint that does not verify: checkpoint, reason
    "hang",  # timeout_s, stragglers
    "run_finished",
    "run_failed",  # error_type, message, traceback
    "run_stopped",
    "run_interrupted",
    "driver_died",  # the previous driver of a resumed run ended without closing it: pid, host, driver_attempt
)


def error_fields(error: BaseException) -> Dict[str, Any]:
    """``error_type``, ``message`` and ``traceback`` of an exception, for an event: secrets masked
    (:func:`sgd.redact.redact_text`), each cut to :data:`MAX_TEXT` characters. A worker's exception
    brings its remote traceback (:class:`sgd.WorkerError` as its cause)."""
    remote = getattr(error, "remote_traceback", None) or getattr(error.__cause__, "remote_traceback", None)
    text = remote if isinstance(remote, str) else "".join(
        _traceback.format_exception(type(error), error, error.__traceback__))
    return {"error_type": type(error).__name__, "message": _cut(redact_text(str(error))),
            "traceback": _cut(redact_text(text))}


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else "[... cut ...]\n" + text[-MAX_TEXT:]


class EventLog:
    """The writer of one run's ``events.jsonl``: each event appended as one line and flushed (it
    survives a killed driver). An event that cannot be written is dropped with no error: the run
    goes on (a full disk shows in ``results.jsonl`` first)."""

    def __init__(self, run_dir: Union[str, os.PathLike]):
        self.path = Path(run_dir) / EVENTS_FILE
        self._file: Optional[IO[str]] = None

    def write(self, kind: str, **fields: Any) -> Dict[str, Any]:
        """Append the event ``kind`` with ``fields`` (redacted; NaN and infinities spelled as
        ``results.jsonl`` spells them, other values JSON cannot hold written as their ``repr``);
        returns it."""
        event = {"v": EVENTS_FORMAT_VERSION, "time": time.time(), "event": kind, **finite(redact(fields))}
        try:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")
            self._file.write(json.dumps(event, default=json_default, allow_nan=False) + "\n")
            self._file.flush()
        except (OSError, ValueError):
            pass
        return event

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


@public_module("sgd.runs")
@dataclass
class EventsRead:
    """What one :func:`read_events` call read.

    :ivar events: the events, in the order written (kinds this sgd does not know included).
    :ivar offset: where the next call starts (the byte after the last complete line read): a
        follower passes it back to read only what was appended since.
    :ivar bad_lines: the byte offsets of lines that are not an event (a damaged file); the
        events around them are read.
    """

    events: List[Dict[str, Any]] = field(default_factory=list)
    offset: int = 0
    bad_lines: List[int] = field(default_factory=list)


def read_events(run: Union[str, os.PathLike], offset: int = 0, max_bytes: int = READ_CHUNK) -> EventsRead:
    """The events of the run folder ``run`` from byte ``offset`` of its ``events.jsonl``: every
    complete line (a line still being written is left for the next call), at most ``max_bytes``
    of them. A run written by an older sgd has no events: an empty read.

    :param offset: ``0``, or the ``offset`` an earlier call returned.
    """
    path = Path(run) / EVENTS_FILE
    out = EventsRead(offset=offset)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(max_bytes)
    except (FileNotFoundError, NotADirectoryError):
        return out
    end = data.rfind(b"\n") + 1
    position = offset
    for raw in data[:end].split(b"\n")[:-1]:
        event = _event(raw)
        if event is None:
            if raw.strip():
                out.bad_lines.append(position)
        else:
            out.events.append(event)
        position += len(raw) + 1
    out.offset = offset + end
    return out


def _event(raw: bytes) -> Optional[Dict[str, Any]]:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("event"), str):
        return None
    if not isinstance(value.get("time"), (int, float)):
        return None
    return value


__all__ = ["EVENTS_FILE", "EVENTS_FORMAT_VERSION", "EVENT_KINDS", "EventLog", "EventsRead", "error_fields",
           "read_events"]
