"""sgd-loggers: result loggers for sgd training runs.

Re-exports only. Each callback imports its logging library when it is constructed, so
importing this package imports none of them.
"""

from sgd_loggers.console import PrintCallback, ProgressCallback
from sgd_loggers.csv_logger import CSVLoggerCallback
from sgd_loggers.json_logger import JsonLoggerCallback
from sgd_loggers.mlflow_logger import MLflowLoggerCallback
from sgd_loggers.profiler import TorchTensorboardProfilerCallback
from sgd_loggers.tbx import TBXLoggerCallback
from sgd_loggers.wandb_logger import WandbLoggerCallback

__version__ = "0.1.0"

__all__ = [
    "CSVLoggerCallback",
    "JsonLoggerCallback",
    "MLflowLoggerCallback",
    "PrintCallback",
    "ProgressCallback",
    "TBXLoggerCallback",
    "TorchTensorboardProfilerCallback",
    "WandbLoggerCallback",
]
