"""sgd side by side with Ray Train and torchrun, on this machine, in one run: ``nox -s bench``.

2 workers, CPU, gloo, ``OMP_NUM_THREADS=1`` everywhere. Cases (docs/performance.md says
what each number includes):

1. trivial   process group + one all_reduce + one report: cold (a fresh driver process,
             Ray start included) and warm (again in the same driver).
2. report    back-to-back reports timed in the worker: p50/p99 latency and throughput.
             1,000 per run under sgd; Ray Train's take ~2 s each, so only a handful.
3. ddp       the same MLP, data, seed, batch and optimizer (``_compare_workload.py``):
             steady-state seconds per step after warm-up.
4. ckpt      the same run goes on with a 100 MB state dict checkpointed every N steps:
             time added by each checkpoint.
5. recovery  SIGKILL of rank 1 until both ranks run the training function again.

Every (case, framework, repetition) runs in its own driver process (``_compare_drivers.py``);
the frameworks alternate within each repetition and the first one rotates. Writes
``compare.json``, ``compare.md`` and ``compare.png`` (needs matplotlib) to
``benchmarks/results/`` or ``--out DIR``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import _compare_workload as workload
from _results import RESULTS, loadavg, machine, save
from bench_core import percentile

HERE = Path(__file__).resolve().parent
DRIVERS = HERE / "_compare_drivers.py"
FRAMEWORKS = ("sgd", "ray", "torchrun")
LABEL = {"sgd": "sgd", "ray": "Ray Train", "torchrun": "torchrun"}
CASES = {"trivial": ("sgd", "ray", "torchrun"), "report": ("sgd", "ray"),
         "ddp": ("sgd", "ray", "torchrun"), "recovery": ("sgd", "ray", "torchrun")}
THREADS_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclasses.dataclass
class Plan:
    """How much of everything; ``--quick`` is a smoke run, not a measurement."""

    reps: int = 3
    sgd_warm_reps: int = 10  # warm re-runs per sgd driver (the first, cold run warms it)
    ray_warm_reps: int = 1  # each Ray Train fit takes ~15 s
    sgd_reports: int = 1000
    ray_reports: int = 8  # ~2 s each
    ddp_warmup: int = 30
    ddp_steps: int = 1500  # ~30 s of steady-state training on an idle 2-core machine
    ckpts: int = 3
    # ~3 s apart: Ray Train's controller takes a report only every 2 s, and a checkpoint that
    # waits for the previous report to be taken would time the queue, not the checkpoint
    ckpt_every: int = 150
    ckpt_mb: int = 100

    @classmethod
    def quick(cls) -> Plan:
        return cls(reps=1, sgd_warm_reps=5, ray_warm_reps=1, ray_reports=3, ddp_warmup=10, ddp_steps=150,
                   ckpts=2, ckpt_every=100)


# --- running one driver ---------------------------------------------------------------------------


class RunFailed(RuntimeError):
    pass


def _command(framework: str, case: str, work: Path) -> List[str]:
    if framework != "torchrun":
        return [sys.executable, str(DRIVERS), framework, case, str(work)]
    restarts = ["--max-restarts", "1"] if case == "recovery" else []
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *restarts,
            str(DRIVERS), "torchrun", case, str(work)]


def _config(plan: Plan, framework: str, case: str, work: Path) -> Dict[str, Any]:
    if case == "trivial":
        return {"warm_reps": plan.sgd_warm_reps if framework == "sgd" else plan.ray_warm_reps}
    if case == "report":
        return {"n": plan.sgd_reports if framework == "sgd" else plan.ray_reports, "out": str(work / "worker.json")}
    if case == "ddp":
        return {"warmup": plan.ddp_warmup, "steps": plan.ddp_steps, "ckpts": plan.ckpts,
                "ckpt_every": plan.ckpt_every, "ckpt_mb": plan.ckpt_mb, "out": str(work / "worker.json")}
    (work / "recovery").mkdir()
    return {"dir": str(work / "recovery"), "timeout_s": 300}


def _timeout_s(plan: Plan, case: str) -> float:
    if case == "ddp":  # generous: a loaded machine makes steps several times slower
        return 300 + 0.5 * (plan.ddp_warmup + plan.ddp_steps + plan.ckpts * plan.ckpt_every)
    return 420 if case == "recovery" else 300


def _stop(proc: subprocess.Popen) -> None:
    """End a driver we started and everything it started (its own session), TERM then KILL."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            pass


def run_driver(plan: Plan, framework: str, case: str, work: Path) -> Dict[str, Any]:
    """Run one case under one framework in a new process; its driver.json and worker.json."""
    work.mkdir(parents=True)
    config = _config(plan, framework, case, work)
    (work / "config.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # never join another cluster
    env.update(THREADS_ENV, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    if framework == "torchrun" and case == "recovery":
        # Restarted workers sharing torchrun's rendezvous store can read the dead worker's gloo
        # address and fail to connect (pytorch/pytorch#135712); torch's own switch avoids it.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    deadline = time.monotonic() + _timeout_s(plan, case)
    with open(work / "log.txt", "wb") as log:
        env["BENCH_T_SPAWN"] = repr(time.time())
        t0 = time.perf_counter()
        proc = subprocess.Popen(_command(framework, case, work), env=env, stdout=log, stderr=subprocess.STDOUT,
                                cwd=HERE, start_new_session=True)
        try:
            extra = _watch_recovery(proc, Path(config["dir"]), deadline) if case == "recovery" else {}
            proc.wait(max(deadline - time.monotonic(), 1))
        except (subprocess.TimeoutExpired, RunFailed) as exc:
            _stop(proc)
            raise RunFailed(f"{exc}; log: {work / 'log.txt'}") from None
        finally:
            if proc.poll() is None:
                _stop(proc)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RunFailed(f"exit status {proc.returncode}; log: {work / 'log.txt'}")
    out: Dict[str, Any] = {"process_wall_s": wall, **extra}
    for name in ("driver.json", "worker.json"):
        if (work / name).exists():
            out[name.split(".")[0]] = json.loads((work / name).read_text())
    return out


def _watch_recovery(proc: subprocess.Popen, folder: Path, deadline: float) -> Dict[str, Any]:
    """Both ranks up -> SIGKILL rank 1 (by pid) -> both ranks up again; then tell them to stop."""

    def ready(after: float) -> Optional[Dict[int, Dict[str, Any]]]:
        seen = {}
        for path in folder.glob("ready_*.json"):
            entry = json.loads(path.read_text())
            if entry["t"] > after:
                seen[entry["rank"]] = entry
        return seen if len(seen) == 2 else None

    def wait_for(after: float) -> Dict[int, Dict[str, Any]]:
        while True:
            found = ready(after)
            if found:
                return found
            if proc.poll() is not None:
                raise RunFailed(f"the job ended (status {proc.returncode}) before both ranks were running")
            if time.monotonic() > deadline:
                raise RunFailed("timed out waiting for both ranks to run")
            time.sleep(0.01)

    first = wait_for(0.0)
    time.sleep(0.5)  # both ranks well inside the training function
    victim = first[1]["pid"]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    again = wait_for(killed_at)
    (folder / "done").touch()
    return {"recovery_s": max(e["t"] for e in again.values()) - killed_at, "killed_pid": victim,
            "new_pids": [again[r]["pid"] for r in sorted(again)]}


# --- what each case measures ------------------------------------------------------------------------


def _trivial(out: Dict[str, Any]) -> Dict[str, Any]:
    d = out["driver"]
    m = {"cold_s": d["cold_s"], "process_wall_s": out["process_wall_s"]}
    if "warm_s" in d:
        m["warm_s"] = statistics.median(d["warm_s"])
        m["warm_all_s"] = d["warm_s"]
    m.update({k: d[k] for k in ("import_s", "ray_init_s", "start_s", "first_run_s", "shutdown_s") if k in d})
    if "first_run_s" in d:  # the first trainer on the fresh Ray: Ray Train's fit() starts and stops its workers
        m["first_trainer_s"] = d["first_run_s"] + d.get("start_s", 0.0) + d.get("shutdown_s", 0.0)
    return m


def _report(out: Dict[str, Any]) -> Dict[str, Any]:
    w = out["worker"]
    ms = [x * 1000 for x in w["latencies_s"]]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "max_ms": max(ms), "n": len(ms),
            "per_s": len(ms) / w["loop_s"], "run_s": out["driver"]["run_s"], "threads": w["threads"]}


def _ddp(out: Dict[str, Any]) -> Dict[str, Any]:
    w = out["worker"]
    steps = w["durations_s"]
    phase = w["phase_durations_s"]
    marks = set(w["phase_ckpt_indices"])
    plain = [d for i, d in enumerate(phase) if i not in marks]
    base = statistics.median(plain)
    added = [phase[i] - base for i in sorted(marks)]
    mean_step = w["timed_s"] / len(steps)
    m = {
        "ms_per_step": mean_step * 1000,
        "step_p50_ms": percentile(steps, 50) * 1000,
        "step_p90_ms": percentile(steps, 90) * 1000,
        "timed_s": w["timed_s"],
        "final_loss": w["final_loss"],
        "threads": w["threads"],
        "ckpt_added_s": statistics.median(added) if added else None,
        "ckpt_added_all_s": added,
        # the whole checkpoint phase against as many plain steps: also counts slower steps after one
        "ckpt_added_phase_s": (w["phase_s"] - len(phase) * mean_step) / len(marks) if marks else None,
        "state_mb": w["state_bytes"] / 2**20,
    }
    if "driver" in out:
        m["driver_cpu_s"] = out["driver"]["driver_cpu_s"]
    return m


def _recovery(out: Dict[str, Any]) -> Dict[str, Any]:
    return {"recovery_s": out["recovery_s"], "killed_pid": out["killed_pid"], "new_pids": out["new_pids"]}


EXTRACT: Dict[str, Callable[[Dict[str, Any]], Dict[str, Any]]] = {
    "trivial": _trivial, "report": _report, "ddp": _ddp, "recovery": _recovery}


@dataclasses.dataclass
class Row:
    """One line of the table: a metric of one case, for the frameworks it applies to."""

    case: str
    metric: str
    label: str
    unit: str  # "s", "ms" or "/s"
    frameworks: Tuple[str, ...]
    target: str = "—"
    #: met when (sgd's median if "sgd", else sgd's time ratio to that framework) <= the number
    limit: Optional[Tuple[str, float]] = None

    @property
    def higher_is_better(self) -> bool:
        return self.unit == "/s"


ROWS = [
    Row("trivial", "cold_s", "1. trivial job, cold", "s", FRAMEWORKS, "≥ 5× faster than Ray Train", ("ray", 0.2)),
    Row("trivial", "first_trainer_s", "1. trivial job, first trainer, Ray running", "s", ("sgd", "ray")),
    Row("trivial", "warm_s", "1. trivial job, warm re-run", "s", ("sgd", "ray"), "sgd ≤ 0.3 s", ("sgd", 0.3)),
    Row("report", "p50_ms", "2. report latency p50 (worker)", "ms", ("sgd", "ray"), "sgd ≤ 1 ms", ("sgd", 1.0)),
    Row("report", "p99_ms", "2. report latency p99 (worker)", "ms", ("sgd", "ray")),
    Row("report", "per_s", "2. report throughput (worker)", "/s", ("sgd", "ray")),
    Row("ddp", "ms_per_step", "3. DDP step, steady state", "ms", FRAMEWORKS, "≤ 1.03× torchrun", ("torchrun", 1.03)),
    Row("ddp", "ckpt_added_s", "4. checkpoint 100 MB, added time", "s", FRAMEWORKS),
    Row("recovery", "recovery_s", "5. recovery after SIGKILL", "s", FRAMEWORKS),
]


# --- summary, table, chart ------------------------------------------------------------------------------


def summarize(runs: Dict[str, Dict[str, List[Dict[str, Any]]]]) -> List[Dict[str, Any]]:
    """Per row: median, min and max over repetitions per framework, sgd's time ratios, target."""
    rows = []
    for row in ROWS:
        if row.case not in runs:
            continue
        stats: Dict[str, Dict[str, Any]] = {}
        for fw in row.frameworks:
            values = [r[row.metric] for r in runs[row.case].get(fw, []) if r.get(row.metric) is not None]
            failed = sum(1 for r in runs[row.case].get(fw, []) if "error" in r)
            if values:
                stats[fw] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                             "values": values, "failed": failed}
            else:
                stats[fw] = {"median": None, "failed": failed}
        medians = {fw: s["median"] for fw, s in stats.items() if s["median"] is not None}
        ratios: Dict[str, float] = {}
        if "sgd" in medians:
            for other in ("ray", "torchrun"):
                if other in medians and medians[other] > 0 and medians["sgd"] > 0:
                    # always a ratio of times (for throughput: of time per report): < 1 is sgd faster
                    ratios[other] = (medians[other] / medians["sgd"] if row.higher_is_better
                                     else medians["sgd"] / medians[other])
        met: Optional[bool] = None
        if row.limit is not None:
            who, limit = row.limit
            value = medians.get("sgd") if who == "sgd" else ratios.get(who)
            met = value is not None and value <= limit  # a failed framework cannot meet it
        rows.append({"case": row.case, "metric": row.metric, "label": row.label, "unit": row.unit,
                     "stats": stats, "sgd_time_ratio": ratios, "target": row.target, "met": met,
                     "limit": row.limit})
    return rows


def _num(value: float, unit: str) -> str:
    if unit == "/s":
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    if value >= 10_000:
        return f"{value:,.0f}"
    return f"{value:.4g}" if value >= 1 else f"{value:.3g}"


def _fmt(value: float, unit: str) -> str:
    return f"{_num(value, unit)}/s" if unit == "/s" else f"{_num(value, unit)} {unit}"


def _cell(s: Optional[Dict[str, Any]], unit: str) -> str:
    if s is None:
        return "n/a"
    if s["median"] is None:
        return f"failed ({s['failed']}×)"
    text = _fmt(s["median"], unit)
    if len(s["values"]) > 1:
        text += f" [{_num(s['min'], unit)}–{_num(s['max'], unit)}]"
    return text + (f", {s['failed']} failed" if s["failed"] else "")


def _ratio(r: Optional[float]) -> str:
    if r is None:
        return "—"
    if r < 0.5:
        return f"{r:.2g}× ({1 / r:.1f}× faster)" if r > 0.1 else f"{r:.2g}× ({1 / r:,.0f}× faster)"
    if r >= 2:
        return f"{r:.3g}× (sgd slower)"
    return f"{r:.3f}× ({abs(r - 1) * 100:.0f}% {'faster' if r < 1 else 'slower'})"


def markdown(meta: Dict[str, Any], plan: Plan, rows: List[Dict[str, Any]], notes: List[str]) -> str:
    title = (f"sgd vs Ray Train vs torchrun, {meta['date']}: {meta['cpus']} CPUs ({meta['cpu_model']}), "
             f"Python {meta['python']}, Ray {meta['ray']}, torch {meta['torch']}, 2 workers, gloo, "
             f"OMP_NUM_THREADS=1; median [min–max] of {plan.reps} repetition{'s' if plan.reps > 1 else ''}"
             + (" (--quick: a smoke run, not a measurement)" if meta.get("quick") else ""))
    lines = [title, "",
             "| case | sgd | Ray Train | torchrun | sgd ÷ Ray Train | sgd ÷ torchrun | target | met? |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [_cell(r["stats"].get(fw), r["unit"]) for fw in FRAMEWORKS]
        ratios = [_ratio(r["sgd_time_ratio"].get(fw)) for fw in ("ray", "torchrun")]
        met = {None: "—", True: "yes", False: "**NO**"}[r["met"]]
        lines.append(f"| {r['label']} | " + " | ".join(cells + ratios) + f" | {r['target']} | {met} |")
    return "\n".join([*lines, "", *[f"- {n}" for n in notes]]) + "\n"


def _median_of(runs: List[Dict[str, Any]], key: str) -> Optional[float]:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def notes_for(plan: Plan, runs: Dict[str, Dict[str, List[Dict[str, Any]]]], missed: List[str],
              meta: Dict[str, Any]) -> List[str]:
    notes = [f"Ratios compare times (for throughput: time per report); below 1 means sgd is faster. Each "
             f"number comes from a driver process of its own; the frameworks alternate, the first one rotating. "
             f"Load average {meta['loadavg_at_start']} at the start, {meta['loadavg_at_end']} at the end. "
             f"What each case includes, and why a target is missed: docs/performance.md."]
    trivial = runs.get("trivial", {})
    if trivial:
        def phases(fw: str) -> str:
            keys = [("import_s", "Python + imports"), ("ray_init_s", "ray.init"), ("start_s", "trainer.start"),
                    ("first_run_s", "run" if fw == "sgd" else "fit"), ("shutdown_s", "trainer.shutdown")]
            return ", ".join(f"{label} {v:.2f} s" for key, label in keys
                             if (v := _median_of(trivial.get(fw, []), key)) is not None)

        notes.append(f"1. Cold: from launching the command to the result in hand (`run`/`fit` returned; torchrun: "
                     f"rank 0 past the all_reduce), Python start, imports and Ray start included, teardown not. "
                     f"Medians: sgd {phases('sgd')}; Ray Train {phases('ray')}. First trainer: the same job on "
                     f"the Ray the driver just started, without Ray start or imports (sgd: start + run + shutdown; "
                     f"Ray Train: `fit()`, which starts and stops its workers). Warm: again in the same driver, "
                     f"`trainer.run` on the started trainer ({plan.sgd_warm_reps} per driver) or a new "
                     f"`TorchTrainer.fit()` ({plan.ray_warm_reps} per driver); torchrun has no warm mode.")
    if "report" in runs:
        notes.append(f"2. {plan.sgd_reports:,} back-to-back reports per sgd run, {plan.ray_reports} per Ray Train "
                     f"run (each takes ~2 s: more would only make the benchmark long), each timed on rank 0; "
                     f"throughput = reports / loop time on rank 0. With {plan.ray_reports} reports Ray Train's "
                     f"p99 is close to its maximum. torchrun has no report channel.")
    ddp = runs.get("ddp", {})
    if ddp:
        losses = {fw: _median_of(ddp.get(fw, []), "final_loss") for fw in ddp}
        same = len({round(v, 6) for v in losses.values() if v is not None}) == 1
        timed = _median_of([r for fw in ddp for r in ddp[fw]], "timed_s")
        threads = {json.dumps(r["threads"], sort_keys=True) for fw in ddp for r in ddp[fw] if "threads" in r}
        job = workload.DDP_DEFAULTS
        notes.append(f"3. MLP {job['in_dim']}-{job['hidden']}-{job['hidden']}-{job['classes']}, batch "
                     f"{job['batch']} per worker, SGD with momentum, plain `DistributedDataParallel`: the same "
                     f"code (`_compare_workload.py`) in all three; {plan.ddp_warmup} warm-up steps, then "
                     f"{plan.ddp_steps} steps timed on rank 0 (median {timed or 0:.0f} s); seconds per step = "
                     f"timed seconds / steps. Loss after the timed steps "
                     + ("identical in every framework" if same else f"NOT identical: {losses}") + "; worker threads "
                     + (f"identical in every framework: {threads.pop()}" if len(threads) == 1 else f"differ: {threads}")
                     + ".")
        notes.append(f"4. The same run then checkpoints a {plan.ckpt_mb} MiB state dict (model, optimizer, "
                     f"filler) every {plan.ckpt_every} steps, {plan.ckpts} times; added time = duration of the "
                     f"step with the checkpoint minus the median plain step of that phase. sgd: "
                     f"`sgd.save_checkpoint` (written, fsynced and renamed into place when it returns); Ray "
                     f"Train: `torch.save` into a temporary directory + `ray.train.report(checkpoint=...)` (copied "
                     f"into storage_path, no fsync); torchrun: rank 0 `torch.save`, then `dist.barrier()` (no "
                     f"fsync).")
    if "recovery" in runs:
        notes.append("5. From `os.kill(<rank 1 pid>, SIGKILL)` to both ranks of the new group running the "
                     "training function again, past a first all_reduce. sgd `max_retries=1`, Ray Train "
                     "`FailureConfig(max_failures=1)`, torchrun `--max-restarts 1` (with "
                     "`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, see docs/performance.md).")
    notes += [f"Target missed: {m}." for m in missed]
    return notes


def chart(rows: List[Dict[str, Any]], path: Path, meta: Dict[str, Any]) -> Optional[str]:
    """A bar chart of sgd's time ratios, with the ratio targets; returns why it was skipped, if it was."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        path.unlink(missing_ok=True)  # an older chart would contradict the new table
        return "matplotlib is not installed: compare.png skipped (pip install matplotlib)"
    shown = [r for r in rows if r["sgd_time_ratio"]]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(shown) + 2))
    height = 0.38
    for k, (other, color) in enumerate((("ray", "tab:orange"), ("torchrun", "tab:blue"))):
        ys = [i + (k - 0.5) * height for i in range(len(shown))]
        values = [r["sgd_time_ratio"].get(other) for r in shown]
        ax.barh([y for y, v in zip(ys, values) if v], [v for v in values if v], height=height, color=color,
                label=f"sgd ÷ {LABEL[other]}")
        for y, v in zip(ys, values):
            if v:
                ax.text(v * 1.15, y, f"{v:.3g}×", va="center", fontsize=8)
        targets = [(y, r["limit"][1]) for y, r in zip(ys, shown) if r["limit"] and r["limit"][0] == other]
        for j, (y, limit) in enumerate(targets):
            ax.plot([limit, limit], [y - height / 2, y + height / 2], color="red", linewidth=2.5,
                    label="target (at most)" if j == 0 and k == 0 else None)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(shown)), [r["label"] for r in shown])
    ax.invert_yaxis()
    ax.set_xlabel("sgd's time ÷ the other framework's (log scale; below 1: sgd is faster)")
    ax.set_title(f"sgd vs Ray Train vs torchrun, 2 workers, CPU, gloo\n{meta['date']}, {meta['cpus']} CPUs, "
                 f"Ray {meta['ray']}, torch {meta['torch']}" + (", --quick (smoke run)" if meta.get("quick") else ""),
                 fontsize=9)
    left, right = ax.get_xlim()
    ax.set_xlim(left, right * 4)  # room for the value labels
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.09 - 0.3 / len(shown)), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# --- main ---------------------------------------------------------------------------------------------


def measure(plan: Plan, cases: List[str], frameworks: List[str], scratch: Path,
            keep: bool) -> Tuple[Dict[str, Any], int]:
    """Every case, repetition and framework, in that nesting; the extracted results and the failures.
    A driver's folder (checkpoints, logs) is removed once its results are read, unless ``keep``
    or it failed."""
    runs: Dict[str, Dict[str, List[Dict[str, Any]]]] = {}
    failures = 0
    begin = time.perf_counter()
    print(f"bench_compare: {', '.join(cases)}; {plan.reps} repetition(s); scratch {scratch}", flush=True)
    for n, case in enumerate(cases, 1):
        chosen = [fw for fw in CASES[case] if fw in frameworks]
        runs[case] = {fw: [] for fw in chosen}
        for rep in range(plan.reps):
            order = chosen[rep % len(chosen):] + chosen[: rep % len(chosen)]
            for fw in order:
                t = time.perf_counter()
                work = scratch / f"{case}_{rep}_{fw}"
                try:
                    result = EXTRACT[case](run_driver(plan, fw, case, work))
                    if not keep:
                        shutil.rmtree(work, ignore_errors=True)
                except (RunFailed, KeyError, ValueError, OSError) as exc:
                    failures += 1
                    result = {"error": f"{type(exc).__name__}: {exc}"}
                runs[case][fw].append(result)
                print(f"[{n}/{len(cases)} {case} {rep + 1}/{plan.reps}] {LABEL[fw]:9s} {_progress(case, result)}"
                      f"  ({time.perf_counter() - t:.0f} s, {time.perf_counter() - begin:.0f} s so far)", flush=True)
    return runs, failures


def publish(meta: Dict[str, Any], plan: Plan, runs: Dict[str, Any], out: Path) -> None:
    """compare.json, compare.md and compare.png in ``out``; prints the table."""
    rows = summarize(runs)
    missed = [f"{r['label']} ({r['target']})" for r in rows if r["met"] is False]
    md = markdown(meta, plan, rows, notes_for(plan, runs, missed, meta))
    save("compare", {"machine": meta, "rows": rows, "runs": runs}, md, out)
    skipped = chart(rows, out / "compare.png", meta)
    print("\n" + md)
    print(f"wrote {out / 'compare.json'}, compare.md" + (f"; {skipped}" if skipped else ", compare.png"))


def main() -> int:
    parser = argparse.ArgumentParser(description="sgd vs Ray Train vs torchrun (2 workers, CPU, gloo)")
    parser.add_argument("--quick", action="store_true", help="1 repetition, a short DDP run (a smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where compare.json/.md/.png go")
    parser.add_argument("--reps", type=int, help="repetitions of each case per framework")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help=f"comma-separated subset of {','.join(FRAMEWORKS)} (for a partial re-run)")
    parser.add_argument("--keep", action="store_true", help="keep the drivers' folders and logs")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="measure nothing: write the table and chart again from a compare.json")
    args = parser.parse_args()
    if args.render:
        data = json.loads(args.render.read_text())
        publish(data["machine"], Plan(**data["machine"]["plan"]), data["runs"], args.out)
        return 0
    plan = Plan.quick() if args.quick else Plan()
    if args.reps:
        plan.reps = args.reps
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    for kind, asked, known in (("case", cases, CASES), ("framework", frameworks, FRAMEWORKS)):
        if set(asked) - set(known):
            parser.error(f"unknown {kind}(s) {sorted(set(asked) - set(known))}; choose from {','.join(known)}")

    meta = machine(quick=args.quick, loadavg_at_start=loadavg(), plan=dataclasses.asdict(plan),
                   threads_env=THREADS_ENV)
    scratch = Path(tempfile.mkdtemp(prefix="sgd_bench_compare_"))
    begin = time.perf_counter()
    runs, failures = measure(plan, cases, frameworks, scratch, args.keep)
    meta.update(loadavg_at_end=loadavg(), bench_wall_s=round(time.perf_counter() - begin, 1))
    publish(meta, plan, runs, args.out)
    print(f"{meta['bench_wall_s']:.0f} s in all")
    if args.keep or failures:
        print(f"driver folders and logs kept in {scratch}" + ("" if args.keep else " (those that failed)"))
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failures else 0


def _progress(case: str, result: Dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED: {result['error']}"
    if case == "trivial":
        warm = f", warm {result['warm_s']:.3f} s" if "warm_s" in result else ""
        return f"cold {result['cold_s']:.2f} s{warm}"
    if case == "report":
        return f"p50 {result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms, {result['per_s']:,.0f}/s ({result['n']})"
    if case == "ddp":
        return (f"{result['ms_per_step']:.2f} ms/step over {result['timed_s']:.0f} s, checkpoint "
                f"+{result['ckpt_added_s']:.3f} s, loss {result['final_loss']:.5f}")
    return f"recovered in {result['recovery_s']:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
