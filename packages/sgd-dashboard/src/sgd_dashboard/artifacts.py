"""A run's checkpoints and per-rank logs.

Checkpoints come from :func:`sgd.runs.checkpoints` and :func:`sgd.runs.run_summary` (which
verifies every file against its recorded sha256: cached until a checkpoint folder changes); a
checkpoint folder whose metadata cannot be read is listed too, as damaged.

A rank's log (``logs/rank_N.log``) gets a header line each time a worker starts on it
(``=== rank N: pid P on HOST, DATE ===``): each part is one attempt, with an id of its own
(``"<rank>-<attempt>"``). The headers are found once and then only in what was appended.
"""

from __future__ import annotations

import math
import os
import re
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from sgd import runs
from sgd_dashboard.files import Root, folder_bytes, read_bytes, stat_key

HEADER = b"=== rank "
_HEADER_LINE = re.compile(rb"^=== rank (\d+): pid (\d+) on (.*?), (.*?) ===")
_LOG_FILE = re.compile(r"^rank_(\d+)\.log$")
_LOG_ID = re.compile(r"^(\d{1,6})-(\d{1,6})$")
#: The most bytes of log text one answer carries.
LOG_CHUNK = 256 * 1024
#: The most bytes one search looks through per answer (it says where it stopped).
SEARCH_BYTES = 16 << 20
MAX_MATCHES = 2000
_SCAN = 4 << 20


class Checkpoints:
    """One run's checkpoint table, re-read when a checkpoint folder or its metadata changes."""

    def __init__(self, root: Root, path: Path):
        self.root = root
        self.path = path
        self._key: Any = None
        self._rows: List[Dict[str, Any]] = []
        self._lock = threading.Lock()

    def _signature(self) -> Any:
        folder = self.path / "checkpoints"
        try:
            names = sorted(e.name for e in os.scandir(folder) if not e.name.startswith("."))
        except OSError:
            return ()
        return tuple((n, stat_key(folder / n / ".sgd_checkpoint.json"), stat_key(folder / n)) for n in names)

    def rows(self, last_iteration: int) -> List[Dict[str, Any]]:
        """The JSON rows of ``/api/runs/<id>/checkpoints``, oldest first."""
        with self._lock:
            key = (self._signature(), last_iteration)
            if key != self._key:
                self._rows = self._read(last_iteration)
                self._key = key
            return self._rows

    def _read(self, last_iteration: int) -> List[Dict[str, Any]]:
        folder = self.path / "checkpoints"
        if not folder.is_dir() or not self.root.inside(folder):
            return []
        found = [c for c in runs.checkpoints(self.path) if self.root.inside(c["path"])]
        summary = runs.run_summary(self.path) if found else {}
        bad = {b["name"]: b["problem"] for b in summary.get("unverified_checkpoints") or []}
        best = (summary.get("best_checkpoint") or {}).get("name")
        latest = found[-1]["name"] if found else None
        verified = [c for c in found if c["name"] not in bad]
        earlier = [c for c in verified if isinstance(c["iteration"], int) and c["iteration"] <= last_iteration]
        resume_from = (earlier or verified)[-1]["name"] if verified else None
        rows = []
        for c in found:
            rows.append({"name": c["name"], "iteration": c["iteration"], "score": _finite(c["score"]),
                         "metrics": c["metrics"], "time": c["time"],
                         "bytes": folder_bytes(self.root, Path(c["path"])),
                         "verified": c["name"] not in bad, "problem": bad.get(c["name"]),
                         "best": c["name"] == best, "latest": c["name"] == latest,
                         "resume": c["name"] == resume_from})
        listed = {c["name"] for c in found}
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.name.startswith(".") or entry.name in listed or not entry.is_dir(follow_symlinks=False):
                continue
            meta = Path(entry.path) / ".sgd_checkpoint.json"
            problem = ("its metadata (.sgd_checkpoint.json) is damaged" if meta.exists()
                       else "no metadata (.sgd_checkpoint.json): being written, or cut short")
            rows.append({"name": entry.name, "iteration": None, "score": None, "metrics": None, "time": None,
                         "bytes": folder_bytes(self.root, Path(entry.path)), "verified": False,
                         "problem": problem, "best": False, "latest": False, "resume": False})
        return rows


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


# --- logs --------------------------------------------------------------------------------------


class RankLog:
    """The attempts of one ``logs/rank_N.log``: the byte offsets of its header lines."""

    def __init__(self, root: Root, path: Path, rank: int):
        self.root = root
        self.path = path
        self.rank = rank
        self.scanned = 0
        self.starts: List[int] = []
        self.headers: List[Dict[str, Any]] = []
        self._mid_line = False

    def scan(self) -> int:
        """Find the headers in what was appended since the last scan; returns the file's size."""
        self.root.check(self.path)
        key = stat_key(self.path)
        size = key[0] if key else 0
        if size < self.scanned:  # replaced: start over
            self.scanned, self.starts, self.headers, self._mid_line = 0, [], [], False
        while self.scanned < size:
            data = read_bytes(self.root, self.path, self.scanned, _SCAN)
            end = data.rfind(b"\n") + 1
            if end == 0:
                if len(data) < _SCAN:
                    break  # a line still being written
                end = len(data)
            if not self._mid_line and data.startswith(HEADER):
                self._found(data, 0)
            at = 0
            while True:
                i = data.find(b"\n" + HEADER, at, end)
                if i < 0:
                    break
                self._found(data, i + 1)
                at = i + 1
            self._mid_line = data[end - 1:end] != b"\n"
            self.scanned += end
        return size

    def _found(self, data: bytes, at: int) -> None:
        line_end = data.find(b"\n", at)
        match = _HEADER_LINE.match(data[at:line_end if line_end >= 0 else len(data)])
        self.starts.append(self.scanned + at)
        self.headers.append({} if match is None else {
            "pid": int(match.group(2)), "host": match.group(3).decode("utf-8", "replace"),
            "began": match.group(4).decode("utf-8", "replace")})

    def parts(self) -> List[Tuple[int, int, int, Dict[str, Any]]]:
        """``(attempt, start, end, header)`` of each attempt, from 1 (text before the first header,
        from an older sgd, is an attempt of its own); the last one ends at the size now."""
        size = self.scan()
        starts, headers = list(self.starts), list(self.headers)
        if size and (not starts or starts[0] != 0):
            starts.insert(0, 0)
            headers.insert(0, {})
        out = []
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else size
            out.append((i + 1, start, end, headers[i]))
        return out


class RunLogs:
    """The per-rank logs of one run."""

    def __init__(self, root: Root, path: Path):
        self.root = root
        self.folder = path / "logs"
        self._logs: Dict[int, RankLog] = {}

    def _files(self) -> Dict[int, Path]:
        found: Dict[int, Path] = {}
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return found
        for e in entries:
            m = _LOG_FILE.match(e.name)
            if m and self.root.inside(e.path):
                found[int(m.group(1))] = Path(e.path)
        return found

    def listing(self) -> List[Dict[str, Any]]:
        """The JSON rows of ``/api/runs/<id>/logs``, by rank then attempt."""
        rows = []
        for rank, path in sorted(self._files().items()):
            log = self._logs.setdefault(rank, RankLog(self.root, path, rank))
            for attempt, start, end, header in log.parts():
                rows.append({"id": f"{rank}-{attempt}", "rank": rank, "attempt": attempt, "bytes": end - start,
                             "pid": header.get("pid"), "host": header.get("host"), "began": header.get("began")})
        return rows

    def part(self, log_id: str) -> Optional[Tuple[RankLog, int, int]]:
        """``(log, start, end)`` of the log part ``log_id`` (``None``: no such part)."""
        m = _LOG_ID.match(log_id)
        if not m:
            return None
        rank, attempt = int(m.group(1)), int(m.group(2))
        path = self._files().get(rank)
        if path is None:
            return None
        log = self._logs.setdefault(rank, RankLog(self.root, path, rank))
        for a, start, end, _ in log.parts():
            if a == attempt:
                return log, start, end
        return None

    def read(self, log_id: str, offset: int = 0, q: str = "", tail: bool = False) -> Optional[Dict[str, Any]]:
        """``{"text", "offset", "size", "start"}`` of the part ``log_id`` from ``offset`` (bytes into
        the part): at most :data:`LOG_CHUNK` bytes, cut at a line's end; ``tail``: its last chunk.
        With ``q``, only the lines holding ``q`` (any case), looked for in up to :data:`SEARCH_BYTES`;
        ``offset`` in the answer is where the next read or search goes on."""
        found = self.part(log_id)
        if found is None:
            return None
        log, start, end = found
        size = end - start
        if tail and not q:
            offset = max(0, size - LOG_CHUNK)
        offset = min(max(0, offset), size)
        if not q:
            data = read_bytes(self.root, log.path, start + offset, min(LOG_CHUNK, size - offset))
            if len(data) == LOG_CHUNK and b"\n" in data:
                data = data[:data.rfind(b"\n") + 1]
            if tail and offset > 0 and b"\n" in data:  # begin at a line's start
                cut = data.find(b"\n") + 1
                data, offset = data[cut:], offset + cut
            return {"text": data.decode("utf-8", "replace"), "start": offset, "offset": offset + len(data),
                    "size": size}
        needle = q.lower().encode("utf-8")
        data = read_bytes(self.root, log.path, start + offset, min(SEARCH_BYTES, size - offset))
        if len(data) == SEARCH_BYTES and b"\n" in data:
            data = data[:data.rfind(b"\n") + 1]
        matches = []
        for line in data.split(b"\n"):
            if needle in line.lower():
                matches.append(line.decode("utf-8", "replace"))
                if len(matches) >= MAX_MATCHES:
                    break
        return {"text": "\n".join(matches), "start": offset, "offset": offset + len(data), "size": size,
                "matches": len(matches)}
