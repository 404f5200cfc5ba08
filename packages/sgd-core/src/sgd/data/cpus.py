"""Whether the cluster can feed a run's Ray Datasets: Ray Data's tasks need a free CPU beside the
workers (:func:`data_cpu_shortfall`)."""

from __future__ import annotations

from typing import Any, Optional

from sgd.data.split import is_ray_dataset


def data_cpu_shortfall(dataset: Any, patience_s: float = 10.0) -> Optional[str]:
    """Why a run with ``dataset`` would wait forever for CPUs, or ``None``.

    Ray Data reads and transforms in Ray tasks that need a CPU each; with the workers
    started, at least one CPU of the cluster must be free (or become free within
    ``patience_s``: other work may be finishing), else iterating would wait with no end.
    """
    import time

    import ray

    items = dataset.values() if isinstance(dataset, dict) else [dataset]
    if not any(is_ray_dataset(ds) and _needs_tasks(ds) for ds in items):
        return None
    deadline = time.monotonic() + patience_s
    while True:
        free = float(ray.available_resources().get("CPU", 0))
        if free >= 1:
            return None
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)  # polling the cluster's state with a deadline, not waiting for an event
    total = float(ray.cluster_resources().get("CPU", 0))
    return (
        f"no CPU of the cluster's {total:g} is free ({free:g}) with the workers started, and Ray Data needs "
        "at least one to read and transform the dataset: iterating it would wait forever. Leave a CPU "
        "free: fewer workers (num_workers), fewer CPUs per worker (resources_per_worker={'CPU': ...}), or "
        "a bigger cluster (ray.init(num_cpus=...), more nodes)."
    )


def _needs_tasks(ds: Any) -> bool:
    try:
        op = ds._logical_plan.dag
        return bool(op.input_dependencies) or op.output_data() is None
    except AttributeError:
        return True
