"""Train a small neural network on 8x8 handwritten digits with 2 sgd workers.

Mirrors Ray Train 1.x's ``train_fashion_mnist_example.py``, with scikit-learn's digits in place of
Fashion-MNIST (which needs a download). This is the first thing to run after installing sgd (``nox -s demo``)::

    python examples/digits.py                 # 2 workers, 10 epochs
    python examples/digits.py --epochs 5 --num-workers 1

What happens:

1. ``sgd.Trainer`` starts a local Ray cluster (if none is running) and
   ``num_workers`` worker processes, with ``torch.distributed`` (gloo) set up
   between them.
2. ``trainer.run(train_func)`` runs ``train_func`` once in every worker. Each
   worker trains on its own share of the data; ``prepare_model`` wraps the
   model in ``DistributedDataParallel`` so gradients are averaged across workers
   and every worker ends each step with the same weights.
3. Every worker calls ``sgd.report(...)`` once per epoch. The driver (this
   process) gets one list of results per epoch, one dict per worker, and hands
   it to the callbacks, which print it.

The data is scikit-learn's bundled digits set (1,797 images, no download).
"""

from __future__ import annotations

import argparse
import os
import sys

import sgd

SEED = 0
MIN_ACCURACY = 0.90


def train_func(config: dict) -> float:
    """Runs on every worker. Returns this worker's final validation accuracy."""
    # Imports inside the function: this code runs in the worker processes.
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler
    from torch.utils.data import DataLoader, TensorDataset

    from sgd_torch import enable_reproducibility, prepare_data_loader, prepare_model

    enable_reproducibility(SEED)  # same seed on every worker: same split, same initial weights

    # --- data: every worker builds the same split, then gets its own share of it ---
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=SEED, stratify=y)
    scaler = StandardScaler().fit(x_train)  # statistics from the training part only
    x_train, x_val = scaler.transform(x_train), scaler.transform(x_val)

    def tensors(features, labels):
        return torch.tensor(features, dtype=torch.float32), torch.tensor(labels, dtype=torch.long)

    train_data = TensorDataset(*tensors(x_train, y_train))
    val_x, val_y = tensors(x_val, y_val)
    loader = DataLoader(train_data, batch_size=config["batch_size"], shuffle=True)
    # Adds a DistributedSampler: with 2 workers each sees a different half of every epoch.
    loader = prepare_data_loader(loader)

    # --- model: a small MLP, wrapped in DistributedDataParallel ---
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )
    model = prepare_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = torch.nn.CrossEntropyLoss()

    val_accuracy = 0.0
    for epoch in range(1, config["epochs"] + 1):
        model.train()
        total_loss, seen = 0.0, 0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()  # DDP averages the gradients across workers here
            optimizer.step()
            total_loss += loss.item() * len(yb)
            seen += len(yb)

        # Every worker evaluates on the full validation set (the weights are identical everywhere).
        model.eval()
        with torch.no_grad():
            logits = model(val_x)
            val_loss = loss_fn(logits, val_y).item()
            val_accuracy = (logits.argmax(dim=1) == val_y).float().mean().item()

        # Every worker must report the same number of times.
        sgd.report(
            epoch=epoch,
            train_loss=total_loss / seen,  # mean loss over this worker's share of the data
            val_loss=val_loss,
            val_accuracy=val_accuracy,
        )
    return val_accuracy


class PrintEpoch(sgd.TrainingCallback):
    """Prints one line per epoch from rank 0's result (the driver gets one dict per worker)."""

    def handle_result(self, results, **info):
        r = results[0]
        print(
            f"epoch {r['epoch']:3d} | train_loss {r['train_loss']:.4f} | "
            f"val_loss {r['val_loss']:.4f} | val_accuracy {r['val_accuracy']:.4f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10, help="passes over the training data (default 10)")
    parser.add_argument("--num-workers", type=int, default=2, help="training processes (default 2)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per worker (default 32)")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 0.003)")
    parser.add_argument("--smoke-test", action="store_true", help="quick mode (used by the tests): 5 epochs")
    args = parser.parse_args(argv)
    if args.smoke_test:
        args.epochs = min(args.epochs, 5)

    # sgd starts a local Ray cluster by itself (or joins the one RAY_ADDRESS names),
    # sized to this machine's CPUs. Each worker reserves one CPU, so only ask a local
    # Ray for more (logical) CPUs than the machine has when more workers than cores
    # were requested.
    if args.num_workers > (os.cpu_count() or 1) and not os.environ.get("RAY_ADDRESS"):
        import ray

        ray.init(address="local", num_cpus=args.num_workers)

    trainer = sgd.Trainer(backend="torch", num_workers=args.num_workers)
    trainer.start()
    try:
        accuracies = trainer.run(
            train_func,
            config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr},
            callbacks=[PrintEpoch()],
        )
    finally:
        trainer.shutdown()

    accuracy = accuracies[0]  # rank 0's; every worker has the same weights
    print(f"final validation accuracy: {accuracy:.4f} (results in {trainer.latest_run_dir})")
    if accuracy <= MIN_ACCURACY:
        print(f"FAILED: expected validation accuracy > {MIN_ACCURACY}", file=sys.stderr)
        return 1
    print(f"OK: validation accuracy > {MIN_ACCURACY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
