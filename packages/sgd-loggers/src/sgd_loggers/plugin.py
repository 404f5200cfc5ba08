"""Entry point of sgd-loggers: lists the callbacks, adds ``sgd plot`` and the progress line.

Glue only: no logging library (mlflow, wandb, tensorboardX, matplotlib) is imported here.
"""

import os

import sgd
from sgd_loggers import (
    CSVLoggerCallback,
    JsonLoggerCallback,
    MLflowLoggerCallback,
    PrintCallback,
    ProgressCallback,
    TBXLoggerCallback,
    TorchTensorboardProfilerCallback,
    WandbLoggerCallback,
)
from sgd_loggers.plot import add_plot_command


@sgd.hookimpl
def sgd_callbacks():
    return [
        JsonLoggerCallback,
        CSVLoggerCallback,
        TBXLoggerCallback,
        MLflowLoggerCallback,
        WandbLoggerCallback,
        TorchTensorboardProfilerCallback,
        PrintCallback,
        ProgressCallback,
    ]


@sgd.hookimpl
def sgd_default_callbacks(trainer):
    # A live progress line on terminals; it turns itself off elsewhere.
    if os.environ.get("SGD_PROGRESS", "1").strip().lower() in ("0", "false", "no", "off"):
        return []
    return [ProgressCallback.automatic()]


@sgd.hookimpl
def sgd_cli_commands(subparsers):
    add_plot_command(subparsers)
