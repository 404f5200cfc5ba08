"""Ray Data into the training loop (`nox -s bench`).

g. Rows/s and MB/s through ``sgd.get_dataset_shard().iter_torch_batches`` on 2 workers (the
   dataset streamed and split across them), against Ray Data's own ``iter_torch_batches`` over
   the same dataset in one process. Target: >= 0.9x.
g0. The baseline for g without sgd: Ray Data's own ``streaming_split`` into 2 plain Ray actors
   (0 CPUs each, beside the started trainer, so Ray Data's tasks get the same CPUs as in g),
   against Ray Data alone. What g loses that g0 loses too is Ray Data's, not sgd's.
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


@ray.remote(num_cpus=0)
class _Consumer:
    def consume(self, shard, batch_size: int):
        t = time.perf_counter()
        n = _consume(shard, batch_size)
        return n, time.perf_counter() - t


def _plain_split(consumers: list, rows: int, batch_size: int) -> float:
    node = ray.get_runtime_context().get_node_id()
    shards = _dataset(rows).streaming_split(len(consumers), equal=True, locality_hints=[node] * len(consumers))
    out = ray.get([c.consume.remote(shard, batch_size) for c, shard in zip(consumers, shards)])
    assert sum(n for n, _ in out) == rows, out
    return rows / max(seconds for _, seconds in out)


def _rate(values: list) -> str:
    median = statistics.median(values)
    return f"{median:,.0f} rows/s ({median * ROW_BYTES / 1e6:.0f} MB/s)"


def _case(name: str, split: list, single: list, target: bool = True, who: str = "sgd") -> dict:
    ratio = statistics.median(split) / statistics.median(single)
    return {
        "case": name,
        "sgd_rows_per_s": split,
        "ray_data_rows_per_s": single,
        "median": ratio,
        "unit": "x",
        "spread": f"{who} {_rate(split)} vs Ray Data {_rate(single)}",
        "target": ">= 0.9x" if target else "-",
        "met": ratio >= 0.9 if target else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    reps, rows, batch_size = (3, 100_000, 512) if args.quick else (5, 200_000, 512)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    trainer = sgd.Trainer(backend="torch", num_workers=2)
    trainer.start()
    consumers = [_Consumer.remote() for _ in range(2)]
    single, split, plain, single_m, split_m = [], [], [], [], []
    try:
        _single(rows // 10, batch_size)  # warm the paths up
        _sgd(trainer, rows // 10, batch_size)
        _plain_split(consumers, rows // 10, batch_size)
        for _ in range(reps):  # alternate so all see the same machine load
            single.append(_single(rows, batch_size))
            split.append(_sgd(trainer, rows, batch_size))
            plain.append(_plain_split(consumers, rows, batch_size))
            single_m.append(_single(rows, batch_size, materialized=True))
            split_m.append(_sgd(trainer, rows, batch_size, materialized=True))
    finally:
        trainer.shutdown()
        ray.shutdown()
    cases = [
        _case("g. Ray Data rows/s into the loop, 2 workers vs Ray Data alone (streaming)", split, single),
        _case("g0. baseline without sgd: streaming_split into 2 plain Ray actors vs Ray Data alone", plain, single,
              target=False, who="plain actors"),
        _case("h. the same, DatasetConfig(streaming=False) vs Ray Data alone (both materialised)", split_m, single_m),
    ]
    meta = machine(rows=rows, batch_size=batch_size, quick=args.quick)
    title = (f"sgd Ray Data benchmark, {meta['date']}: {meta['cpus']} CPUs, Ray {meta['ray']}, {rows:,} rows of "
             f"1 KiB, batch {batch_size}")
    print(write("data", title, meta, cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
