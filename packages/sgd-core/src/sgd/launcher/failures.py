"""How ``sgd run`` reports a failed run: the message it prints and the exit status it returns."""

from __future__ import annotations

import os
from typing import List, Optional

from sgd.errors import WorkerError
from sgd.launcher.runner import ScriptExitError


def failure_message(error: BaseException) -> str:
    """What ``sgd run`` prints for ``error``: the failing rank and its remote traceback."""

    if isinstance(error, ScriptExitError):
        return f"worker rank {error.world_rank} exited with status {error.code}"
    seen = set()
    exc: Optional[BaseException] = error
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, WorkerError):
            head = str(exc).split("\n\nRemote traceback:\n", 1)[0]
            return f"{head}\n\nRemote traceback:\n{trim_traceback(exc.remote_traceback).rstrip()}"
        seen.add(id(exc))
        exc = exc.__cause__
    return f"{type(error).__name__}: {error}"


def trim_traceback(text: str) -> str:
    """``text`` (a formatted traceback) without the sgd frames its blocks start with: the
    session thread and the runner, the same in every run. The script's frames stay; a
    block made only of sgd frames stays whole."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # sgd/
    lines = text.splitlines(keepends=True)
    out: List[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        i += 1
        if not lines[i - 1].startswith("Traceback (most recent call last):"):
            continue
        frames: List[List[str]] = []  # each: the 'File' line and its source lines
        while i < len(lines) and lines[i].startswith('  File "'):
            frame = [lines[i]]
            i += 1
            while i < len(lines) and lines[i].startswith("    "):
                frame.append(lines[i])
                i += 1
            frames.append(frame)

        def ours(frame: List[str]) -> bool:
            filename = frame[0][len('  File "'):].split('"', 1)[0]
            return os.path.abspath(filename).startswith(package)

        first = next((k for k, f in enumerate(frames) if not ours(f)), 0)
        for frame in frames[first:]:
            out.extend(frame)
    return "".join(out)


def exit_code_for(error: BaseException) -> int:
    if isinstance(error, ScriptExitError):
        return error.code if 0 < error.code < 256 else 1
    if isinstance(error, KeyboardInterrupt):
        return 130
    return 1
