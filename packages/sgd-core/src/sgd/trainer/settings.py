"""A trainer's settings as others read them: the JSON a run's ``trainer.json`` keeps (what
``Trainer.restore`` and ``sgd runs show`` read back), the arguments a restored trainer is made
with, and the resource table ``str(trainer)`` prints."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

from sgd.backend import BackendConfig
from sgd.plugins import resolve_backend


def settings_json(settings: Dict[str, Any], config: BackendConfig, min_workers: int,
                  max_workers: int) -> Dict[str, Any]:
    """``Trainer.settings()`` as ``trainer.json`` keeps them: the backend by name and its
    config's fields, ``num_workers`` as ``[min, max]``, without the plugins."""
    settings = dict(settings)
    settings.pop("plugins")  # objects: a restored trainer is given its plugins again
    return dict(settings, backend=config.name,
                backend_config=dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {},
                num_workers=[min_workers, max_workers])


def restored_arguments(settings: Dict[str, Any], backend: Optional[BackendConfig]) -> Dict[str, Any]:
    """The keyword arguments (``logdir`` left out) of a trainer that continues the run whose
    ``trainer.json`` holds ``settings``; ``backend`` replaces the one named there."""
    if backend is None:
        backend = resolve_backend(settings["backend"]).config_cls(**settings["backend_config"])
    return dict(
        backend=backend,
        num_workers=tuple(settings["num_workers"]) if settings["num_workers"][0] != settings["num_workers"][1]
        else settings["num_workers"][0],
        use_gpu=settings["use_gpu"],
        resources_per_worker=settings["resources_per_worker"],
        max_retries=settings["max_retries"],
        storage_path=settings.get("storage_path"),
        placement_strategy=settings.get("placement_strategy", "PACK"),
        placement_timeout_s=settings.get("placement_timeout_s"),
        hang_timeout_s=settings.get("hang_timeout_s"),
        retry_worker_errors=bool(settings.get("retry_worker_errors", False)),
    )


def resource_table(title: str, backend_name: str, min_workers: int, max_workers: int,
                   res: Dict[str, float]) -> str:
    """``title`` over a table of the workers' resources: per worker and in total."""
    custom = {k: v for k, v in res.items() if k not in ("CPU", "GPU")}
    n = max_workers
    workers = f"{min_workers}-{n}" if min_workers != n else str(n)
    rows = [
        ("backend", backend_name, ""),
        ("workers", workers, ""),
        ("CPUs", f"{res['CPU']:g}", f"{res['CPU'] * n:g}"),
        ("GPUs", f"{res['GPU']:g}", f"{res['GPU'] * n:g}"),
    ]
    rows += [(k, f"{v:g}", f"{v * n:g}") for k, v in sorted(custom.items())]
    header = ("resource", "per worker", "total")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(3)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(row: Tuple[str, str, str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |"

    return "\n".join([title, line, fmt(header), line] + [fmt(r) for r in rows] + [line])
