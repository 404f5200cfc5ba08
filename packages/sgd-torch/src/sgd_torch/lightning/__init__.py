"""PyTorch Lightning on sgd (``pip install "sgd-torch[lightning]"``).

Inside a :class:`sgd_torch.TorchTrainer` loop, a ``lightning.pytorch.Trainer`` runs on the
process group sgd set up, with sgd's ranks and devices, and reports to sgd:

.. code-block:: python

    import lightning.pytorch as pl
    from sgd_torch.lightning import (SgdDDPStrategy, SgdLightningEnvironment,
                                     SgdReportCallback, prepare_trainer)

    def train_loop(config):
        trainer = pl.Trainer(max_epochs=config["epochs"], accelerator="auto", devices="auto",
                             strategy=SgdDDPStrategy(), plugins=[SgdLightningEnvironment()],
                             callbacks=[SgdReportCallback()], enable_checkpointing=False)
        trainer = prepare_trainer(trainer)
        trainer.fit(MyModule(), train_dataloaders=make_loader())

The names of Ray Train 2.60's ``ray.train.lightning`` work too (``RayDDPStrategy``,
``RayFSDPStrategy``, ``RayDeepSpeedStrategy``, ``RayLightningEnvironment``,
``RayTrainReportCallback``, ``prepare_trainer``), so code written for it moves over by changing
the import. ``RayDeepSpeedStrategy`` needs DeepSpeed installed when it is built.
"""

from sgd_torch._deps import require_for

require_for("sgd_torch.lightning", 'pip install "sgd-torch[lightning]"', "lightning")

from sgd_torch.lightning._lightning import (  # noqa: E402
    CHECKPOINT_NAME,
    SgdDDPStrategy,
    SgdDeepSpeedStrategy,
    SgdFSDPStrategy,
    SgdLightningEnvironment,
    SgdReportCallback,
    prepare_trainer,
)

# Ray Train's names, for code that moves over from ray.train.lightning.
RayDDPStrategy = SgdDDPStrategy
RayDeepSpeedStrategy = SgdDeepSpeedStrategy
RayFSDPStrategy = SgdFSDPStrategy
RayLightningEnvironment = SgdLightningEnvironment
RayTrainReportCallback = SgdReportCallback

__all__ = [
    "CHECKPOINT_NAME",
    "RayDDPStrategy",
    "RayDeepSpeedStrategy",
    "RayFSDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "SgdDDPStrategy",
    "SgdDeepSpeedStrategy",
    "SgdFSDPStrategy",
    "SgdLightningEnvironment",
    "SgdReportCallback",
    "prepare_trainer",
]
