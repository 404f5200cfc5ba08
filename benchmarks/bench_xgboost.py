"""Distributed XGBoost, three ways side by side in one run: sgd's ``XGBoostTrainer``, Ray Train
2.60's ``ray.train.xgboost.XGBoostTrainer``, and single-process XGBoost with the same total
threads. Synthetic binary classification, 1M rows × 50 features by default, 2 workers, 100
boosting rounds (issue 38).

    python benchmarks/bench_xgboost.py [--rows N] [--rounds R] [--repeat K]

The data is generated once (seeded) and written as parquet files; every case reads the same
files the same way: each worker reads every ``world_size``-th file with pyarrow (the single
process reads them all), builds an ``xgboost.QuantileDMatrix`` (whose quantile sketch the
workers merge) and boosts with ``hist`` trees, reporting each round's training log-loss through
its framework's report callback (``sgd_xgboost.XGBoostReportCallback`` /
``ray.train.xgboost.RayTrainReportCallback``, their documented defaults: a report every round,
the model checkpointed at the end). Each worker runs ``nthread=1``; the single process
``nthread=2``.

Each case runs in a fresh Python process with its own local Ray (``address="local"``,
4 logical CPUs). Timed: **start-to-model**, from before ``ray.init`` to the booster in the
driver's hands (read back from the run's checkpoint); also the part after ``ray.init``
(``fit``). Accuracy and log-loss are measured afterwards, outside the timing, on 200k held-out
rows. Results in ``benchmarks/results/xgboost.json`` and ``xgboost.md``. Targets (issue 38):
sgd's start-to-model ≤ 0.5× Ray Train's and ≤ 1.2× single-process XGBoost's; accuracy equal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import _results

FEATURES = 50
WORKERS = 2
FILES = 8
TEST_ROWS = 200_000
PARAMS = {"objective": "binary:logistic", "eval_metric": "logloss", "tree_method": "hist", "max_depth": 6,
          "eta": 0.1, "max_bin": 256}
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_AIR_NEW_OUTPUT": "0", "PYTHONUNBUFFERED": "1",
       "RAY_TRAIN_V2_ENABLED": "1"}
CASES = {
    "sgd": "sgd XGBoostTrainer, 2 workers × 1 thread",
    "ray": "Ray Train 2.60 XGBoostTrainer, 2 workers × 1 thread",
    "single": "single-process XGBoost, 2 threads",
}


# --- the data -------------------------------------------------------------------------------


def _make(rows: int, seed: int) -> Tuple[Any, Any]:
    """Features and labels: a noisy nonlinear rule of a dozen features, the rest noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, FEATURES), dtype=np.float32)
    logit = (x[:, 0] + 0.8 * x[:, 1] * x[:, 2] + np.sin(2 * x[:, 3]) + 0.5 * x[:, 4] ** 2 - 0.5
             + 0.3 * x[:, 5:12].sum(axis=1) + rng.standard_normal(rows, dtype=np.float32))
    return x, (logit > 0).astype(np.float32)


def write_data(folder: Path, rows: int) -> None:
    """``folder/train/part_N.parquet`` (``FILES`` files) and ``folder/test.parquet``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = [f"f{i}" for i in range(FEATURES)]

    def table(x: Any, y: Any) -> Any:
        return pa.table({**{n: x[:, i] for i, n in enumerate(names)}, "label": y})

    (folder / "train").mkdir(parents=True)
    x, y = _make(rows, seed=0)
    for i, rows_of_part in enumerate(np.array_split(np.arange(rows), FILES)):
        pq.write_table(table(x[rows_of_part], y[rows_of_part]), folder / "train" / f"part_{i:02d}.parquet")
    pq.write_table(table(*_make(TEST_ROWS, seed=1)), folder / "test.parquet")


def load_part(folder: str, rank: int, world: int) -> Tuple[Any, Any]:
    """This worker's files (every ``world``-th), as a float32 matrix and the labels."""
    import numpy as np
    import pyarrow.parquet as pq

    files = sorted(Path(folder, "train").glob("*.parquet"))[rank::world]
    tables = [pq.read_table(f) for f in files]
    x = np.concatenate([np.column_stack([t.column(f"f{i}").to_numpy() for i in range(FEATURES)]) for t in tables])
    y = np.concatenate([t.column("label").to_numpy() for t in tables])
    return x, y


def boost(folder: str, rank: int, world: int, rounds: int, nthread: int, callbacks: List[Any]) -> Any:
    """The same work for every case: this rank's rows, a QuantileDMatrix, ``rounds`` trees."""
    import xgboost

    x, y = load_part(folder, rank, world)
    dtrain = xgboost.QuantileDMatrix(x, y, max_bin=PARAMS["max_bin"], nthread=nthread)
    return xgboost.train({**PARAMS, "nthread": nthread}, dtrain, num_boost_round=rounds,
                         evals=[(dtrain, "train")], verbose_eval=False, callbacks=callbacks)


# --- the cases, each in its own process -------------------------------------------------------


def sgd_loop(config: Dict[str, Any]) -> None:
    import sgd
    from sgd_xgboost import XGBoostReportCallback

    ctx = sgd.get_context()
    boost(config["folder"], ctx.get_world_rank(), ctx.get_world_size(), config["rounds"], 1,
          [XGBoostReportCallback(num_boost_round=config["rounds"])])


def ray_loop(config: Dict[str, Any]) -> None:
    import ray.train
    from ray.train.xgboost import RayTrainReportCallback

    ctx = ray.train.get_context()
    boost(config["folder"], ctx.get_world_rank(), ctx.get_world_size(), config["rounds"], 1,
          [RayTrainReportCallback()])


def run_case(case: str, folder: str, rounds: int, work: Path, model_path: str) -> Dict[str, Any]:
    start = time.perf_counter()
    if case == "single":
        booster = boost(folder, 0, 1, rounds, WORKERS, [])
        init = 0.0
    else:
        import ray

        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        init = time.perf_counter() - start
        config = {"folder": folder, "rounds": rounds}
        if case == "sgd":
            import sgd
            from sgd_xgboost import XGBoostTrainer

            result = XGBoostTrainer(sgd_loop, train_loop_config=config,
                                    scaling_config=sgd.ScalingConfig(num_workers=WORKERS),
                                    run_config=sgd.RunConfig(storage_path=str(work), name="sgd", verbose=0)).fit()
        else:
            from ray.train import RunConfig, ScalingConfig
            from ray.train.xgboost import XGBoostTrainer as RayXGBoostTrainer

            result = RayXGBoostTrainer(ray_loop, train_loop_config=config,
                                       scaling_config=ScalingConfig(num_workers=WORKERS),
                                       run_config=RunConfig(storage_path=str(work), name="ray")).fit()
        if case == "sgd":
            booster = XGBoostTrainer.get_model(result.checkpoint)
        else:
            from ray.train.xgboost import RayTrainReportCallback

            booster = RayTrainReportCallback.get_model(result.checkpoint)
    total = time.perf_counter() - start
    booster.save_model(model_path)
    return {"case": case, "start_to_model_s": total, "ray_init_s": init, "fit_s": total - init,
            "rounds": booster.num_boosted_rounds()}


def evaluate(folder: Path, model_path: str) -> Dict[str, float]:
    import numpy as np
    import pyarrow.parquet as pq
    import xgboost

    t = pq.read_table(folder / "test.parquet")
    x = np.column_stack([t.column(f"f{i}").to_numpy() for i in range(FEATURES)])
    y = t.column("label").to_numpy()
    booster = xgboost.Booster(model_file=model_path)
    p = np.clip(booster.predict(xgboost.DMatrix(x)), 1e-7, 1 - 1e-7)
    return {"accuracy": float(((p > 0.5) == (y > 0.5)).mean()),
            "logloss": float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())}


# --- the driver -------------------------------------------------------------------------------


def _fmt(values: List[float]) -> str:
    return f"{statistics.median(values):.1f} s" + (f" ({min(values):.1f}–{max(values):.1f})" if len(values) > 1 else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="training rows (default 1M; fewer: a smoke run)")
    parser.add_argument("--rounds", type=int, default=100, help="boosting rounds (default 100)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case, interleaved (default 1)")
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), help="run these cases only")
    parser.add_argument("--quick", action="store_true", help="100k rows, 20 rounds: a smoke run")
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args, _unknown = parser.parse_known_args()  # nox passes every benchmark the same arguments
    if args.quick:
        args.rows, args.rounds = min(args.rows, 100_000), min(args.rounds, 20)
    if args.case:  # one case, in this (fresh) process
        with tempfile.TemporaryDirectory(prefix="bench_xgboost_") as work:
            result = run_case(args.case, args.folder, args.rounds, Path(work), args.model)
        Path(args.out).write_text(json.dumps(result))
        return 0

    cases = args.only or list(CASES)
    runs: Dict[str, List[Dict[str, Any]]] = {c: [] for c in cases}
    load_before = _results.loadavg()
    with tempfile.TemporaryDirectory(prefix="bench_xgboost_data_") as tmp:
        folder = Path(tmp)
        t = time.perf_counter()
        write_data(folder, args.rows)
        print(f"bench_xgboost: {args.rows:,} rows × {FEATURES} features written in {time.perf_counter() - t:.1f} s",
              flush=True)
        for attempt in range(args.repeat):
            for case in cases:
                out, model = folder / f"{case}_{attempt}.json", str(folder / f"{case}_{attempt}.ubj")
                print(f"bench_xgboost: {CASES[case]} ({attempt + 1}/{args.repeat}) ...", flush=True)
                proc = subprocess.run([sys.executable, __file__, "--case", case, "--folder", str(folder),
                                       "--rounds", str(args.rounds), "--model", model, "--out", str(out)],
                                      env={**os.environ, **ENV})
                if proc.returncode != 0 or not out.exists():
                    print(f"bench_xgboost: {case} failed (exit code {proc.returncode})", file=sys.stderr)
                    return 1
                run = {**json.loads(out.read_text()), **evaluate(folder, model)}
                runs[case].append(run)
                print(f"bench_xgboost: {case}: {run['start_to_model_s']:.1f} s, accuracy {run['accuracy']:.4f}",
                      flush=True)

    meta = _results.machine(rows=args.rows, features=FEATURES, rounds=args.rounds, workers=WORKERS,
                            test_rows=TEST_ROWS, params=PARAMS, repeat=args.repeat,
                            xgboost=__import__("xgboost").__version__,
                            loadavg_before=load_before, loadavg_after=_results.loadavg())
    smoke = args.rows < 1_000_000 or args.rounds < 100
    lines = [
        f"XGBoost, {args.rows:,} rows × {FEATURES} features, {args.rounds} rounds (hist, depth 6), "
        f"{WORKERS} workers × 1 thread vs one process × 2 threads; {meta['date']}, {meta['cpus']} CPUs "
        f"({meta['cpu_model']}), Ray {meta['ray']}, XGBoost {meta['xgboost']}; {args.repeat} run(s) per case "
        f"(median, min–max); load average before/after {meta['loadavg_before']} / {meta['loadavg_after']}"
        + (" (fewer rows or rounds than the issue's: a smoke run)" if smoke else ""),
        "",
        "| case | start-to-model | of which ray.init | test accuracy | test log-loss |",
        "|---|---|---|---|---|",
    ]
    for case, rs in runs.items():
        lines.append(f"| {CASES[case]} | {_fmt([r['start_to_model_s'] for r in rs])} | "
                     f"{_fmt([r['ray_init_s'] for r in rs]) if case != 'single' else '—'} | "
                     f"{statistics.median(r['accuracy'] for r in rs):.4f} | "
                     f"{statistics.median(r['logloss'] for r in rs):.4f} |")
    med = {c: statistics.median(r["start_to_model_s"] for r in rs) for c, rs in runs.items()}
    fit = {c: statistics.median(r["fit_s"] for r in rs) for c, rs in runs.items()}
    targets = []
    if "sgd" in med and "ray" in med:
        targets.append(("sgd / Ray Train, start-to-model", med["sgd"] / med["ray"], 0.5))
    if "sgd" in med and "single" in med:
        targets.append(("sgd / single process, start-to-model", med["sgd"] / med["single"], 1.2))
        targets.append(("sgd / single process, Ray already up (fit only)", fit["sgd"] / fit["single"], 1.2))
    if targets:
        lines += ["", "| comparison | ratio | target | met? |", "|---|---|---|---|"]
        for name, ratio, goal in targets:
            lines.append(f"| {name} | {ratio:.2f}× | ≤ {goal}× | {'yes' if ratio <= goal else '**NO**'} |")
    table = "\n".join(lines) + "\n"
    _results.save("xgboost", {"machine": meta, "runs": runs,
                              "ratios": {name: ratio for name, ratio, _ in targets}}, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
