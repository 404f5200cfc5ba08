"""``WorkerGroup``: N Ray actors in one placement group, in rank order.

The class-level API that embedding libraries (Ludwig and the like) use
directly, and what :class:`sgd.Trainer` runs training functions on.

``sgd.worker_group`` was one module; :class:`WorkerGroup` keeps it as its ``__module__``.
Its parts: ``group`` (the class: starting, resizing, stopping), ``reservation`` (its slots of
placement groups), ``calls`` (running code on the actors), ``ranks`` (who is rank 0, 1, ...).
"""

# Placement's names are re-exported here, where code importing them has found them so far.
from sgd._common.placement import (  # noqa: F401
    PLACEMENT_STRATEGIES,
    capacity_summary,
    infeasible_timeout_s,
    placement_timeout_s,
    wait_for_placement,
)
from sgd.errors import ResourcesUnavailableError as ResourcesUnavailableError
from sgd.worker_group.calls import EXECUTE_ERROR_GRACE_S as EXECUTE_ERROR_GRACE_S
from sgd.worker_group.group import WorkerGroup as WorkerGroup
