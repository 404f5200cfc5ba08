"""How sgd grows with the number of workers, side by side with Ray Train: ``nox -s bench``.

A multi-node Ray cluster simulated on this machine (``ray.cluster_utils.Cluster``: a head node
and 4 worker nodes, each a raylet of its own), the workers spread over the nodes
(``placement_strategy="SPREAD"``) with a fraction of a CPU each, so that 32 fit. For each
N in 2, 4, 8, 16, 32 (``--quick``: 2 and 8) and each framework, one driver process
(``_scale_drivers.py``) measures:

- start (group placed, process group up), a trivial run (one all_reduce, one report), shutdown;
- what a run costs on a started trainer (sgd), each from ``run()``'s call: a run with one report
  (median of 5, with the driver's CPU time and the actor calls it made: neither depends on the
  machine's load), and 200 report rounds (median of 9, the run's start included);
- report rounds per second delivered to the driver, every worker reporting, in order; the
  driver's CPU time per round (all of the driver process: Ray's threads included);
- a checkpoint round: rank 0 saves 10 MB; the time ``save_checkpoint`` (sgd) / ``report(...,
  checkpoint=)`` (Ray Train) takes, that is until it is persisted;
- recovery: SIGKILL of the last rank (the workers step like a training loop: an all_reduce
  every 20 ms) until all N ranks run the training function again with a working process group;
- resident memory per worker process.

and the floor: N plain Ray actors that import torch and join one gloo group by hand, then do the
least a run of reports can cost (one call per actor that runs the function in a thread and returns
its reports; the driver writes a line per round): the floor under sgd's runs from the call.

Writes ``scale.json``, ``scale.md`` and ``scale.png`` (log-log, time vs N) to
``benchmarks/results/`` (or ``--out``), and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from _results import RESULTS, loadavg, machine, save
from bench_compare import _stop

HERE = Path(__file__).resolve().parent
DRIVERS = HERE / "_scale_drivers.py"
NODES = 4
NODE_CPUS = 8  # logical: 32 workers at 1 CPU each fit, with room for Ray Train's controller
#: Ray Train's four fits (trivial, reports, checkpoints, recovery) at one N get this long in all.
RAY_TRAIN_LIMIT_S = 600
LABEL = {"sgd": "sgd", "ray": "Ray Train", "floor": "floor (plain actors + gloo)"}


def _cluster() -> Any:
    from ray.cluster_utils import Cluster

    # Each worker process gets one intra-op thread, whichever framework starts it.
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    for _ in range(NODES):
        cluster.add_node(num_cpus=NODE_CPUS)
    cluster.wait_for_nodes()
    return cluster


def run_one(address: str, framework: str, n: int, config: Dict[str, Any], work: Path,
            timeout_s: float) -> Dict[str, Any]:
    """One framework at one N in its own driver process; its measurements or why it failed."""
    work.mkdir(parents=True)
    (work / "config.json").write_text(json.dumps(config))
    env = dict(os.environ, RAY_ADDRESS=address, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    with open(work / "log.txt", "wb") as log:
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(DRIVERS), framework, str(n), str(work)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=HERE, start_new_session=True)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return {"error": f"did not finish within {timeout_s:.0f} s", "log": str(work / "log.txt")}
    if proc.returncode != 0:
        tail = (work / "log.txt").read_text(errors="replace").strip().splitlines()[-3:]
        return {"error": f"exit status {proc.returncode}: {' | '.join(tail)}", "log": str(work / "log.txt")}
    out = json.loads((work / "driver.json").read_text())
    out["process_wall_s"] = time.perf_counter() - t
    out["loadavg_end"] = loadavg()  # a busy machine shows here before it shows as noise
    return out


def summarise(out: Dict[str, Any]) -> Dict[str, Any]:
    """The figures of one run: medians where a run has several samples."""
    if "error" in out:
        return out
    s = {k: out[k] for k in ("start_s", "start_run_shutdown_s", "rounds_per_s", "driver_rounds_per_s",
                             "driver_cpu_per_round_us",
                             "recovery_s", "new_processes", "trivial_run_s", "shutdown_s",
                             "rounds_from_call_per_s") if k in out}
    if out.get("next_run_s"):
        s["next_run_s"] = statistics.median(out["next_run_s"])
    if out.get("next_run_cpu_s"):
        s["next_run_cpu_s"] = statistics.median(out["next_run_cpu_s"])
    if out.get("next_run_calls"):
        s["next_run_calls"] = sum(out["next_run_calls"].values())
    if out.get("checkpoint_s"):
        s["checkpoint_s"] = statistics.median(out["checkpoint_s"])
    if out.get("worker_rss_mb"):
        s["worker_rss_mb"] = statistics.median(out["worker_rss_mb"])
    return s


def _fmt(value: Optional[float], unit: str) -> str:
    if value is None:
        return "—"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "us":
        return f"{value:,.0f} µs"
    if unit == "MB":
        return f"{value:,.0f} MB"
    if unit == "n":
        return f"{value:.0f}"
    if unit == "ms":
        return f"{value * 1e3:,.1f} ms"
    return f"{value:.2f} s"


ROWS = [  # (figure, label, unit, better)
    ("start_run_shutdown_s", "start + trivial run + shutdown", "s", "low"),
    ("start_s", "start (placed, process group up)", "s", "low"),
    ("next_run_s", "a run on a started trainer (one report), from run()'s call", "ms", "low"),
    ("next_run_cpu_s", "driver CPU of that run", "ms", "low"),
    ("next_run_calls", "actor calls the driver makes for that run", "n", "low"),
    ("rounds_from_call_per_s", "report rounds/s from run()'s call (its start included)", "/s", "high"),
    ("rounds_per_s", "report rounds/s (every worker reports)", "/s", "high"),
    ("driver_rounds_per_s", "rounds/s the driver takes in (reports made beforehand)", "/s", "high"),
    ("driver_cpu_per_round_us", "driver CPU per round (of that)", "us", "low"),
    ("checkpoint_s", "checkpoint round, rank 0 saves 10 MB", "s", "low"),
    ("recovery_s", "recovery after SIGKILL of one worker", "s", "low"),
    ("new_processes", "worker processes that recovery started", "n", "low"),
    ("worker_rss_mb", "memory per worker process (RSS)", "MB", "low"),
]


def table(results: Dict[str, Dict[int, Dict[str, Any]]], sizes: List[int]) -> str:
    lines = ["| figure | framework | " + " | ".join(f"N={n}" for n in sizes) + " |",
             "|---|---|" + "---|" * len(sizes)]
    for key, label, unit, _ in ROWS:
        for fw in ("sgd", "ray", "floor"):
            runs = results.get(fw, {})
            if not any(key in r for r in runs.values()):
                continue
            cells = []
            for n in sizes:
                r = runs.get(n, {})
                cells.append("failed" if "error" in r else _fmt(r.get(key), unit))
            lines.append(f"| {label} | {LABEL[fw]} | " + " | ".join(cells) + " |")
    failures = [f"- {LABEL[fw]} at N={n}: {r['error']}" for fw, runs in results.items()
                for n, r in runs.items() if "error" in r]
    return "\n".join(lines + ([""] + failures if failures else [])) + "\n"


def targets(results: Dict[str, Dict[int, Dict[str, Any]]], sizes: List[int]) -> List[str]:
    """The issue's targets at the largest N, each with what was measured."""
    n, lines = max(sizes), []
    sgd, ray, floor = (results.get(fw, {}).get(n, {}) for fw in ("sgd", "ray", "floor"))
    small = results.get("sgd", {}).get(min(sizes), {})
    if "start_run_shutdown_s" in sgd and "start_run_shutdown_s" in floor:
        ratio = sgd["start_run_shutdown_s"] / floor["start_run_shutdown_s"]
        lines.append(f"- start + trivial run + shutdown at N={n}: {ratio:.2f}× the floor (target ≤ 1.1×)")
    if "rounds_per_s" in sgd:
        lines.append(f"- report rounds/s at N={n}: {sgd['rounds_per_s']:,.0f} end to end, "
                     f"{sgd.get('driver_rounds_per_s', float('nan')):,.0f} taken in by the driver (target ≥ 2,000)")
    if "next_run_s" in sgd and "next_run_s" in small:
        lines.append(f"- a run on a started trainer: {small['next_run_s']:.3f} s at N={min(sizes)} (target ≤ 0.05 s), "
                     f"{sgd['next_run_s']:.3f} s at N={n} (target ≤ 0.15 s at N=32)")
    if "rounds_from_call_per_s" in sgd:
        beside = (f"; the floor on plain actors: {floor['rounds_from_call_per_s']:,.0f}"
                  if "rounds_from_call_per_s" in floor else "")
        lines.append(f"- report rounds/s at N={n} from run()'s call: {sgd['rounds_from_call_per_s']:,.0f} "
                     f"(target ≥ 2,000){beside}")
    if "recovery_s" in sgd and "recovery_s" in small:
        lines.append(f"- recovery at N={n}: {sgd['recovery_s'] / small['recovery_s']:.2f}× the N={min(sizes)} "
                     "recovery (target ≤ 1.5×)")
    for key, label, _, better in ROWS:
        if key in sgd and key in ray and key not in ("worker_rss_mb", "new_processes"):
            factor = ray[key] / sgd[key] if better == "low" else sgd[key] / ray[key]
            lines.append(f"- {label} at N={n}: sgd {factor:.1f}× better than Ray Train (target ≥ 5×)")
    return lines


def plot(results: Dict[str, Dict[int, Dict[str, Any]]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [("start_run_shutdown_s", "start + run + shutdown (s)"), ("rounds_per_s", "report rounds/s"),
              ("recovery_s", "recovery after one SIGKILL (s)"), ("checkpoint_s", "10 MB checkpoint round (s)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (key, title) in zip(axes, panels):
        for fw, style in (("sgd", "o-"), ("ray", "s--"), ("floor", "^:")):
            points = sorted((n, r[key]) for n, r in results.get(fw, {}).items() if key in r)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], style, label=LABEL[fw])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers (N)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 2 and 8, fewer rounds (a smoke run)")
    parser.add_argument("--sizes", help="comma-separated worker counts (default 2,4,8,16,32)")
    parser.add_argument("--frameworks", default="sgd,floor,ray")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep", type=Path, metavar="SCALE_JSON",
                        help="take the frameworks not measured now from this earlier scale.json (after a "
                             "change to sgd, re-measure only sgd); the table says which run each comes from")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([2, 8] if args.quick else [2, 4, 8, 16, 32])
    frameworks = args.frameworks.split(",")
    config = {"rounds": 500 if args.quick else 3000, "ray_rounds": 5 if args.quick else 20, "ckpts": 3,
              "ckpt_mb": 10, "timeout_s": 300}

    import ray

    load_start = loadavg()
    cluster = _cluster()
    work_root = Path(tempfile.mkdtemp(prefix="sgd_bench_scale_"))
    results: Dict[str, Dict[int, Dict[str, Any]]] = {fw: {} for fw in frameworks}
    raw: Dict[str, Dict[int, Dict[str, Any]]] = {fw: {} for fw in frameworks}
    try:
        for n in sizes:
            config["cpu_per_worker"] = min(1.0, NODES * NODE_CPUS / max(n, 1) / 2)
            for fw in frameworks:
                limit = RAY_TRAIN_LIMIT_S if fw == "ray" else 240 + 20 * n
                out = run_one(cluster.address, fw, n, config, work_root / f"{fw}_{n}", limit)
                raw[fw][n] = out
                results[fw][n] = summarise(out)
                print(f"{LABEL[fw]:>28} N={n:<3} {json.dumps(results[fw][n])}", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(work_root, ignore_errors=True)

    meta = machine(nodes=NODES + 1, node_cpus=NODE_CPUS, sizes=sizes, quick=args.quick,
                   loadavg_start=load_start, loadavg_end=loadavg(),
                   **{k: v for k, v in config.items() if k != "cpu_per_worker"})
    provenance = ""
    if args.keep:
        earlier = json.loads(args.keep.read_text())
        kept = [fw for fw in earlier["results"] if fw not in frameworks]
        for fw in kept:
            results[fw] = {int(n): r for n, r in earlier["results"][fw].items()}
            raw[fw] = {int(n): r for n, r in earlier.get("raw", {}).get(fw, {}).items()}
        meta["kept"] = {fw: earlier["machine"]["date"] for fw in kept}
        meta["kept_machine"] = earlier["machine"]
        provenance = (f" {', '.join(LABEL[fw] for fw in kept)}: measured {earlier['machine']['date']} (load at "
                      f"the end {earlier['machine'].get('loadavg_end')}); {', '.join(LABEL[fw] for fw in frameworks)}: "
                      f"measured {meta['date']}, same machine and cluster layout.")
    body = table(results, sizes)
    goal = targets(results, sizes)
    markdown = (f"# Scale: sgd and Ray Train from {min(sizes)} to {max(sizes)} workers\n\n"
                f"{NODES} simulated nodes + head on one machine ({meta['cpus']} cores, load at the start "
                f"{meta['loadavg_start']}, at the end {meta['loadavg_end']}); workers spread over the "
                f"nodes.{provenance}\n\n{body}\n"
                + "\n".join(goal) + "\n")
    save("scale", {"machine": meta, "results": results, "raw": raw}, markdown, args.out)
    plotted = plot(results, args.out / "scale.png")
    print(markdown)
    print(f"wrote {args.out / 'scale.json'}, scale.md" + (", scale.png" if plotted else ""))
    failed = [1 for runs in results.values() for r in runs.values() if "error" in r]
    return 1 if failed and "sgd" in frameworks and any("error" in r for r in results["sgd"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
