"""sgd-core's own hook implementations, registered like any other plugin.

The backend lifecycle hooks dispatch to the chosen config's :class:`sgd.Backend`,
so a backend package implements ``Backend`` and other plugins can still add
to every backend's setup through the same hooks.
"""

from __future__ import annotations

from sgd.backend import BackendConfig, BackendSpec, share_cuda_visible_devices
from sgd.hookspecs import hookimpl


@hookimpl
def sgd_backends():

    # The no-op backend: plain Python workers, no framework set up.
    return [BackendSpec("base", BackendConfig, provider="sgd-core")]


# ``backend`` is the group's one Backend object (made when the group starts, kept until it
# shuts down). The backend's own setup runs first, so that other plugins' setup sees a ready
# group; its teardown runs last. GPU sharing (Backend.share_cuda_visible_devices) comes first.
@hookimpl(tryfirst=True)
def sgd_backend_setup(worker_group, backend_config, backend):
    if getattr(backend, "share_cuda_visible_devices", False):

        share_cuda_visible_devices(worker_group)
    backend.on_start(worker_group, backend_config)


@hookimpl
def sgd_backend_training_start(worker_group, backend_config, backend):
    backend.on_training_start(worker_group, backend_config)


@hookimpl(trylast=True)
def sgd_backend_teardown(worker_group, backend_config, backend):
    backend.on_shutdown(worker_group, backend_config)


@hookimpl
def sgd_backend_handle_failure(worker_group, backend_config, backend, error):
    backend.on_failure(worker_group, backend_config, error)


# The run's callbacks get each round through this hook, after every plugin's implementation
# (trylast): core dogfoods sgd_handle_result instead of calling the callbacks itself.
@hookimpl(trylast=True)
def sgd_handle_result(results, run_info):
    for callback in run_info.get("callbacks", ()):
        callback.handle_result(results)


@hookimpl
def sgd_checkpoint_storage_schemes():
    try:
        import pyarrow.fs  # noqa: F401
    except ImportError:
        return []
    schemes = ["file", "s3", "gs", "hdfs"]
    try:
        import fsspec  # noqa: F401

        schemes.append("memory (fsspec)")
    except ImportError:
        pass
    return schemes
