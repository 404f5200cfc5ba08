"""The names of Horovod's ``horovod.ray.elastic_v2``, so that ``from horovod.ray.elastic_v2 import ...``
becomes ``from sgd_horovod.elastic_v2 import ...`` (elastic jobs are ``RayExecutor(min_workers=...)``)."""

from sgd_horovod.discovery import RayHostDiscovery

__all__ = ["RayHostDiscovery"]
