"""Core overhead benchmarks for sgd with the torch backend (gloo, CPU): ``nox -s bench``.

Cases (2 workers on one warm local Ray started once, untimed, with 4 logical CPUs):

a. warm_rerun      ``trainer.run(trivial)`` on an already started trainer; ``trivial``
                   does one ``all_reduce`` and one ``sgd.report``.
b. cold_cycle      ``Trainer(...) -> start() -> run(trivial) -> shutdown()`` end to end.
c. report_latency  time of each ``sgd.report(i=i)`` measured inside the workers
                   (10,000 back-to-back calls per worker).
d. report_tput     reports per second per worker delivered to a driver callback
                   (20,000 per worker), which checks their order and that none is lost.
e. kept_cycle      the cold cycle with ``sgd.keep_workers(2)``: each trainer starts in the
                   processes the previous one left (one untimed cycle first starts them).

Writes ``benchmarks/results/core.json`` and ``core.md`` and prints the table.
``--quick`` uses fewer repetitions and reports (for a smoke run; its numbers are noisier).
No numpy: only what ``nox -s bench`` installs (sgd, ray, torch).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import ray
import torch

import sgd

RESULTS_DIR = Path(__file__).resolve().parent / "results"
NUM_WORKERS = 2
RAY_CPUS = 4


# --- helpers ---------------------------------------------------------------------------


def percentile(values: List[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def new_trainer(logdir: str) -> sgd.Trainer:
    return sgd.Trainer(backend="torch", num_workers=NUM_WORKERS, logdir=logdir)


# --- training functions (run on the workers) ---------------------------------------------


def trivial(config: Dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    sgd.report(total=t.item())


def report_latency(config: Dict[str, Any]) -> Dict[str, float]:
    import time

    n = config["n"]
    lat = [0.0] * n
    clock = time.perf_counter
    for i in range(n):
        t0 = clock()
        sgd.report(i=i)
        lat[i] = clock() - t0
    lat.sort()
    ms = [x * 1000 for x in lat]

    def pct(q: float) -> float:
        pos = (n - 1) * q / 100
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return ms[lo] + (ms[hi] - ms[lo]) * (pos - lo)

    return {"p50_ms": pct(50), "p99_ms": pct(99), "max_ms": ms[-1], "mean_ms": sum(ms) / n}


def report_many(config: Dict[str, Any]) -> None:
    for i in range(config["n"]):
        sgd.report(i=i)


class OrderedCounter(sgd.TrainingCallback):
    """Checks every round: i goes up by exactly 1 and all workers report the same i."""

    def __init__(self) -> None:
        self.count = 0
        self.errors: List[str] = []
        self.first = self.last = 0.0

    def handle_result(self, results: List[Dict[str, Any]], **info: Any) -> None:
        now = time.perf_counter()
        if self.count == 0:
            self.first = now
        self.last = now
        ids = [r["i"] for r in results]
        if len(ids) != NUM_WORKERS or any(i != self.count for i in ids):
            if len(self.errors) < 5:
                self.errors.append(f"round {self.count}: got i={ids}")
        self.count += 1


# --- cases ---------------------------------------------------------------------------------


def case_warm_rerun(trainer: sgd.Trainer, reps: int) -> Dict[str, Any]:
    trainer.run(trivial)  # warm-up: the first run on fresh workers pays one-off costs
    values = []
    for _ in range(reps):
        t0 = time.perf_counter()
        trainer.run(trivial)
        values.append(time.perf_counter() - t0)
    return {
        "what": "trainer.run(all_reduce + 1 report) on a started trainer",
        "unit": "s",
        "values": values,
        "median": statistics.median(values),
        "p90": percentile(values, 90),
        "spread": f"p90 {percentile(values, 90):.3f}",
        "target": "median <= 0.3 s",
        "met": statistics.median(values) <= 0.3,
    }


@contextlib.contextmanager
def timing_of(owner: Any, method: str, into: Dict[str, float], key: str) -> Iterator[None]:
    """Record the wall time of ``owner.method`` calls in ``into[key]`` (only to explain
    where a cold start goes; skipped if sgd's internals no longer have that method)."""
    original = getattr(owner, method, None)
    if original is None:
        yield
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            into[key] = into.get(key, 0.0) + time.perf_counter() - t0

    setattr(owner, method, wrapper)
    try:
        yield
    finally:
        setattr(owner, method, original)


def fresh_torch_import_s() -> float:
    """Wall time of ``import torch.distributed`` in a new Python process: a floor for a cold start,
    since every new worker process pays it once (in the backend setup)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch.distributed"], check=True)
    return time.perf_counter() - t0


def case_cold_cycle(logdir: str, reps: int, budget_s: float) -> Dict[str, Any]:
    """Up to ``reps`` cycles; stops early (after at least 2) once ``budget_s`` is spent, so a
    loaded machine cannot stretch the whole benchmark far past a few minutes."""
    from sgd.group.actors import ActorGroup as BackendExecutor
    from sgd.worker_group import WorkerGroup

    values: List[float] = []
    phases: List[Dict[str, float]] = []
    begin = time.perf_counter()
    for _ in range(reps):
        if len(values) >= 2 and time.perf_counter() - begin > budget_s:
            break
        inner: Dict[str, float] = {}
        with contextlib.ExitStack() as stack:
            stack.enter_context(timing_of(WorkerGroup, "start", inner, "start.workers_s"))
            stack.enter_context(timing_of(BackendExecutor, "_setup", inner, "start.backend_setup_s"))
            t0 = time.perf_counter()
            trainer = new_trainer(logdir)
            trainer.start()
            t1 = time.perf_counter()
            trainer.run(trivial)
            t2 = time.perf_counter()
            trainer.shutdown()
            t3 = time.perf_counter()
        values.append(t3 - t0)
        phases.append({"start_s": t1 - t0, **inner, "run_s": t2 - t1, "shutdown_s": t3 - t2})
    floor = fresh_torch_import_s()

    def med(key: str) -> float:
        return statistics.median(p.get(key, float("nan")) for p in phases)

    note = (
        f"cold cycle medians: workers up {med('start.workers_s'):.2f} s, backend setup (torch import + gloo) "
        f"{med('start.backend_setup_s'):.2f} s, run {med('run_s'):.2f} s, shutdown {med('shutdown_s'):.2f} s; "
        f"`import torch.distributed` alone in a fresh process took {floor:.2f} s on this machine just after"
        + (f"; stopped after {len(values)} of {reps} cycles (time budget)" if len(values) < reps else "")
    )
    return {
        "what": "Trainer() -> start() -> run(trivial) -> shutdown()",
        "note": note,
        "unit": "s",
        "values": values,
        "phases": phases,
        "phases_note": "start.workers_s: placement group + actor processes + ranks; "
        "start.backend_setup_s: torch import in the new workers + gloo rendezvous",
        "fresh_process_torch_import_s": floor,
        "reps_asked": reps,
        "reps_done": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "spread": f"{min(values):.2f}-{max(values):.2f}",
        "target": "median <= 3 s",
        "met": statistics.median(values) <= 3.0,
    }


def case_kept_cycle(logdir: str, reps: int) -> Dict[str, Any]:
    """``reps`` cold cycles with kept worker processes (sgd.keep_workers), after one that starts them."""
    sgd.keep_workers(NUM_WORKERS)
    try:
        trainer = new_trainer(logdir)
        trainer.start()
        trainer.run(trivial)
        trainer.shutdown()
        values: List[float] = []
        for _ in range(reps):
            t0 = time.perf_counter()
            trainer = new_trainer(logdir)
            trainer.start()
            trainer.run(trivial)
            trainer.shutdown()
            values.append(time.perf_counter() - t0)
        kept = sgd.kept_workers()
    finally:
        sgd.keep_workers(0)
    return {
        "what": "Trainer() -> start() -> run(trivial) -> shutdown() with sgd.keep_workers(2)",
        "note": f"{kept} processes kept after the last cycle; each cycle ran in the same two processes",
        "unit": "s",
        "values": values,
        "median": statistics.median(values),
        "spread": f"{min(values):.3f}-{max(values):.3f}",
        "target": "median <= 0.3 s",
        "met": statistics.median(values) <= 0.3,
    }


def case_report_latency(trainer: sgd.Trainer, n: int) -> Dict[str, Any]:
    per_worker = trainer.run(report_latency, config={"n": n})
    p50s = [w["p50_ms"] for w in per_worker]
    p99s = [w["p99_ms"] for w in per_worker]
    median = statistics.median(p50s)
    return {
        "what": f"one sgd.report(i=i) timed in the worker, {n} back-to-back per worker",
        "unit": "ms",
        "reports_per_worker": n,
        "per_worker": per_worker,
        "values": p50s,
        "median": median,
        "p99": max(p99s),
        "spread": f"p99 {max(p99s):.3f}",
        "target": "p50 <= 1 ms",
        "met": median <= 1.0,
    }


def case_report_throughput(trainer: sgd.Trainer, n: int, reps: int) -> Dict[str, Any]:
    values, runs = [], []
    ok = True
    for _ in range(reps):
        counter = OrderedCounter()
        t0, cpu0 = time.perf_counter(), time.process_time()
        trainer.run(report_many, config={"n": n}, callbacks=[counter])
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        span = counter.last - counter.first
        rate = (counter.count - 1) / span if span > 0 else float("nan")
        lost = n - counter.count
        ok = ok and lost == 0 and not counter.errors
        values.append(rate)
        runs.append(
            {
                "delivered": counter.count,
                "lost": lost,
                "order_errors": counter.errors,
                "first_to_last_s": span,
                "run_wall_s": wall,
                "driver_cpu_s": cpu,  # well below run_wall_s: the driver mostly waits for the workers
                "reports_per_s_per_worker": rate,
            }
        )
    median = statistics.median(values)
    return {
        "what": f"{n} reports per worker delivered in order to a driver callback",
        "unit": "reports/s per worker",
        "reports_per_worker": n,
        "runs": runs,
        "values": values,
        "median": median,
        "min": min(values),
        "max": max(values),
        "spread": f"{min(values):,.0f}-{max(values):,.0f}",
        "all_delivered_in_order": ok,
        "target": ">= 5,000/s per worker, none lost",
        "met": ok and median >= 5000,
    }


# --- output ----------------------------------------------------------------------------------


def machine_info() -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch.__version__,
        "sgd": sgd.__version__,
        "ray_logical_cpus": RAY_CPUS,
        "num_workers": NUM_WORKERS,
    }
    if hasattr(os, "getloadavg"):
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


def fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "ms":
        return f"{value:.3f} ms"
    return f"{value:,.0f}/s"


def table(cases: Dict[str, Dict[str, Any]]) -> str:
    lines = ["| case | median | spread | target | met? |", "|---|---|---|---|---|"]
    for name, c in cases.items():
        lines.append(
            f"| {name} | {fmt(c['median'], c['unit'])} | {c['spread']} | {c['target']} | "
            f"{'yes' if c['met'] else 'NO'} |"
        )
    notes = [f"- {name}: {c['note']}" for name, c in cases.items() if c.get("note")]
    return "\n".join(lines + ([""] + notes if notes else []))


def main() -> int:
    parser = argparse.ArgumentParser(description="sgd core overhead benchmarks")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and reports (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        warm_reps, cold_reps, cold_budget_s, lat_n, tput_n, tput_reps = 5, 2, 30.0, 2_000, 5_000, 1
    else:
        warm_reps, cold_reps, cold_budget_s, lat_n, tput_n, tput_reps = 20, 5, 75.0, 10_000, 20_000, 3

    # untimed; address="local": always a fresh local Ray, never one started elsewhere with `ray start`
    ray.init(address="local", num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=True)
    info = machine_info()
    info["quick"] = args.quick
    logdir = tempfile.mkdtemp(prefix="sgd_bench_")  # run directories go here, not ~/sgd_results
    cases: Dict[str, Dict[str, Any]] = {}

    def timed(name: str, fn: Callable[[], Dict[str, Any]]) -> None:
        t0 = time.perf_counter()
        cases[name] = fn()
        cases[name]["bench_wall_s"] = time.perf_counter() - t0
        c = cases[name]
        print(f"{name}: median {fmt(c['median'], c['unit'])} ({c['spread']}) in {c['bench_wall_s']:.1f}s", flush=True)

    t_all = time.perf_counter()
    try:
        trainer = new_trainer(logdir)
        trainer.start()
        try:
            timed("a. warm re-run", lambda: case_warm_rerun(trainer, warm_reps))
            timed("c. report latency (worker)", lambda: case_report_latency(trainer, lat_n))
            timed("d. report throughput (driver)", lambda: case_report_throughput(trainer, tput_n, tput_reps))
        finally:
            trainer.shutdown()
        timed("b. cold start+run+shutdown", lambda: case_cold_cycle(logdir, cold_reps, cold_budget_s))
        timed("e. kept-worker start+run+shutdown", lambda: case_kept_cycle(logdir, warm_reps))
    finally:
        ray.shutdown()
        shutil.rmtree(logdir, ignore_errors=True)
    info["bench_wall_s"] = time.perf_counter() - t_all
    if hasattr(os, "getloadavg"):
        info["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]

    cases = {k: cases[k] for k in sorted(cases)}  # a, b, c, d, e
    md = table(cases)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "core.json").write_text(json.dumps({"machine": info, "cases": cases}, indent=2) + "\n")
    header = (
        f"sgd core benchmarks, {info['date']}: {info['cpu_count']} CPUs, Python {info['python']}, "
        f"Ray {info['ray']}, torch {info['torch']}, {NUM_WORKERS} workers (gloo)" + (", --quick" if args.quick else "")
    )
    (RESULTS_DIR / "core.md").write_text(f"{header}\n\n{md}\n")
    print(f"\n{header}\n\n{md}\n\nwrote {RESULTS_DIR / 'core.json'} and core.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
