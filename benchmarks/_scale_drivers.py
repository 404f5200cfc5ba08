"""One framework at one worker count for ``bench_scale.py``, in a process of its own.

    python _scale_drivers.py sgd|ray|floor N WORKDIR

It joins the simulated cluster that bench_scale started (``RAY_ADDRESS``), reads
``WORKDIR/config.json`` and writes ``WORKDIR/driver.json``. Every case runs the same work
under each framework; the work itself comes from ``_compare_workload`` where it exists there.

- ``sgd``: start (placed, process group up) / trivial run / report rounds / checkpoint rounds
  (rank 0 saves 10 MB) / recovery after one SIGKILL / worker memory / shutdown, all on one
  started trainer (sgd's workers outlive runs).
- ``ray``: Ray Train's ``TorchTrainer``: one ``fit()`` per case (a fit is its start, run and
  shutdown; Ray Train's workers do not outlive it).
- ``floor``: N plain Ray actors that import torch and join one gloo process group by hand,
  one ``all_reduce``, then are killed: what any library on Ray pays to start N torch workers.
  Before they are killed, the same actors do the least a run of reports can cost (one call per
  actor, which runs the function in a thread and returns its reports, each a small dict and its
  JSON text; the driver writes a line per round): the floor under sgd's runs from the call.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import _compare_workload as workload

MB = 1 << 20
#: Runs of 200 report rounds timed from the call (the median is the figure): on two cores shared
#: by 32 workers a single run varies by half (the driver's full garbage collection, the machine).
ROUNDS_REPEATS = 9


def _rss_mb() -> float:
    """This process's resident memory, from /proc (MB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _spread(n: int, cpu: float) -> Dict[str, Any]:
    return {"resources_per_worker": {"CPU": cpu}, "placement_strategy": "SPREAD"}


# --- the recovery case, shared: announce, get killed, announce again ---------------------------------


def _watch_recovery(folder: Path, n: int, timeout_s: float, failed: Callable[[], Optional[str]]) -> Dict[str, Any]:
    """All ``n`` ranks announced -> SIGKILL the last rank by pid -> all ``n`` announced again
    (each in the training function with the process group working); then tell them to stop."""

    def wait_for(after: float) -> Dict[int, Dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            seen: Dict[int, Dict[str, Any]] = {}
            for path in folder.glob("ready_*.json"):
                entry = json.loads(path.read_text())
                if entry["t"] > after:
                    seen[entry["rank"]] = entry
            if len(seen) == n:
                return seen
            why = failed()
            if why:
                raise RuntimeError(f"the run ended before all {n} ranks were running: {why}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(seen)} of {n} ranks running after {timeout_s:.0f} s")
            time.sleep(0.01)

    first = wait_for(0.0)
    victim = first[n - 1]["pid"]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    again = wait_for(killed_at)
    (folder / "done").touch()
    before = {e["pid"] for e in first.values()}
    return {"recovery_s": max(e["t"] for e in again.values()) - killed_at,
            "new_processes": sum(1 for e in again.values() if e["pid"] not in before)}


def _in_thread(fn: Callable[[], Any]) -> Callable[[], Optional[str]]:
    """Run ``fn`` in a thread; return a probe that says why it ended, if it did."""
    box: Dict[str, Any] = {}

    def target() -> None:
        try:
            fn()
            box["end"] = "finished"
        except BaseException as exc:  # reported to the watcher
            box["end"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    probe = lambda: box.get("end")  # noqa: E731
    probe.thread = thread  # type: ignore[attr-defined]
    return probe


def recovery_loop(config: Dict[str, Any]) -> None:
    """Announce "running, process group works" in a file, then step like a training loop (an
    all_reduce every 20 ms) until bench_scale writes ``done``; every rank leaves at the same
    step (the flag goes through the all_reduce). A survivor's collective fails as soon as a
    peer dies, as in real training."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    rank = dist.get_rank()
    folder = Path(config["dir"])
    workload.write_json(str(folder / f"ready_{rank}_{os.getpid()}.json"),
                        {"rank": rank, "pid": os.getpid(), "t": time.time()})
    deadline = time.monotonic() + config["timeout_s"]
    while True:
        flag = torch.tensor([1.0 if (folder / "done").exists() else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: bench_scale never wrote {folder / 'done'}")
        time.sleep(0.02)


def _checkpoint_state(config: Dict[str, Any]) -> Dict[str, Any]:
    return {"blob": os.urandom(config["ckpt_mb"] * MB)}


# --- sgd ---------------------------------------------------------------------------------------------


def _sgd_rounds(config: Dict[str, Any]) -> None:
    import sgd

    for i in range(config["rounds"]):
        sgd.report(i=i)


def _sgd_buffered(config: Dict[str, Any]) -> None:
    """Every report made at once (the driver's buffer holds them all), then a mark."""
    import sgd

    for i in range(config["rounds"]):
        sgd.report(i=i)
    Path(config["dir"], f"done_{sgd.world_rank()}").touch()


def _sgd_checkpoints(config: Dict[str, Any]) -> List[float]:
    import sgd

    state = _checkpoint_state(config)  # every rank calls save_checkpoint; only rank 0's is sent
    times = []
    for i in range(config["ckpts"]):
        t = time.perf_counter()
        sgd.save_checkpoint(step=i, **state)  # returns once the driver has it persisted
        times.append(time.perf_counter() - t)
    return times


def _sgd_memory(config: Dict[str, Any]) -> float:
    return _rss_mb()


def _sgd_nothing() -> None:
    import sgd

    sgd.report(done=1)


class _CallCounter:
    """Counts the actor calls this driver process makes (``ActorMethod._remote``), by method:
    what a run costs in calls does not depend on the machine's load, its time does."""

    def __init__(self) -> None:
        import collections

        import ray.actor

        self.counts: Dict[str, int] = collections.Counter()
        self._remote = ray.actor.ActorMethod._remote
        counts, remote = self.counts, self._remote

        def counting(method: Any, *args: Any, **kwargs: Any) -> Any:
            counts[method._method_name] += 1
            return remote(method, *args, **kwargs)

        ray.actor.ActorMethod._remote = counting  # type: ignore[method-assign]

    def close(self) -> None:
        import ray.actor

        ray.actor.ActorMethod._remote = self._remote  # type: ignore[method-assign]


def run_sgd(n: int, config: Dict[str, Any], work: Path) -> Dict[str, Any]:
    # Room for every report of the drain case in the workers' buffers (read when sgd is imported).
    os.environ["SGD_MAX_PENDING_RESULTS"] = str(config["rounds"] + 16)
    import sgd

    out: Dict[str, Any] = {}
    trainer = sgd.Trainer(backend="torch", num_workers=n, logdir=work / "sgd", max_retries=1,
                          **_spread(n, config["cpu_per_worker"]))
    t = time.perf_counter()
    trainer.start()
    out["start_s"] = time.perf_counter() - t
    try:
        t = time.perf_counter()
        trainer.run(lambda: workload.trivial(lambda m: sgd.report(**m)))
        out["trivial_run_s"] = time.perf_counter() - t

        # What a run costs on a started trainer (issue 35): the next trivial runs, each timed
        # from run()'s call to its return (the first run above made what a trainer keeps), with
        # the driver's CPU time and its actor calls (what does not depend on the machine's load).
        again, cpu_s, counter = [], [], _CallCounter()
        try:
            for _ in range(5):
                counter.counts.clear()
                c, t = time.process_time(), time.perf_counter()
                trainer.run(_sgd_nothing)
                again.append(time.perf_counter() - t)
                cpu_s.append(time.process_time() - c)
        finally:
            counter.close()
        out["next_run_s"] = again
        out["next_run_cpu_s"] = cpu_s
        out["next_run_calls"] = dict(counter.counts)

        # 200 report rounds from run()'s call: the run's start included (issue 35's measure).
        rates = []
        for _ in range(ROUNDS_REPEATS):
            t = time.perf_counter()
            trainer.run(_sgd_rounds, config={"rounds": 200})
            rates.append(200 / (time.perf_counter() - t))
        out["rounds_from_call_per_s"] = statistics.median(rates)
        out["rounds_from_call_all_per_s"] = rates

        rounds = config["rounds"]

        it = trainer.run_iterator(_sgd_rounds, config={"rounds": rounds})
        next(it)  # the clock starts at the first round: the run's start is timed above
        cpu, t, seen = time.process_time(), time.perf_counter(), 1
        for results in it:
            assert len(results) == n and results[0]["i"] == seen, "rounds out of order"
            seen += 1
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        assert seen == rounds
        out["rounds_per_s"] = (rounds - 1) / wall

        # The driver's own cost per round: the workers make every report first (on a machine
        # with fewer cores than workers they would otherwise compete with the driver for
        # CPU), then the driver takes them all in; rounds/s and CPU per round of that drain.
        marks = work / "buffered"
        marks.mkdir()
        it = trainer.run_iterator(_sgd_buffered, config={"rounds": rounds, "dir": str(marks)})
        next(it)
        deadline = time.monotonic() + config["timeout_s"]
        while len(list(marks.iterdir())) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("the workers did not finish their reports")
            time.sleep(0.05)
        cpu, t, seen = time.process_time(), time.perf_counter(), 1
        for results in it:
            assert len(results) == n and results[0]["i"] == seen, "rounds out of order"
            seen += 1
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        out["driver_rounds_per_s"] = (rounds - 1) / wall
        out["driver_cpu_per_round_us"] = cpu / (rounds - 1) * 1e6

        times = trainer.run(_sgd_checkpoints, config=config)[0]
        out["checkpoint_s"] = times

        out["worker_rss_mb"] = trainer.run(_sgd_memory)
        out["driver_rss_mb"] = _rss_mb()

        folder = work / "recovery"
        folder.mkdir()
        rconfig = {"dir": str(folder), "timeout_s": config["timeout_s"]}
        probe = _in_thread(lambda: trainer.run(recovery_loop, config=rconfig))
        out.update(_watch_recovery(folder, n, config["timeout_s"], probe))
        probe.thread.join(config["timeout_s"])  # type: ignore[attr-defined]
        if probe() != "finished":
            raise RuntimeError(f"the recovery run did not finish: {probe()}")
    finally:
        t = time.perf_counter()
        trainer.shutdown()
        out["shutdown_s"] = time.perf_counter() - t
    out["start_run_shutdown_s"] = out["start_s"] + out["trivial_run_s"] + out["shutdown_s"]
    return out


# --- Ray Train -----------------------------------------------------------------------------------------


def _ray_trivial(config: Dict[str, Any]) -> None:
    import ray.train

    Path(config["dir"], f"in_{_rank()}").write_text(repr(time.time()))
    workload.trivial(ray.train.report)


def _ray_rounds(config: Dict[str, Any]) -> None:
    import ray.train

    t = time.perf_counter()
    for i in range(config["rounds"]):
        ray.train.report({"i": i})
    if _rank() == 0:
        workload.write_json(config["out"], {"loop_s": time.perf_counter() - t})


def _ray_checkpoints(config: Dict[str, Any]) -> None:
    """Ray Train's documented pattern: rank 0 reports a checkpoint directory, the others the
    metrics alone; report returns once Ray has copied it into storage."""
    import tempfile

    import ray.train

    state = _checkpoint_state(config)["blob"]
    times = []
    for i in range(config["ckpts"]):
        t = time.perf_counter()
        if _rank() == 0:
            with tempfile.TemporaryDirectory() as tmp:
                Path(tmp, "blob.bin").write_bytes(state)
                ray.train.report({"step": i}, checkpoint=ray.train.Checkpoint.from_directory(tmp))
        else:
            ray.train.report({"step": i})
        times.append(time.perf_counter() - t)
    Path(config["dir"], f"rss_{_rank()}.json").write_text(json.dumps(_rss_mb()))
    if _rank() == 0:
        workload.write_json(config["out"], {"checkpoint_s": times})


def _rank() -> int:
    import ray.train

    return ray.train.get_context().get_world_rank()


def run_ray(n: int, config: Dict[str, Any], work: Path) -> Dict[str, Any]:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out: Dict[str, Any] = {}
    fits = iter(range(1, 100))

    def fit(fn: Callable[[Dict[str, Any]], None], cfg: Dict[str, Any], failures: int = 0) -> float:
        trainer = TorchTrainer(
            fn, train_loop_config=cfg,
            scaling_config=ScalingConfig(num_workers=n, **_spread(n, config["cpu_per_worker"])),
            run_config=RunConfig(storage_path=str(work / "ray_storage"), name=f"fit_{next(fits)}",
                                 failure_config=FailureConfig(max_failures=failures)),
        )
        t = time.perf_counter()
        trainer.fit()
        return time.perf_counter() - t

    marks = work / "marks"
    marks.mkdir()
    t0 = time.time()
    out["start_run_shutdown_s"] = fit(_ray_trivial, {"dir": str(marks)})
    # Start: until the last worker entered the training function (its process group is up).
    out["start_s"] = max(float(p.read_text()) for p in marks.glob("in_*")) - t0

    rounds = config["ray_rounds"]
    fit(_ray_rounds, {"rounds": rounds, "out": str(work / "rounds.json")})
    out["rounds_per_s"] = rounds / json.loads((work / "rounds.json").read_text())["loop_s"]

    fit(_ray_checkpoints, {**config, "dir": str(marks), "out": str(work / "ckpt.json")})
    out["checkpoint_s"] = json.loads((work / "ckpt.json").read_text())["checkpoint_s"]
    out["worker_rss_mb"] = [json.loads(p.read_text()) for p in sorted(marks.glob("rss_*.json"))]

    folder = work / "recovery"
    folder.mkdir()
    rconfig = {"dir": str(folder), "timeout_s": config["timeout_s"]}
    probe = _in_thread(lambda: fit(recovery_loop, rconfig, failures=1))
    out.update(_watch_recovery(folder, n, config["timeout_s"], probe))
    probe.thread.join(config["timeout_s"])  # type: ignore[attr-defined]
    if probe() != "finished":
        raise RuntimeError(f"the recovery fit did not finish: {probe()}")
    return out


# --- the floor: plain actors, torch, one gloo group --------------------------------------------------


class _Plain:
    def address(self) -> str:
        import socket

        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def join(self, init_method: str, rank: int, world: int) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t.item())

    def leave(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()

    def reports(self, code: bytes, rounds: int) -> List[Any]:
        """A run with ``rounds`` reports, as little as a framework can make it: the function
        (sent pickled, as any framework must) runs in a thread; each report is its metrics, the
        report's count and times, and its JSON text."""
        import pickle

        metric = pickle.loads(code)
        out: List[Any] = []

        def run() -> None:
            last = time.time()
            for i in range(rounds):
                now = time.time()
                row = {"i": metric(i), "_timestamp": int(now), "_time_this_iter_s": now - last,
                       "_training_iteration": i + 1}
                last = now
                out.append((row, json.dumps(row)))

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return out


def _floor_runs(actors: List[Any], rounds: int, repeats: int, results: Path) -> List[float]:
    """Runs of ``rounds`` reports on the floor's actors, each timed from its calls to its last
    line written (one line per round, as sgd's ``results.jsonl``)."""
    import pickle

    import ray

    times = []
    with open(results, "w", buffering=1 << 20) as f:
        for _ in range(repeats):
            t = time.perf_counter()
            code = pickle.dumps(int)
            replies = ray.get([a.reports.remote(code, rounds) for a in actors])
            for round_ in zip(*replies):
                f.write("[" + ", ".join(text for _, text in round_) + "]\n")
            f.flush()
            times.append(time.perf_counter() - t)
    return times


def run_floor(n: int, config: Dict[str, Any], work: Path) -> Dict[str, Any]:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cpu = config["cpu_per_worker"]
    t = time.perf_counter()
    pg = placement_group([{"CPU": cpu}] * n, strategy="SPREAD")
    ray.get(pg.ready())
    cls = ray.remote(_Plain)
    actors = [cls.options(num_cpus=cpu, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote()
              for i in range(n)]
    init = ray.get(actors[0].address.remote())
    totals = ray.get([a.join.remote(init, r, n) for r, a in enumerate(actors)])
    assert totals == [float(n)] * n
    out: Dict[str, Any] = {}
    held = time.perf_counter()
    # The floor under sgd's runs from the call, the same counts as run_sgd's, with the process
    # group up as there: a run with one report, and 200 report rounds.
    out["next_run_s"] = _floor_runs(actors, 1, 5, work / "floor_results.jsonl")
    rates = [config["rounds"] / s for s in _floor_runs(actors, config["rounds"], ROUNDS_REPEATS,
                                                      work / "floor_results.jsonl")]
    out["rounds_from_call_per_s"] = statistics.median(rates)
    out["rounds_from_call_all_per_s"] = rates
    held = time.perf_counter() - held
    ray.get([a.leave.remote() for a in actors])
    for a in actors:
        ray.kill(a)
    remove_placement_group(pg)
    out["start_run_shutdown_s"] = time.perf_counter() - t - held
    return out


def main(argv: List[str]) -> int:
    import ray

    framework, n, work_dir = argv[0], int(argv[1]), Path(argv[2])
    config = json.loads((work_dir / "config.json").read_text())
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    runner = {"sgd": run_sgd, "ray": run_ray, "floor": run_floor}[framework]
    out = runner(n, config, work_dir)
    workload.write_json(str(work_dir / "driver.json"), out)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
