"""What the controller reads between rounds, besides the rounds: hangs (the watchdog) and
``sgd stacks`` requests. Hosts' health comes from the group (:meth:`RunGroup.health
<sgd.group.protocol.RunGroup.health>`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from sgd._worker.stacks import innermost_user_frame
from sgd.errors import TrainingHangError
from sgd.runs import STACKS_FILE, STACKS_REQUEST

logger = logging.getLogger("sgd")

#: How often (seconds) a running driver looks for a request of ``sgd stacks``.
STACKS_CHECK_INTERVAL_S = 1.0


def answer_stacks_request(run_dir: Path, stacks: Callable[[], List[str]]) -> None:
    """When ``sgd stacks`` asked (``run_dir/stacks.request``), write every worker's stacks to
    ``run_dir/stacks.txt`` (atomically; its first line is the request's text)."""
    request = run_dir / STACKS_REQUEST
    try:
        token = request.read_text()
    except OSError:
        return
    tmp = run_dir / f".{STACKS_FILE}.tmp"
    tmp.write_text(token.strip() + "\n" + "\n".join(stacks()))
    os.replace(tmp, run_dir / STACKS_FILE)
    request.unlink(missing_ok=True)


def stragglers_of(items_per_worker: List[int], stacks: List[str]) -> Tuple[List[int], str]:
    """The ranks not where the others are, and where that is: behind the most advanced ranks
    in what they sent; or, when all sent as much, at another line of the training function
    than most ranks (from each worker's innermost frame of its training thread)."""
    most = max(items_per_worker, default=0)
    behind = [i for i, n in enumerate(items_per_worker) if n < most]
    if behind:
        return behind, f"{len(behind)} of {len(items_per_worker)} ranks sent fewer reports and checkpoints " \
                       f"({min(items_per_worker)} against {most})"
    frames = [innermost_user_frame(s) for s in stacks]
    counts: Dict[Optional[str], int] = {}
    for f in frames:
        counts[f] = counts.get(f, 0) + 1
    if len(counts) < 2:
        return [], ""
    common = max(counts, key=lambda f: counts[f])
    odd = [i for i, f in enumerate(frames) if f != common]
    return odd, "; ".join(f"rank {i} at {frames[i]}" for i in odd) + f"; the others at {common}"


def hang_error(timeout_s: float, items_per_worker: List[int], stacks: List[str]) -> TrainingHangError:
    """The error of a run the watchdog took as hung (retried like a death), naming the
    stragglers; every worker's stack is logged and kept in the error's ``.stacks``."""
    stragglers, where = stragglers_of(items_per_worker, stacks)
    message = (f"no worker sent a report, a checkpoint or its end for {timeout_s:g} s (hang_timeout_s / "
               f"SGD_HANG_TIMEOUT_S): the run is taken as hung. ")
    if stragglers:
        message += f"Not where the others are: rank{'s' if len(stragglers) > 1 else ''} " \
                   f"{', '.join(map(str, stragglers))} ({where}). "
    else:
        message += "Every rank is at the same place (a step longer than the timeout, or all waiting). "
    message += "Every worker's stack is logged above, and in the error's .stacks."
    logger.error("%s\n%s", message, "\n".join(stacks))
    return TrainingHangError(message, stragglers, stacks)
