"""Worker side of the v1 trainer: the operator registry and the function every run executes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from sgd_torch.v1.operator import TrainingOperator


@dataclass
class _Entry:
    operator: TrainingOperator
    version: int  # the driver's state version this operator holds


#: This worker process's operators, by trainer id (several trainers' workers never share a
#: process, but the key keeps a stale entry from ever being mistaken for a new trainer's).
_OPERATORS: Dict[str, _Entry] = {}


@dataclass
class Job:
    """One pass, as shipped to every worker."""

    trainer_id: str
    operator_cls: type
    operator_kwargs: Dict[str, Any]
    use_gpu: bool
    kind: str  # "init" | "train" | "validate" | "state" | "models" | "sync"
    version: int  # version of the driver's current state
    state: Optional[List[Any]]  # [ObjectRef] of that state; a list so that Ray does not resolve it
    new_version: int  # the version once this pass is done
    num_steps: Optional[int] = None
    info: Dict[str, Any] = field(default_factory=dict)
    profile: bool = False


def _build_operator(job: Job) -> TrainingOperator:
    import sgd
    from sgd_torch.train_loop_utils import get_device

    device = get_device() if job.use_gpu else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    operator = job.operator_cls(
        world_rank=sgd.world_rank(),
        local_rank=sgd.local_rank(),
        is_distributed=sgd.world_size() > 1,
        device=device,
        use_gpu=job.use_gpu,
        **job.operator_kwargs,
    )
    operator._ensure_setup()
    return operator


def _operator_for(job: Job) -> TrainingOperator:
    import ray

    import sgd

    entry = _OPERATORS.get(job.trainer_id)
    if entry is None:
        # A new process: the first pass, or workers sgd replaced after a failure. Start
        # from the checkpoint of this run (the trainer's state when the call began, or the
        # file passed as train(checkpoint=path)).
        operator = _build_operator(job)
        restart = sgd.load_checkpoint()
        refs = restart.get("state") if restart else None
        if refs:
            operator.load_full_state_dict(ray.get(refs[0]))
        entry = _OPERATORS[job.trainer_id] = _Entry(operator, job.version)
    elif entry.version != job.version and job.state is not None:
        # The driver's state changed without this operator (restore / load_state_dict).
        entry.operator.load_full_state_dict(ray.get(job.state[0]))
        entry.version = job.version
    return entry.operator


def run_job(job: Job) -> Dict[str, Any]:
    """What every worker runs for one trainer call. (A pass that fails because a peer died
    is recognised by the driver, which restarts the group: see ``PEER_FAILURE_GRACE_S``.)"""
    import sgd

    operator = _operator_for(job)
    if operator.device.type == "cuda":
        torch.cuda.set_device(operator.device)  # per thread: every run has a thread of its own
    out: Dict[str, Any] = {"stats": None, "state": None, "models": None,
                           "has_validation": operator.has_validation_data}
    if job.kind == "train":
        out["stats"] = operator.run_train_epoch(job.num_steps, job.info, job.profile)
    elif job.kind == "validate":
        out["stats"] = operator.run_validation(job.num_steps, job.info, job.profile)
    if out["stats"] is not None:
        sgd.report({str(k): v for k, v in out["stats"].items()})
    if sgd.world_rank() == 0:
        if job.kind in ("init", "train", "state"):
            out["state"] = operator.full_state_dict()
        elif job.kind == "models":
            out["models"] = list(operator._original_models)
    _OPERATORS[job.trainer_id].version = job.new_version
    return out
