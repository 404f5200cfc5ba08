"""Linear regression fed by a Ray Dataset, sharded across the workers.

Mirrors Ray Train 1.x's ``train_linear_dataset_example.py``: ``trainer.run(..., dataset=...)``
splits a Ray Dataset between the workers and each reads its part with
``sgd.get_dataset_shard(name)`` (``train.get_dataset_shard`` in Ray)::

    python examples/ray_data_linear.py                  # 2 workers, 3 epochs
    python examples/ray_data_linear.py --smoke-test     # quick mode (used by the tests)
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional

import sgd as train
from sgd import Trainer


def get_datasets(size: int = 1000, split: float = 0.8) -> Dict:
    import ray.data

    items = [{"x": float(i) / size, "y": 2.0 * float(i) / size + 5.0} for i in range(size)]
    dataset = ray.data.from_items(items)
    train_ds, val_ds = dataset.train_test_split(1 - split)
    return {"train": train_ds, "validation": val_ds}


def train_func(config: Dict) -> List[Dict]:
    import torch

    import sgd_torch

    model = sgd_torch.prepare_model(torch.nn.Linear(1, 1))
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    train_shard = train.get_dataset_shard("train")
    val_shard = train.get_dataset_shard("validation")
    results = []
    for _ in range(config["epochs"]):
        for batch in train_shard.iter_torch_batches(batch_size=config["batch_size"], dtypes=torch.float32):
            loss = loss_fn(model(batch["x"].unsqueeze(1)), batch["y"].unsqueeze(1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            losses = [loss_fn(model(b["x"].unsqueeze(1)), b["y"].unsqueeze(1)).item()
                      for b in val_shard.iter_torch_batches(batch_size=config["batch_size"], dtypes=torch.float32)]
        result = {"loss": sum(losses) / max(1, len(losses))}
        train.report(**result)
        results.append(result)
    return results


def train_linear(num_workers: int = 2, epochs: int = 3, size: int = 1000) -> List[List[Dict]]:
    trainer = Trainer(backend="torch", num_workers=num_workers)
    trainer.start()
    try:
        results = trainer.run(train_func, config={"lr": 1e-1, "batch_size": 32, "epochs": epochs},
                              dataset=get_datasets(size))
    finally:
        trainer.shutdown()
    print(results)
    return results


def main(argv: Optional[List[str]] = None) -> List[List[Dict]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", "-n", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--smoke-test", action="store_true", help="quick mode: 2 epochs on 200 rows")
    args = parser.parse_args(argv)
    if args.smoke_test:
        return train_linear(num_workers=2, epochs=2, size=200)
    return train_linear(args.num_workers, args.epochs)


if __name__ == "__main__":
    main(sys.argv[1:])
