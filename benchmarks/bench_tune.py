"""An 8-trial Tune grid over a 2-worker torch trainer, one trial at a time, 5 reports per
trial, three ways in one run: sgd with actor reuse (``TuneConfig(reuse_actors=True)``: every
trial on the same sgd workers), sgd without, and Ray Train (a Tune function that runs
``TorchTrainer(...).fit()``, Ray Train's documented way to tune a trainer).

    python benchmarks/bench_tune.py [--quick]      # --quick: 3 trials, a smoke run

Each case runs in a fresh Python process with its own local Ray (``address="local"``,
4 logical CPUs), timed from ``Tuner.fit()`` to its return; results in
``benchmarks/results/tune.json`` and ``tune.md``. Targets (issue 22): sgd with reuse ≥ 10×
faster than Ray Train and ≥ 2× faster than sgd without reuse.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

import _results

REPORTS = 5
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_AIR_NEW_OUTPUT": "0", "PYTHONUNBUFFERED": "1"}
CASES = {
    "sgd_reuse": "sgd, reuse_actors=True",
    "sgd": "sgd, no actor reuse",
    "ray": "Ray Train (TorchTrainer.fit() per trial)",
}


def workload(report: Any, prepare_model: Any, config: Dict[str, Any]) -> None:
    """The same for every framework: a DDP step and a report, REPORTS times."""
    import torch

    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for i in range(REPORTS):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        report({"loss": loss.item(), "i": i})


def sgd_loop(config: Dict[str, Any]) -> None:
    import sgd
    import sgd_torch

    workload(lambda m: sgd.report(**m), sgd_torch.prepare_model, config)


def ray_loop(config: Dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch

    workload(ray.train.report, ray.train.torch.prepare_model, config)


def run_case(case: str, trials: int, work: Path) -> Dict[str, Any]:
    import ray
    from ray import tune

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    lrs = [0.01 * (i + 1) for i in range(trials)]
    tune_config = tune.TuneConfig(max_concurrent_trials=1, reuse_actors=case == "sgd_reuse")
    run_config = tune.RunConfig(storage_path=str(work / "tune"), name=case, verbose=0)
    if case == "ray":
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        def trainable(config: Dict[str, Any]) -> None:
            result = TorchTrainer(
                ray_loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(storage_path=str(work / "ray_train"),
                                     name=f"trial_{tune.get_context().get_trial_id()}"),
            ).fit()
            tune.report(result.metrics or {"done": 1})  # Train v2 keeps metrics only with a checkpoint

        trainable = tune.with_resources(trainable, {"CPU": 1})  # the trial's driver; Ray Train places its workers
    else:
        import sgd

        trainable = sgd.Trainer(backend="torch", num_workers=2).to_tune_trainable(sgd_loop)
    tuner = tune.Tuner(trainable, param_space={"lr": tune.grid_search(lrs)},
                       tune_config=tune_config, run_config=run_config)
    start = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - start
    errors = [str(e)[:500] for e in grid.errors]
    ray.shutdown()
    return {"case": case, "wall_s": wall, "trials": len(grid), "errors": errors,
            "per_trial_s": wall / max(1, trials)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 trials instead of 8 (a smoke run)")
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), help="run these cases only")
    args = parser.parse_args()
    trials = args.trials or (3 if args.quick else 8)
    if args.case:  # one case, in this (fresh) process
        with tempfile.TemporaryDirectory(prefix="bench_tune_") as work:
            Path(args.out).write_text(json.dumps(run_case(args.case, trials, Path(work))))
        return 0

    results: Dict[str, Dict[str, Any]] = {}
    load_before = _results.loadavg()
    for case in args.only or list(CASES):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = Path(f.name)
        print(f"bench_tune: {CASES[case]}, {trials} trials ...", flush=True)
        proc = subprocess.run([sys.executable, __file__, "--case", case, "--trials", str(trials), "--out", str(out)],
                              env={**os.environ, **ENV})
        if proc.returncode != 0 or not out.read_text():
            print(f"bench_tune: {case} failed (exit code {proc.returncode})", file=sys.stderr)
            return 1
        results[case] = json.loads(out.read_text())
        out.unlink()
        print(f"bench_tune: {case}: {results[case]['wall_s']:.1f} s", flush=True)

    meta = _results.machine(trials=trials, reports_per_trial=REPORTS, workers_per_trial=2, quick=args.quick,
                            loadavg_before=load_before, loadavg_after=_results.loadavg())
    reuse, plain, ray_ = (results.get(c, {}).get("wall_s") for c in ("sgd_reuse", "sgd", "ray"))
    lines = [
        f"Tune grid of {trials} trials, 2 torch workers each (gloo, CPU), one trial at a time, "
        f"{REPORTS} reports per trial; {meta['date']}, {meta['cpus']} CPUs ({meta['cpu_model']}), "
        f"Ray {meta['ray']}, torch {meta['torch']}; load average before/after "
        f"{meta['loadavg_before']} / {meta['loadavg_after']}"
        + (" (--quick: a smoke run, not a measurement)" if args.quick else ""),
        "",
        "| case | wall time | per trial | errors |",
        "|---|---|---|---|",
    ]
    for case, r in results.items():
        lines.append(f"| {CASES[case]} | {r['wall_s']:.1f} s | {r['per_trial_s']:.2f} s | {len(r['errors'])} |")
    targets = []
    if reuse and ray_:
        targets.append(("sgd reuse vs Ray Train", ray_ / reuse, "≥ 10× faster"))
    if reuse and plain:
        targets.append(("sgd reuse vs sgd without reuse", plain / reuse, "≥ 2× faster"))
    if targets:
        lines += ["", "| comparison | speed-up | target | met? |", "|---|---|---|---|"]
        for name, ratio, target in targets:
            goal = 10 if "Ray" in name else 2
            lines.append(f"| {name} | {ratio:.1f}× | {target} | {'yes' if ratio >= goal else '**NO**'} |")
    table = "\n".join(lines) + "\n"
    _results.save("tune", {"machine": meta, "cases": results,
                           "speedups": {name: ratio for name, ratio, _ in targets}}, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
