"""The work ``bench_compare.py`` times, written once and run unchanged by sgd, Ray Train and
torchrun.

Each function runs inside a worker whose ``torch.distributed`` process group is already set
up (by sgd, by Ray Train, or by the torchrun script itself). What differs between frameworks
is only how a worker reports a metric and saves a checkpoint, so those come in as plain
callables (see ``_compare_drivers.py``):

- ``report(metrics)``: one report of a small dict;
- ``save(state, metrics)``: one checkpoint; ``state`` is rank 0's state dict and ``None`` on
  the other ranks, which only take part in whatever synchronisation the framework does.

Results are written by rank 0 as JSON to ``config["out"]``, the same way under every
framework (Ray Train returns no values from workers). Only torch and the standard library
here: torchrun workers import this module without sgd or Ray.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

Report = Callable[[Dict[str, Any]], None]
Save = Callable[[Optional[Dict[str, Any]], Dict[str, Any]], None]

#: The DDP job (cases 3 and 4): an MLP on fixed synthetic data. How many steps and checkpoints
#: (``warmup``, ``steps``, ``ckpts``, ``ckpt_every``, ``ckpt_mb``) come from bench_compare's plan.
DDP_DEFAULTS: Dict[str, Any] = {
    "seed": 0,
    "in_dim": 256,
    "hidden": 1024,
    "classes": 10,
    "batch": 128,  # per worker
    "samples": 16384,  # the synthetic data set, cycled through
    "lr": 0.01,
    "momentum": 0.9,
}


def limit_threads() -> Dict[str, Any]:
    """One intra-op thread, as ``OMP_NUM_THREADS=1`` asks; returns what the worker really has,
    so the results can show the three frameworks ran with the same settings."""
    import torch

    torch.set_num_threads(1)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "cpu_affinity": affinity,
    }


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def write_json(out: Optional[str], data: Dict[str, Any]) -> None:
    """Write ``data`` to ``out`` (if given) in one step: a reader never sees half a file."""
    if out is None:
        return
    tmp = Path(f"{out}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(out)


# --- case 1: the trivial job ------------------------------------------------------------------


def trivial(report: Report) -> float:
    """One ``all_reduce`` over the process group and one report."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    report({"total": t.item()})
    return t.item()


# --- case 2: back-to-back reports -------------------------------------------------------------


def report_loop(report: Report, config: Dict[str, Any]) -> None:
    """``config["n"]`` reports in a row, each timed in the worker."""
    threads = limit_threads()
    clock = time.perf_counter
    n = config["n"]
    latencies: List[float] = [0.0] * n
    begin = clock()
    for i in range(n):
        t0 = clock()
        report({"i": i})
        latencies[i] = clock() - t0
    loop_s = clock() - begin
    if _rank() == 0:
        write_json(config.get("out"), {"latencies_s": latencies, "loop_s": loop_s, "threads": threads})


# --- cases 3 and 4: DDP training, then checkpoints every N steps ---------------------------------


def _model(cfg: Dict[str, Any]) -> Any:
    import torch

    torch.manual_seed(cfg["seed"])  # the same initial weights on every rank, in every framework
    return torch.nn.Sequential(
        torch.nn.Linear(cfg["in_dim"], cfg["hidden"]),
        torch.nn.ReLU(),
        torch.nn.Linear(cfg["hidden"], cfg["hidden"]),
        torch.nn.ReLU(),
        torch.nn.Linear(cfg["hidden"], cfg["classes"]),
    )


def _data(cfg: Dict[str, Any]) -> Any:
    import torch

    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    x = torch.randn(cfg["samples"], cfg["in_dim"], generator=g)
    y = torch.randint(0, cfg["classes"], (cfg["samples"],), generator=g)
    return x, y


def _payload(nbytes: int, seed: int) -> Dict[str, Any]:
    """``nbytes`` of float32 in four tensors, filled once (outside any timing)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n = max(nbytes // 4 // 4, 1)
    return {f"block{i}": torch.randn(n, generator=g) for i in range(4)}


def _nbytes(state: Any) -> int:
    import torch

    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_nbytes(v) for v in state)
    return 0


def ddp_train(save: Save, config: Dict[str, Any]) -> None:
    """Warm-up, ``steps`` timed steps, then ``ckpts`` checkpoints, one every ``ckpt_every`` steps.

    Rank 0 times every step with ``perf_counter``; DDP's gradient all_reduce keeps the ranks in
    lockstep, so rank 0's step time is the job's. Start-up is not in any of it.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    cfg = {**DDP_DEFAULTS, **config}
    threads = limit_threads()
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(_model(cfg))
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    x, y = _data(cfg)
    batch, samples = cfg["batch"], cfg["samples"]

    def step(i: int) -> Any:
        start = ((i * world + rank) * batch) % samples  # each rank its own slice of each global batch
        xb, yb = x[start : start + batch], y[start : start + batch]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    clock = time.perf_counter
    i = 0
    for _ in range(cfg["warmup"]):
        step(i)
        i += 1
    durations: List[float] = []
    begin = prev = clock()
    for _ in range(cfg["steps"]):
        loss = step(i)
        i += 1
        now = clock()
        durations.append(now - prev)
        prev = now
    timed_s = prev - begin
    final_loss = loss.item()  # the same in every framework: same seed, data and order

    state_bytes = 0
    ckpt_durations: List[float] = []
    ckpt_steps: List[int] = []
    payload = None
    if rank == 0 and cfg["ckpts"]:
        own = _nbytes(model.module.state_dict()) + _nbytes(opt.state_dict())
        payload = _payload(cfg["ckpt_mb"] * 1024 * 1024 - own, cfg["seed"] + 2)
    phase_begin = prev = clock()
    for k in range(cfg["ckpts"] * cfg["ckpt_every"]):
        step(i)
        i += 1
        if (k + 1) % cfg["ckpt_every"] == 0:
            state = None
            if rank == 0:
                state = {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "payload": payload}
                state_bytes = _nbytes(state)
            save(state, {"step": i})
            ckpt_steps.append(len(ckpt_durations))
        now = clock()
        ckpt_durations.append(now - prev)
        prev = now
    phase_s = prev - phase_begin
    if rank == 0:
        write_json(config.get("out"), {
            "durations_s": durations,
            "timed_s": timed_s,
            "final_loss": final_loss,
            "phase_durations_s": ckpt_durations,
            "phase_ckpt_indices": ckpt_steps,
            "phase_s": phase_s,
            "state_bytes": state_bytes,
            "threads": threads,
            "warmup_plus_timed_steps": cfg["warmup"] + cfg["steps"],
        })


# --- case 5: recovery after SIGKILL ---------------------------------------------------------------


def recovery_wait(config: Dict[str, Any]) -> None:
    """Announce "running, process group works" in a file, then idle until told to stop.

    bench_compare watches ``config["dir"]``: once both ranks are up it SIGKILLs rank 1 by pid
    and waits for both ranks of the restarted group to announce themselves. No collective in
    the idle loop: a survivor blocked in one would fail on its own, which is not what is timed.
    """
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    ready = time.time()
    rank = dist.get_rank()
    folder = Path(config["dir"])
    write_json(str(folder / f"ready_{rank}_{os.getpid()}.json"), {"rank": rank, "pid": os.getpid(), "t": ready})
    deadline = time.monotonic() + config["timeout_s"]
    while not (folder / "done").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: bench_compare never wrote {folder / 'done'}")
        time.sleep(0.02)
