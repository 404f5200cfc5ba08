"""Lines of ``results.jsonl`` into numbers: one report round per line, a JSON list of one dict per
rank. A line that does not parse (cut short by a crash, or damaged) is counted, not fatal; values
JSON cannot hold were written as strings and, like any string, are not numbers (``NaN``: a gap).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

#: sgd's own fields in every rank's dict: left out of the metric names a run offers.
OWN_FIELDS = ("_training_iteration", "_timestamp", "_time_this_iter_s", "_date", "_time_total_s", "_pid",
              "_hostname", "_node_ip")
NAN = float("nan")
#: A file up to this size is sampled by reading it whole.
WHOLE_FILE = 256 * 1024


def parse_round(raw: bytes) -> Optional[List[Dict[str, Any]]]:
    """One line as a list of per-rank dicts (a lone dict: one rank), ``None`` if it is not one."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
        return value
    return None


def flat(result: Dict[str, Any], prefix: str = "", depth: int = 0) -> Iterator[Tuple[str, Any]]:
    """``(name, value)`` of a rank's dict, nested dicts flattened with ``/`` (as sgd-loggers names them)."""
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and depth < 4:
            yield from flat(value, name + "/", depth + 1)
        else:
            yield name, value


def number(value: Any) -> float:
    """A metric's value as a float; ``NaN`` for what is not a finite number (a string, ``None``,
    a list, a bool, NaN and the infinities: each is a gap in a chart)."""
    if type(value) is float:
        return value if math.isfinite(value) else NAN
    if type(value) is int:
        return float(value)
    return NAN


def is_numeric(value: Any) -> bool:
    """Whether ``value`` is what a chart can draw, or one of the strings a writer puts for a
    non-finite number (so a metric that is NaN in some rounds still counts as numeric)."""
    if type(value) in (int, float):
        return True
    return isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity")


def complete_lines(data: bytes) -> Tuple[List[bytes], int]:
    """The complete lines of ``data`` and how many bytes they take (the rest, a line still being
    written, is left for the next read)."""
    end = data.rfind(b"\n") + 1
    return data[:end].split(b"\n")[:-1], end


def sample_lines(path: str, count: int, max_line: int = 1 << 20) -> Tuple[List[bytes], int]:
    """About ``count`` complete lines spread evenly over a file by byte offset, and the byte offset
    after the last complete line. Each read starts at a chosen offset and skips to the next line
    start, so the cost does not grow with the file: this is how a run of a million rounds opens
    at once (its columns are read in the background)."""
    try:
        f = open(path, "rb")
    except OSError:
        return [], 0
    with f:
        size = f.seek(0, os.SEEK_END)
        if size <= WHOLE_FILE:
            f.seek(0)
            lines, end = complete_lines(f.read())
            lines = [ln for ln in lines if ln.strip()]
            if len(lines) > count > 0:
                step = (len(lines) - 1) / max(count - 1, 1)
                lines = [lines[round(i * step)] for i in range(count)]
            return lines, end
        # The end of the last complete line: where the following starts.
        f.seek(max(0, size - max_line))
        tail = f.read()
        end = size - len(tail) + tail.rfind(b"\n") + 1
        out: List[bytes] = []
        for i in range(count):
            start = int(i * (end - 1) / max(count - 1, 1)) if count > 1 else 0
            f.seek(max(0, start - 1))
            chunk = f.read(min(max_line, end - max(0, start - 1)))
            if start > 0:
                newline = chunk.find(b"\n")
                if newline < 0:
                    continue
                chunk = chunk[newline + 1:]
            line_end = chunk.find(b"\n")
            if line_end > 0:
                out.append(chunk[:line_end])
        # Neighbouring offsets can land in the same line; keep each once, in order.
        dedup: List[bytes] = []
        for line in out:
            if not dedup or dedup[-1] != line:
                dedup.append(line)
        return dedup, end
