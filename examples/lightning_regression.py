"""A PyTorch Lightning model trained on sgd's workers.

Mirrors Ray Train's Lightning example (``lightning_mnist_example.py``, later Ray Train; Ray Train
1.x users ran Lightning through ``ray_lightning``) on synthetic regression data: a
``lightning.pytorch.Trainer`` runs in each worker over sgd's process group, with sgd's strategy,
environment and report callback from ``sgd_torch.lightning``. Needs ``sgd-torch[lightning]``::

    python examples/lightning_regression.py                  # 2 workers, 4 epochs
    python examples/lightning_regression.py --smoke-test     # quick mode (used by the tests)
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional

from sgd import RunConfig, ScalingConfig
from sgd_torch import TorchTrainer


def train_loop(config: Dict) -> None:
    import lightning.pytorch as pl
    import torch

    from sgd_torch.lightning import SgdDDPStrategy, SgdLightningEnvironment, SgdReportCallback, prepare_trainer

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss, on_epoch=True, on_step=False, sync_dist=True)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    x = torch.randn(256, 8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)),
                                         batch_size=16, shuffle=True)
    trainer = pl.Trainer(max_epochs=config["epochs"], accelerator="cpu", devices="auto",
                         strategy=SgdDDPStrategy(), plugins=[SgdLightningEnvironment()],
                         callbacks=[SgdReportCallback()], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, logger=False)
    prepare_trainer(trainer).fit(Regression(), loader)


def train_lightning(num_workers: int = 2, epochs: int = 4, storage_path: Optional[str] = None) -> Any:
    result = TorchTrainer(train_loop, train_loop_config={"epochs": epochs},
                          scaling_config=ScalingConfig(num_workers=num_workers),
                          run_config=RunConfig(name="lightning_regression", storage_path=storage_path,
                                               verbose=0)).fit()  # raises if training failed
    print("final metrics:", {k: result.metrics[k] for k in ("epoch", "loss")})
    return result


def main(argv: Optional[List[str]] = None) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", "-n", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--storage-path", default=None)
    parser.add_argument("--smoke-test", action="store_true", help="quick mode: 3 epochs")
    args = parser.parse_args(argv)
    return train_lightning(args.num_workers, 3 if args.smoke_test else args.epochs, args.storage_path)


if __name__ == "__main__":
    main(sys.argv[1:])
