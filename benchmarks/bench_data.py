"""Ray Data into the training loop (`nox -s bench`).

g. Rows/s and MB/s through ``sgd.get_dataset_shard().iter_torch_batches`` on 2 workers (the
   dataset streamed and split across them), against Ray Data's own ``iter_torch_batches`` over
   the same dataset in one process. Target: >= 0.9x.
h. The same with ``DatasetConfig(streaming=False)``: the dataset materialised once and its
   blocks split, against Ray Data's ``iter_torch_batches`` over the same materialised dataset in
   one process (materialising is outside both timings).

Writes benchmarks/results/data.json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import ray
from _results import machine, write

import sgd

ROW_BYTES = 256 * 4  # one float32 vector of 256 per row


def _dataset(rows: int):
    import ray.data

    return ray.data.range_tensor(rows, shape=(256,), override_num_blocks=16).map_batches(
        lambda b: {"data": b["data"].astype("float32")}, batch_format="numpy"
    )


def _consume(shard, batch_size: int) -> int:
    n = 0
    for batch in shard.iter_torch_batches(batch_size=batch_size):
        n += len(batch["data"])
    return n


def _single(rows: int, batch_size: int, materialized: bool = False) -> float:
    ds = _dataset(rows)
    if materialized:
        ds = ds.materialize()
    t = time.perf_counter()
    n = _consume(ds, batch_size)
    assert n == rows, n
    return rows / (time.perf_counter() - t)


def _train_func(config):
    import time

    shard = sgd.get_dataset_shard()
    t = time.perf_counter()
    n = _consume(shard, config["batch_size"])
    return n, time.perf_counter() - t, time.time()


def _sgd(trainer: sgd.Trainer, rows: int, batch_size: int, materialized: bool = False) -> float:
    config = {"default": sgd.DatasetConfig(streaming=not materialized)}
    out = trainer.run(_train_func, config={"batch_size": batch_size}, dataset=_dataset(rows), dataset_config=config)
    assert sum(n for n, _, _ in out) == rows, out
    return rows / max(seconds for _, seconds, _ in out)


def _case(name: str, split: list, single: list) -> dict:
    ratio = statistics.median(split) / statistics.median(single)
    return {
        "case": name,
        "sgd_rows_per_s": split,
        "ray_data_rows_per_s": single,
        "median": ratio,
        "unit": "x",
        "spread": f"sgd {statistics.median(split):,.0f} rows/s ({statistics.median(split) * ROW_BYTES / 1e6:.0f} MB/s) "
        f"vs Ray Data {statistics.median(single):,.0f} rows/s ({statistics.median(single) * ROW_BYTES / 1e6:.0f} MB/s)",
        "target": ">= 0.9x",
        "met": ratio >= 0.9,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    reps, rows, batch_size = (3, 100_000, 512) if args.quick else (5, 200_000, 512)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainer.start()
    single, split, single_m, split_m = [], [], [], []
    try:
        _single(rows // 10, batch_size)  # warm both paths up
        _sgd(trainer, rows // 10, batch_size)
        for _ in range(reps):  # alternate so both see the same machine load
            single.append(_single(rows, batch_size))
            split.append(_sgd(trainer, rows, batch_size))
            single_m.append(_single(rows, batch_size, materialized=True))
            split_m.append(_sgd(trainer, rows, batch_size, materialized=True))
    finally:
        trainer.shutdown()
        ray.shutdown()
    cases = [
        _case("g. Ray Data rows/s into the loop, 2 workers vs Ray Data alone (streaming)", split, single),
        _case("h. the same, DatasetConfig(streaming=False) vs Ray Data alone (both materialised)", split_m, single_m),
    ]
    meta = machine(rows=rows, batch_size=batch_size, quick=args.quick)
    title = (f"sgd Ray Data benchmark, {meta['date']}: {meta['cpus']} CPUs, Ray {meta['ray']}, {rows:,} rows of "
             f"1 KiB, batch {batch_size}")
    print(write("data", title, meta, cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
