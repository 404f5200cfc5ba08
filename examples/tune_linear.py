"""A Ray Tune search over the linear-regression example (``train_linear.py``).

Mirrors Ray Train 1.x's ``tune_linear_example.py``: ``trainer.to_tune_trainable(train_func)``
turns the sgd run into a Tune trainable; ``tune.run`` searches the learning rate. Needs
``sgd-tune``::

    python examples/tune_linear.py                  # 3 learning rates, 2 workers per trial
    python examples/tune_linear.py --smoke-test     # quick mode (used by the tests)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, List, Optional

import ray.cloudpickle
from ray import tune

from sgd import Trainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_linear
from train_linear import train_func

# The workers cannot import a module from examples/: ship its code with the function.
ray.cloudpickle.register_pickle_by_value(train_linear)


def tune_linear(num_workers: int = 2, num_samples: int = 3, epochs: int = 3, storage_path: Optional[str] = None) -> Any:
    trainer = Trainer(backend="torch", num_workers=num_workers)
    trainable = trainer.to_tune_trainable(train_func)
    analysis = tune.run(
        trainable,
        config={
            "lr": tune.grid_search([1e-2, 5e-3, 1e-3][:num_samples]),
            "hidden_size": 1, "batch_size": 4, "epochs": epochs, "data_size": 200,
        },
        storage_path=storage_path,
        verbose=0,
    )
    best = analysis.get_best_config(metric="loss", mode="min")
    print("Best config:", best)
    return analysis


def main(argv: Optional[List[str]] = None) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", "-n", type=int, default=2)
    parser.add_argument("--num-samples", type=int, default=3, help="learning rates to try (1-3)")
    parser.add_argument("--storage-path", default=None, help="where Tune writes (default ~/ray_results)")
    parser.add_argument("--smoke-test", action="store_true", help="quick mode: 2 learning rates, 1 worker, 1 epoch")
    args = parser.parse_args(argv)
    if args.smoke_test:
        return tune_linear(num_workers=1, num_samples=2, epochs=1, storage_path=args.storage_path)
    return tune_linear(args.num_workers, args.num_samples, storage_path=args.storage_path)


if __name__ == "__main__":
    main(sys.argv[1:])
