"""Checkpoint and recovery benchmarks (`nox -s bench`).

e. A 100 MB state dict saved by rank 0 with ``sgd.save_checkpoint`` until it is persisted
   (the call returns once the checkpoint directory is written, fsynced and renamed), against
   plain ``torch.save`` + fsync of the same dict to the same disk, alternating in the same
   process; the ratio is sgd's median over plain's best time (conservative). Target: <= 1.5x.
f. SIGKILL of one worker until the training function runs again on all workers
   (new actors, new gloo process group, function restarted). Target: <= 5 s.
g. A model sharded with FSDP2 on 2 workers (~1 GB of fp32 parameters, and ~10 MB): how long
   training is blocked per checkpoint, whole-state (the shards gathered on rank 0 with
   ``get_model_state_dict(full_state_dict=True, cpu_offload=True)``, then ``sgd.save_checkpoint``)
   against ``sgd_torch.save_sharded_checkpoint`` blocking and asynchronous; and the driver's
   peak RSS above its start for each. Targets: asynchronous blocks <= 10% of whole-state at
   1 GB; the driver's RSS with sharded checkpoints within 100 MB from 10 MB to 1 GB. Between
   checkpoints the workers "train" (sleep, as CPU threads do while a GPU computes) 1.5x as long
   as a blocking sharded write took, so an asynchronous write finishes before the next save.
   Side by side, Ray Train 2.x's documented pattern for the same 1 GB FSDP2 model: every rank
   ``dcp.save``s its shard into a local folder, then ``ray.train.report(metrics,
   checkpoint=Checkpoint.from_directory(folder))`` with ``checkpoint_upload_mode`` SYNC and
   ASYNC (Ray Train uploads each rank's folder into the run's storage).

Writes benchmarks/results/checkpoint.json and .md. With ``--gpu`` (``nox -s bench -- checkpoint
--gpu --only g --no-ray-train``) the workers train on GPUs over NCCL, as many as there are up to 2,
and the table goes to checkpoint_gpu.json and .md.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray
import torch
from _results import machine, write

import sgd

MB = 1024 * 1024


def _plain_save(state, directory: Path) -> float:
    path = directory / f"plain_{time.monotonic_ns()}.pt"
    t = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t
    path.unlink()
    return dt


def _checkpoint_func(config):
    """Rank 0 alternates a plain torch.save+fsync and an sgd checkpoint of the same dict, in
    the same process and to the same disk, so both see the same machine load."""
    import time
    from pathlib import Path

    import torch

    state = None
    if sgd.world_rank() == 0:
        g = torch.Generator().manual_seed(0)
        n = config["mb"] * 1024 * 1024 // 4 // 4
        state = {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(4)}
    sgd_times, plain_times = [], []
    for _ in range(config["reps"]):
        if state is not None:
            plain_times.append(_plain_save(state, Path(config["disk"])))
        t = time.perf_counter()
        sgd.save_checkpoint(**(state or {}))
        sgd_times.append(time.perf_counter() - t)
    return sgd_times, plain_times


def bench_checkpoint(trainer: sgd.Trainer, mb: int, reps: int) -> dict:
    disk = trainer.logdir / "plain"
    disk.mkdir(parents=True, exist_ok=True)
    sgd_times, plain = trainer.run(
        _checkpoint_func,
        config={"mb": mb, "reps": reps, "disk": str(disk)},
        checkpoint_strategy=sgd.CheckpointStrategy(num_to_keep=1),
    )[0]
    # Conservative: sgd's typical time against plain's best. Plain fsync times swing widely
    # on this disk (0.15-0.5 s for 100 MB), which would flatter a median-to-median ratio.
    ratio = statistics.median(sgd_times) / min(plain)
    return {
        "case": f"e. checkpoint {mb} MB (rank 0 until persisted)",
        "sgd_s": sgd_times,
        "plain_torch_save_fsync_s": plain,
        "median": ratio,
        "unit": "x plain",
        "spread": f"sgd median {statistics.median(sgd_times):.3f} s vs plain best {min(plain):.3f} s "
        f"(plain {min(plain):.2f}-{max(plain):.2f})",
        "target": "<= 1.5x",
        "met": ratio <= 1.5,
    }


def _recovery_func(config):
    import os
    import time

    import torch
    import torch.distributed as dist

    started = time.time()
    state = sgd.load_checkpoint() or {"step": 0}
    step = state["step"]
    t = torch.ones(1)
    dist.all_reduce(t)  # the process group works again
    while step < config["steps"]:
        step += 1
        sgd.report(step=step, started=started, pid=os.getpid())
        sgd.save_checkpoint(step=step)
    return step


def bench_recovery(trainer: sgd.Trainer, kills: int) -> dict:
    kill_steps = list(range(2, 2 + 2 * kills, 2))
    times = []
    killed_at = {}

    class Killer(sgd.TrainingCallback):
        def handle_result(self, results, **info):
            step = results[0]["step"]
            if killed_at and min(r["started"] for r in results) > killed_at["t"]:
                times.append(max(r["started"] for r in results) - killed_at.pop("t"))
            if step in kill_steps:
                kill_steps.remove(step)
                killed_at["t"] = time.time()
                os.kill(results[1]["pid"], signal.SIGKILL)

    trainer.run(_recovery_func, config={"steps": 2 + 2 * kills + 1}, callbacks=[Killer()])
    median = statistics.median(times)
    return {
        "case": "f. SIGKILL one worker -> all running again",
        "values_s": times,
        "median": median,
        "unit": "s",
        "spread": f"{min(times):.2f}-{max(times):.2f}",
        "target": "<= 5 s",
        "met": median <= 5,
    }


def _fsdp2_model(mb: int):
    import torch

    import sgd_torch

    width = 1024
    layers = max(1, mb * 1024 * 1024 // (4 * width * width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    return sgd_torch.prepare_model(model, parallel_strategy="fsdp")


def _ray_train_large_func(config):
    """Ray Train 2.x's documented DCP pattern: dcp.save per rank into a local folder, then
    ray.train.report with that folder as the checkpoint (uploaded by Ray Train)."""
    import json
    import tempfile
    import time

    import ray.train
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model = _fsdp2_model(config["mb"])  # fully_shard per layer, as sgd's; no sgd session is used
    mode = ray.train.CheckpointUploadMode[config["upload"]]
    blocked = []
    for step in range(1, config["reps"] + 1):
        time.sleep(config["interval_s"])
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.001)
        t = time.perf_counter()
        folder = tempfile.mkdtemp(prefix="ray_dcp_")
        dcp.save(get_model_state_dict(model), checkpoint_id=folder)
        ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(folder),
                         checkpoint_upload_mode=mode)
        blocked.append(time.perf_counter() - t)
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump(blocked, f)


def bench_ray_train(mb: int, reps: int, interval_s: float, work: Path) -> list:
    """Ray Train 2.x (TorchTrainer, 2 workers) with its DCP pattern, sync and async upload."""
    import json

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    cases = []
    try:
        for upload in ("SYNC", "ASYNC"):
            out = work / f"ray_{upload}.json"
            TorchTrainer(_ray_train_large_func,
                         train_loop_config={"mb": mb, "reps": reps, "interval_s": interval_s, "upload": upload,
                                            "out": str(out)},
                         scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                         run_config=RunConfig(storage_path=str(work / "ray_storage"), name=f"dcp_{upload}")).fit()
            blocked = json.loads(out.read_text())
            print(f"g. Ray Train {mb} MB {upload}: blocked {blocked}", flush=True)
            cases.append({"case": f"g. {mb} MB model, Ray Train 2.60: dcp.save + ray.train.report(checkpoint, "
                                  f"checkpoint_upload_mode={upload}): training blocked per checkpoint",
                          "values_s": blocked, "median": statistics.median(blocked), "unit": "s",
                          "spread": f"{min(blocked):.3f}-{max(blocked):.3f}", "target": "", "met": None})
    finally:
        ray.shutdown()
    return cases


def _large_func(config):
    """Build a ~``mb`` MB model, shard it with FSDP2, checkpoint it ``reps`` times the way
    ``mode`` says; return how long each checkpoint call blocked (rank 0's view)."""
    import time

    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    import sgd_torch

    model = _fsdp2_model(config["mb"])
    blocked = []
    for step in range(1, config["reps"] + 1):
        # Training between checkpoints: on a GPU the CPU is free meanwhile, as here (an
        # asynchronous save writes during this time; the next save waits for it if it has not).
        time.sleep(config["interval_s"])
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.001)  # a training step's worth of change
        t = time.perf_counter()
        if config["mode"] == "whole":
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            sgd.save_checkpoint(model=full, step=step)
            del full
        else:
            sgd_torch.save_sharded_checkpoint({"model": model}, blocking=config["mode"] == "sharded", step=step)
        blocked.append(time.perf_counter() - t)
    return {"blocked_s": blocked, "params": sum(p.numel() for p in model.parameters())}  # DTensor: global


class _PeakRSS:
    """Samples this process's resident memory every 10 ms; ``peak_mb`` above the start."""

    def __init__(self):
        self._stop = threading.Event()
        self.start_mb = self._rss_mb()
        self.peak_mb = self.start_mb
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB

    def _run(self):
        while not self._stop.wait(0.01):
            self.peak_mb = max(self.peak_mb, self._rss_mb())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def bench_large(trainer: sgd.Trainer, sizes_mb, reps: int) -> list:
    """Returns the cases, and the interval trained between checkpoints at the largest size."""
    measured, intervals = {}, {}
    for mb in sizes_mb:
        interval = 1.0
        for mode in ("whole", "sharded", "async"):
            with _PeakRSS() as rss:
                out = trainer.run(_large_func, config={"mb": mb, "mode": mode, "reps": reps, "interval_s": interval},
                                  checkpoint_strategy=sgd.CheckpointStrategy(num_to_keep=1))[0]
            if mode == "sharded":  # train between checkpoints longer than a blocking write takes
                interval = max(1.0, 1.5 * max(out["blocked_s"]))
                intervals[mb] = interval
            measured[(mb, mode)] = {"blocked_s": out["blocked_s"], "driver_rss_peak_mb": rss.peak_mb - rss.start_mb,
                                    "params": out["params"]}
            print(f"g. {mb} MB {mode}: blocked {out['blocked_s']}, driver RSS +{rss.peak_mb - rss.start_mb:.0f} MB",
                  flush=True)
    big, small = max(sizes_mb), min(sizes_mb)
    cases = []
    for mb in sizes_mb:
        for mode, label in (("whole", "whole-state (gather + sgd.save_checkpoint)"),
                            ("sharded", "save_sharded_checkpoint, blocking"),
                            ("async", "save_sharded_checkpoint(blocking=False)")):
            m = measured[(mb, mode)]
            median = statistics.median(m["blocked_s"])
            case = {"case": f"g. {mb} MB model, {label}: training blocked per checkpoint",
                    "values_s": m["blocked_s"], "median": median, "unit": "s",
                    "spread": f"{min(m['blocked_s']):.3f}-{max(m['blocked_s']):.3f}; driver RSS peak "
                              f"+{m['driver_rss_peak_mb']:.0f} MB; {m['params'] / 1e6:.0f}M parameters",
                    "driver_rss_peak_mb": m["driver_rss_peak_mb"], "target": "", "met": None}
            if mb == big and mode == "async":
                whole = statistics.median(measured[(big, "whole")]["blocked_s"])
                case["target"] = f"<= 10% of whole-state ({0.1 * whole:.3f} s)"
                case["met"] = median <= 0.1 * whole
            cases.append(case)
    for mode in ("sharded", "async"):
        growth = measured[(big, mode)]["driver_rss_peak_mb"] - measured[(small, mode)]["driver_rss_peak_mb"]
        cases.append({"case": f"g. driver RSS growth, {small} MB -> {big} MB model, {mode}", "median": growth,
                      "unit": "MB", "spread": "peak above the driver's RSS at the start of the run",
                      "target": "<= 100 MB", "met": growth <= 100})
    return cases, intervals[big]


def _keep_cases_not_run(cases: list, only: set) -> list:
    """With ``--only``, the committed results of the other cases stay in the table."""
    import json

    previous = Path(__file__).parent / "results" / "checkpoint.json"
    if only == {"e", "f", "g"} or not previous.exists():
        return cases
    kept = [c for c in json.loads(previous.read_text())["cases"] if c["case"][0] not in only]
    return sorted(kept + cases, key=lambda c: c["case"][0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--large-mb", type=int, default=1024, help="the large model of case g")
    parser.add_argument("--only", choices=["e", "f", "g"], action="append", help="run only these cases")
    parser.add_argument("--no-ray-train", action="store_true", help="case g without Ray Train side by side")
    parser.add_argument("--gpu", action="store_true",
                        help="workers on GPUs (NCCL), as many as there are up to 2; writes checkpoint_gpu.json")
    args = parser.parse_args()
    reps, kills = (3, 2) if args.quick else (5, 4)
    only = set(args.only or ["e", "f", "g"])
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    logdir = Path(tempfile.mkdtemp(prefix="sgd_bench_ckpt_"))
    workers = 2
    if args.gpu:
        import torch

        workers = min(2, torch.cuda.device_count())
        if workers == 0:
            parser.error("--gpu: this machine has no CUDA GPU")
    trainer = sgd.Trainer(backend="torch", num_workers=workers, use_gpu=args.gpu, logdir=logdir, max_retries=-1)
    trainer.start()
    try:
        cases = []
        if "e" in only:
            cases.append(bench_checkpoint(trainer, args.mb, reps))
        if "f" in only:
            cases.append(bench_recovery(trainer, kills))
        if "g" in only:
            large, interval = bench_large(trainer, [10, args.large_mb], 2 if args.quick else 3)
            cases += large
    finally:
        trainer.shutdown()
        ray.shutdown()
    if "g" in only and not args.no_ray_train:
        cases += bench_ray_train(args.large_mb, 2 if args.quick else 3, interval, logdir)
    meta = machine(quick=args.quick)
    if args.gpu:
        import torch

        meta["gpu"] = torch.cuda.get_device_name(0)
        title = (f"sgd checkpoint benchmarks on {meta['gpu']}, {meta['date']}: Python {meta['python']}, "
                 f"Ray {meta['ray']}, torch {meta['torch']}, {workers} worker(s) (NCCL)")
        print(write("checkpoint_gpu", title, meta, cases))
        return 0
    cases = _keep_cases_not_run(cases, only)
    title = (f"sgd checkpoint benchmarks, {meta['date']}: {meta['cpus']} CPUs, Python {meta['python']}, "
             f"Ray {meta['ray']}, torch {meta['torch']}, 2 workers (gloo)")
    print(write("checkpoint", title, meta, cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
