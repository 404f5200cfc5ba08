"""The run controller a trainer's settings make: its worker group (Ray actors, or for
``num_workers=0`` the driver's own thread), its retry limit and hang timeout; and releasing it
when a started trainer is garbage collected."""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Dict, Optional

from sgd.backend import BackendConfig
from sgd.group.actors import ActorGroup
from sgd.group.in_process import InProcessGroup
from sgd.run.controller import RunController
from sgd.trainer.arguments import seconds_or_none


def make_controller(config: BackendConfig, hook: Any, *, min_workers: int, max_workers: int,
                    resources: Dict[str, float], use_gpu: bool, placement_strategy: str,
                    placement_timeout_s: Optional[float], max_retries: int,
                    hang_timeout_s: Optional[float]) -> RunController:
    """A controller over a new (not started) group; every hook of the group's lifecycle goes
    through ``hook`` (the trainer's own plugin manager's)."""
    if max_workers == 0:  # local mode: the function in this process
        gpus = max(1, math.ceil(resources.get("GPU", 1))) if use_gpu else 0
        # No worker process can die: an error is the function's own, never retried.
        return RunController(InProcessGroup(config, hook, gpus), max_retries=0)
    group = ActorGroup(config, max_workers, resources, min_workers=min_workers, placement_strategy=placement_strategy,
                       placement_timeout_s=placement_timeout_s, hook=hook)
    return RunController(group, max_retries, hang_timeout_s=hang_timeout(hang_timeout_s))


def hang_timeout(hang_timeout_s: Optional[float]) -> Optional[float]:
    """The trainer's ``hang_timeout_s``, else ``SGD_HANG_TIMEOUT_S``, else ``None`` (never)."""
    if hang_timeout_s is not None:
        return hang_timeout_s
    return seconds_or_none(os.environ.get("SGD_HANG_TIMEOUT_S") or None, "SGD_HANG_TIMEOUT_S")


def release_workers(controller: Any) -> None:
    """Shut down the workers of a trainer that was garbage collected while started."""
    try:
        controller.shutdown()
    except Exception:  # Ray already gone: so are the workers
        logging.getLogger("sgd").debug("releasing the workers of a collected trainer failed", exc_info=True)
