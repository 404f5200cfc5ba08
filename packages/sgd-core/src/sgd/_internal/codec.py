"""Default checkpoint codec: cloudpickle. A codec module has ``SUFFIX``, ``save(obj, file)``, ``load(file)``."""

from typing import IO, Any

SUFFIX = "pkl"


def save(obj: Any, f: IO[bytes]) -> None:
    import ray.cloudpickle as cloudpickle

    cloudpickle.dump(obj, f)


def load(f: IO[bytes]) -> Any:
    import ray.cloudpickle as cloudpickle

    return cloudpickle.load(f)
