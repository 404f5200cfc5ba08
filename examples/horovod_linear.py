"""Linear regression with Horovod on sgd's ``"horovod"`` backend (Gloo, no MPI, no ssh).

Mirrors Ray Train 1.x's ``horovod/horovod_example.py`` on synthetic data in place of MNIST:
``hvd.init()``, ``hvd.DistributedOptimizer``, ``hvd.broadcast_parameters`` in the training
function; ``Trainer(backend="horovod")`` runs the rendezvous from the driver. Needs Horovod built
for PyTorch (``scripts/build_horovod.py``, see docs/horovod.md)::

    python examples/horovod_linear.py                  # 2 workers, 3 epochs
    python examples/horovod_linear.py --smoke-test     # quick mode (used by the tests)
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional

import sgd as train
from sgd import Trainer


def train_func(config: Dict) -> List[float]:
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(hvd.rank())  # different data per worker; Horovod keeps the weights equal
    x = torch.rand(config["data_size"], 1) * 10
    y = 2 * x + 5
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"] * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    losses = []
    for _ in range(config["epochs"]):
        for i in range(0, len(x), config["batch_size"]):
            loss = torch.nn.functional.mse_loss(model(x[i:i + config["batch_size"]]), y[i:i + config["batch_size"]])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
        train.report(loss=loss.item(), weight=model.weight.item())
    return losses + [model.weight.item()]


def train_horovod(num_workers: int = 2, epochs: int = 3) -> List[List[float]]:
    trainer = Trainer(backend="horovod", num_workers=num_workers)
    trainer.start()
    try:
        results = trainer.run(train_func, config={"lr": 1e-3, "batch_size": 16, "epochs": epochs, "data_size": 320})
    finally:
        trainer.shutdown()
    print("losses and final weight per worker:", results)
    return results


def main(argv: Optional[List[str]] = None) -> List[List[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", "-n", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--smoke-test", action="store_true", help="quick mode: 2 epochs")
    args = parser.parse_args(argv)
    return train_horovod(2 if args.smoke_test else args.num_workers, 2 if args.smoke_test else args.epochs)


if __name__ == "__main__":
    main(sys.argv[1:])
