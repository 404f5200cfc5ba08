"""Cost of one report round in JsonLoggerCallback as the file grows, against a full atomic rewrite.

    python packages/sgd-loggers/benchmarks/bench_json_logger.py [--workers 4] [--out results.json]

Times ``handle_result`` for rounds of ``--workers`` result dicts (10 metrics each) when the
file already holds 0, 1 000 and 10 000 rounds, and the same for the obvious alternative:
rewriting the whole list to a temporary file and renaming it over the old one each round.
Prints a table; ``--out`` also writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from sgd_loggers import JsonLoggerCallback


def make_round(it: int, workers: int):
    return [
        {**{f"metric_{k}": 1.0 / (it + k + 1) for k in range(7)}, "_timestamp": 1_700_000_000 + it,
         "_time_this_iter_s": 0.25, "_training_iteration": it}
        for _ in range(workers)
    ]


def time_appends(directory: Path, prefill: int, samples: int, workers: int) -> float:
    cb = JsonLoggerCallback(workers_to_log=None)
    cb.start_training(logdir=str(directory), config={})
    for it in range(1, prefill + 1):
        cb.handle_result(make_round(it, workers))
    times = []
    for it in range(prefill + 1, prefill + samples + 1):
        start = time.perf_counter()
        cb.handle_result(make_round(it, workers))
        times.append(time.perf_counter() - start)
    cb.finish_training()
    return statistics.median(times)


def time_rewrites(directory: Path, prefill: int, samples: int, workers: int) -> float:
    rounds = [make_round(it, workers) for it in range(1, prefill + 1)]
    path, tmp = directory / "rewrite.json", directory / ".rewrite.json.tmp"
    times = []
    for it in range(prefill + 1, prefill + samples + 1):
        start = time.perf_counter()
        rounds.append(make_round(it, workers))
        tmp.write_text(json.dumps(rounds))
        os.replace(tmp, path)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 1_000, 10_000])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as d:
            append = time_appends(Path(d), size, args.samples, args.workers)
        with tempfile.TemporaryDirectory() as d:
            rewrite = time_rewrites(Path(d), size, args.samples, args.workers)
        rows.append({"rounds_in_file": size, "append_ms": append * 1e3, "rewrite_ms": rewrite * 1e3})
    print(f"{'rounds in file':>14}  {'append (ms/round)':>17}  {'full rewrite (ms/round)':>23}")
    for r in rows:
        print(f"{r['rounds_in_file']:>14}  {r['append_ms']:>17.3f}  {r['rewrite_ms']:>23.3f}")
    if args.out:
        args.out.write_text(json.dumps({"workers": args.workers, "samples": args.samples, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
