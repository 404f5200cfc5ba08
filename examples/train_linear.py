"""Linear regression on synthetic data with sgd's torch backend.

Mirrors Ray Train 1.x's ``train_linear_example.py`` (``ray/train/examples``): the same model,
data and loop; only the imports changed (``from ray import train`` → ``import sgd as train``,
``ray.train.torch`` → ``sgd_torch``)::

    python examples/train_linear.py                  # 2 workers, 3 epochs
    python examples/train_linear.py --smoke-test     # quick mode (used by the tests)
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional

import sgd as train
from sgd import Trainer


def train_func(config: Dict) -> List[Dict]:
    import numpy as np
    import torch

    import sgd_torch

    data_size, batch_size = config["data_size"], config["batch_size"]
    # y = a * x + b with a=2, b=5, as in Ray's example.
    x = np.arange(0, 10, 10 / data_size, dtype=np.float32)
    y = 2 * x + 5
    data = torch.utils.data.TensorDataset(torch.tensor(x).unsqueeze(1), torch.tensor(y).unsqueeze(1))
    train_loader = sgd_torch.prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=batch_size))
    val_loader = sgd_torch.prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=batch_size))

    model = sgd_torch.prepare_model(torch.nn.Linear(1, config["hidden_size"]))
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])

    results = []
    for _ in range(config["epochs"]):
        model.train()
        for xb, yb in train_loader:
            loss = loss_fn(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            val_loss = sum(loss_fn(model(xb), yb).item() for xb, yb in val_loader) / len(val_loader)
        result = {"loss": val_loss}
        train.report(**result)
        results.append(result)
    return results


def train_linear(num_workers: int = 2, use_gpu: bool = False, epochs: int = 3) -> List[List[Dict]]:
    trainer = Trainer(backend="torch", num_workers=num_workers, use_gpu=use_gpu)
    config = {"lr": 1e-2, "hidden_size": 1, "batch_size": 4, "epochs": epochs, "data_size": 1000}
    trainer.start()
    try:
        results = trainer.run(train_func, config)
    finally:
        trainer.shutdown()
    print(results)
    return results


def main(argv: Optional[List[str]] = None) -> List[List[Dict]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", "-n", type=int, default=2, help="number of workers")
    parser.add_argument("--use-gpu", action="store_true", help="train on GPUs")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--smoke-test", action="store_true", help="quick mode: 1 epoch, 2 workers")
    args = parser.parse_args(argv)
    return train_linear(num_workers=2 if args.smoke_test else args.num_workers, use_gpu=args.use_gpu,
                        epochs=1 if args.smoke_test else args.epochs)


if __name__ == "__main__":
    main(sys.argv[1:])
