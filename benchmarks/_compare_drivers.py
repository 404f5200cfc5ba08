"""One case of ``bench_compare.py`` under one framework, in a process of its own.

    python _compare_drivers.py sgd|ray CASE WORKDIR
    python -m torch.distributed.run --standalone --nproc_per_node 2 _compare_drivers.py torchrun CASE WORKDIR

``WORKDIR/config.json`` says what to run; the driver writes ``WORKDIR/driver.json`` (times seen
by the driver) and rank 0 writes ``WORKDIR/worker.json`` (times seen in the workers). CASE is
``trivial``, ``report``, ``ddp`` (DDP training followed by checkpoints) or ``recovery``.
``BENCH_T_SPAWN`` (``time.time()`` just before bench_compare started this command) dates the
start of a cold run.

sgd and Ray Train start the same local Ray (``address="local"``: never another program's
cluster) with the same arguments. Each framework's own calls are in the adapters below; the
work itself is in ``_compare_workload`` and identical for all three.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import _compare_workload as workload

NUM_WORKERS = 2
RAY_INIT = {"address": "local", "num_cpus": 4, "include_dashboard": False}


# --- sgd ------------------------------------------------------------------------------------------


def _sgd_save(state: Optional[Dict[str, Any]], metrics: Dict[str, Any]) -> None:
    import sgd

    sgd.save_checkpoint(**(state or {}))  # every rank calls it; only rank 0's state is kept


def _sgd_trivial(config: Dict[str, Any]) -> float:
    import sgd

    return workload.trivial(lambda metrics: sgd.report(**metrics))


def _sgd_report_loop(config: Dict[str, Any]) -> None:
    import sgd

    workload.report_loop(lambda metrics: sgd.report(**metrics), config)


def _sgd_ddp(config: Dict[str, Any]) -> None:
    workload.ddp_train(_sgd_save, config)


def run_sgd(case: str, config: Dict[str, Any], work: Path) -> Dict[str, Any]:
    import ray

    import sgd

    out = _ray_up()
    trainer = sgd.Trainer(backend="torch", num_workers=NUM_WORKERS, logdir=work / "sgd",
                          max_retries=1 if case == "recovery" else 0)
    t = time.time()
    trainer.start()
    out["start_s"] = time.time() - t
    try:
        fns = {"trivial": _sgd_trivial, "report": _sgd_report_loop, "ddp": _sgd_ddp,
               "recovery": workload.recovery_wait}
        _drive(case, config, out, lambda fn: trainer.run(fn, config=config), fns[case])
    finally:
        t = time.time()
        trainer.shutdown()
        out["shutdown_s"] = time.time() - t
        ray.shutdown()
    return out


# --- Ray Train ------------------------------------------------------------------------------------


def _ray_save(state: Optional[Dict[str, Any]], metrics: Dict[str, Any]) -> None:
    """Ray Train's documented pattern: rank 0 saves into a temporary directory and reports it
    (Ray copies it into the run's storage_path before report returns); the others report
    the metrics alone."""
    import tempfile

    import ray.train
    import torch

    if state is None:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(state, os.path.join(tmp, "state.pt"))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def _ray_trivial(config: Dict[str, Any]) -> None:
    import ray.train

    workload.trivial(ray.train.report)


def _ray_report_loop(config: Dict[str, Any]) -> None:
    import ray.train

    workload.report_loop(ray.train.report, config)


def _ray_ddp(config: Dict[str, Any]) -> None:
    workload.ddp_train(_ray_save, config)


def run_ray(case: str, config: Dict[str, Any], work: Path) -> Dict[str, Any]:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = _ray_up()
    fits = iter(range(1, 1000))

    def fit(fn: Callable[[Dict[str, Any]], None]) -> None:
        trainer = TorchTrainer(
            fn,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=NUM_WORKERS, use_gpu=False),
            run_config=RunConfig(
                storage_path=str(work / "ray_storage"),
                name=f"{case}_{next(fits)}",
                failure_config=FailureConfig(max_failures=1 if case == "recovery" else 0),
            ),
        )
        trainer.fit()  # Ray Train 2.60 (Train v2) raises if training failed

    try:
        fns = {"trivial": _ray_trivial, "report": _ray_report_loop, "ddp": _ray_ddp,
               "recovery": workload.recovery_wait}
        _drive(case, config, out, fit, fns[case])
    finally:
        ray.shutdown()
    return out


# --- torchrun (each rank runs this; torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT) --------------


def _torch_save(folder: Path) -> workload.Save:
    """What the PyTorch DDP tutorial does: rank 0 ``torch.save``s, then every rank waits at a
    barrier so none runs ahead of a checkpoint in progress."""

    def save(state: Optional[Dict[str, Any]], metrics: Dict[str, Any]) -> None:
        import torch
        import torch.distributed as dist

        if state is not None:
            torch.save(state, folder / f"checkpoint_{metrics['step']:06d}.pt")
        dist.barrier()

    return save


def run_torchrun(case: str, config: Dict[str, Any], work: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        if case == "trivial":
            workload.trivial(lambda metrics: None)  # no report channel: rank 0 writes the result
            if dist.get_rank() == 0:
                cold_s = time.time() - float(os.environ["BENCH_T_SPAWN"])
                workload.write_json(str(work / "driver.json"), {"cold_s": cold_s})
        elif case == "ddp":
            folder = work / "torch_checkpoints"
            folder.mkdir(exist_ok=True)
            workload.ddp_train(_torch_save(folder), config)
        elif case == "recovery":
            workload.recovery_wait(config)
        else:
            raise ValueError(f"case {case!r} does not apply to torchrun")
    finally:
        dist.destroy_process_group()


# --- shared ---------------------------------------------------------------------------------------------


def _ray_up() -> Dict[str, Any]:
    """Start Ray; call it right after the framework's imports. The times so far."""
    import ray

    out = {"import_s": time.time() - float(os.environ["BENCH_T_SPAWN"])}
    t = time.time()
    ray.init(**RAY_INIT)
    out["ray_init_s"] = time.time() - t
    return out


def _drive(case: str, config: Dict[str, Any], out: Dict[str, Any], run: Callable[[Any], Any], fn: Any) -> None:
    """Run the case's training function ``fn`` with ``run`` (the framework's ``run``/``fit``)."""
    t = time.time()
    if case == "trivial":
        run(fn)
        out["first_run_s"] = time.time() - t
        out["cold_s"] = time.time() - float(os.environ["BENCH_T_SPAWN"])
        out["warm_s"] = _timed(lambda: run(fn), config["warm_reps"])
    else:
        cpu = time.process_time()
        run(fn)
        out["run_s"], out["driver_cpu_s"] = time.time() - t, time.process_time() - cpu


def _timed(fn: Callable[[], Any], reps: int) -> List[float]:
    values = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        values.append(time.perf_counter() - t)
    return values


def main(argv: List[str]) -> int:
    framework, case, work_dir = argv
    work = Path(work_dir)
    config = json.loads((work / "config.json").read_text())
    if framework == "torchrun":
        run_torchrun(case, config, work)
        return 0
    runner = {"sgd": run_sgd, "ray": run_ray}[framework]
    workload.write_json(str(work / "driver.json"), runner(case, config, work))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
