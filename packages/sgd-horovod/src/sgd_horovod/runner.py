"""The names of Horovod's ``horovod.ray.runner``, so that ``from horovod.ray.runner import RayExecutor``
becomes ``from sgd_horovod.runner import RayExecutor``."""

from sgd_horovod.executor import RayExecutor, RayExecutorSettings

__all__ = ["RayExecutor", "RayExecutorSettings"]
