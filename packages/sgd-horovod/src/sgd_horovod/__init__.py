"""sgd-horovod: Horovod (over Gloo) as an sgd backend, and Horovod's ``RayExecutor`` API.

Importing it imports neither Horovod nor torch.
"""

from sgd_horovod import ray_logger
from sgd_horovod._horovod import INSTALL_HINT, horovod_available
from sgd_horovod.config import HorovodConfig
from sgd_horovod.elastic import ElasticRayExecutor, ElasticRayExecutorSettings, RayHostDiscovery
from sgd_horovod.executor import HorovodWorker, RayExecutor, RayExecutorSettings
from sgd_horovod.single import CollectiveInExecuteSingleError
from sgd_horovod.trainer import HorovodTrainer

__version__ = "0.1.0"

__all__ = [
    "INSTALL_HINT",
    "CollectiveInExecuteSingleError",
    "ElasticRayExecutor",
    "ElasticRayExecutorSettings",
    "HorovodConfig",
    "HorovodTrainer",
    "HorovodWorker",
    "RayExecutor",
    "RayExecutorSettings",
    "RayHostDiscovery",
    "horovod_available",
    "ray_logger",
]
