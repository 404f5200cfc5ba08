"""Hook specifications: every extension point of sgd.

Plugins implement these with :data:`sgd.hookimpl` and are found through the
entry-point group ``sgd``. sgd's own defaults are registered as an ordinary
plugin (``sgd._builtin``), so core goes through the same hooks.

Hook implementations may accept fewer arguments than the spec lists (pluggy
passes only the ones they name), so specs can grow without breaking plugins.
Every hook is called through pluggy, so ``@sgd.hookimpl(wrapper=True)`` (or the older
``hookwrapper=True``), ``tryfirst``/``trylast`` and ``firstresult`` work as pluggy documents.
An implementation whose name matches none of these specs is refused (``check_pending``),
with an error naming the plugin and the hook.
This module imports nothing heavy; types used only in annotations are imported
under ``TYPE_CHECKING``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import pluggy

if TYPE_CHECKING:
    from sgd.backend import Backend, BackendConfig, BackendSpec, Workers
    from sgd.callbacks import TrainingCallback

hookspec = pluggy.HookspecMarker("sgd")
#: Marker for hook implementations; re-exported as ``sgd.hookimpl``.
hookimpl = pluggy.HookimplMarker("sgd")


# --- discovery ---------------------------------------------------------------


@hookspec
def sgd_backends() -> Sequence[BackendSpec]:
    """Declare the training backends this plugin provides.

    Called when the backend table is first needed. Each plugin is asked on its own (a
    pluggy call per plugin, so that every answer is attributed to its plugin; wrappers wrap
    each plugin's answer); the answers are merged. A plugin that raises is recorded as a
    failure, by name, and left out. Two plugins declaring the same backend name is an error that
    ``sgd plugins`` reports and that :class:`sgd.Trainer` raises when the name
    is asked for.

    :returns: a sequence of :class:`sgd.BackendSpec` records
        (``name``, ``config_cls``, ``provider``).

    Example::

        @sgd.hookimpl
        def sgd_backends():
            return [sgd.BackendSpec("jax", JaxConfig, provider="sgd-jax")]
    """


@hookspec
def sgd_callbacks() -> Sequence[type]:
    """Declare the :class:`sgd.TrainingCallback` classes this plugin provides.

    Used for listing (``sgd plugins``) and lookup by class name. Every plugin
    may answer; the answers are merged.

    :returns: a sequence of callback classes.
    """


@hookspec
def sgd_checkpoint_storage_schemes() -> Sequence[str]:
    """Declare the URI schemes (``"s3"``, ``"gs"``, ``"memory"``...) whose checkpoint
    storage this plugin provides. Used for listing only; the storage itself is
    returned by :func:`sgd_checkpoint_storage`.

    :returns: a sequence of scheme names without ``://``.
    """


@hookspec
def sgd_cli_commands(subparsers: Any) -> None:
    """Add subcommands to the ``sgd`` command line.

    Called once when ``sgd`` builds its parser. All implementations are called.
    Each added parser must set a ``func`` default: a callable taking the parsed
    ``argparse.Namespace`` and returning the exit code.

    :param subparsers: the ``argparse`` sub-parsers action of ``sgd``.

    Example::

        @sgd.hookimpl
        def sgd_cli_commands(subparsers):
            p = subparsers.add_parser("plot", help="plot a run's metrics")
            p.add_argument("run_dir")
            p.set_defaults(func=lambda args: plot(args.run_dir))
    """


# --- backend setup / teardown --------------------------------------------------


@hookspec
def sgd_backend_setup(worker_group: Workers, backend_config: BackendConfig, backend: Backend) -> None:
    """Make the started workers one training job (process group, ``TF_CONFIG``...).

    Called by the driver after the workers are started, ranked, and have run
    the user's ``initialization_hook``; before any training function runs; and
    again on the new workers after a restart. All implementations are called;
    core's built-in implementation runs ``backend.on_start(...)``, so a backend
    normally implements :class:`sgd.Backend` instead of this hook. Implement this
    hook to add to *every* backend's setup (for example to set environment variables).

    :param worker_group: the started workers, in world-rank order.
    :param backend_config: the configuration the trainer was created with.
    :param backend: the group's :class:`sgd.Backend` object, made from
        ``backend_config.backend_cls()`` when the group started; the same object
        reaches every lifecycle hook of the group until it shuts down (a restart
        after a failure keeps it), so it may hold state such as a server or a handle.
    """


@hookspec(firstresult=True)
def sgd_elastic_room(worker_group: Optional[Workers], resources_per_worker: dict) -> Optional[int]:
    """How many workers an elastic group (``num_workers=(min, max)``) may have now, when
    something other than the Ray cluster's free resources decides (a job's host discovery).

    Asked before each placement of an elastic group and at each look for room to grow; sgd
    takes the smaller of this and what the cluster can place. Pass the implementing object in
    ``sgd.Trainer(plugins=[...])`` so that it applies to that trainer only.
    Stops at first non-None result.

    :param worker_group: the group's workers now, in world-rank order (``None`` before the first
        placement); a worker of theirs counts as room it already has.
    :param resources_per_worker: what one worker reserves (``{"CPU": 1, ...}``).
    :returns: the number of workers, or ``None`` to let the cluster's room decide.
    """


@hookspec
def sgd_backend_training_start(worker_group: Workers, backend_config: BackendConfig, backend: Backend) -> None:
    """Prepare the workers for one call of ``Trainer.run`` (called before each run, and
    before the training function restarts after a failure).

    All implementations are called; the built-in one runs
    ``backend.on_training_start``.

    :param worker_group: the started workers, in world-rank order.
    :param backend_config: the trainer's backend configuration.
    :param backend: the group's :class:`sgd.Backend` object (see :func:`sgd_backend_setup`).
    """


@hookspec
def sgd_backend_teardown(worker_group: Workers, backend_config: BackendConfig, backend: Backend) -> None:
    """Undo :func:`sgd_backend_setup` (destroy process groups...) before the workers stop.

    Called by ``Trainer.shutdown`` while the workers are still alive (not after a
    failed run: those workers are killed). All implementations are called, in one pluggy
    call (wrappers see it and its result). An implementation that raises is logged with its
    plugin's name, not raised, and does not stop the others: the implementations after it
    are called in a second call (which wrappers see too), so the workers are always released.
    The built-in one (``trylast``) runs ``backend.on_shutdown``, after every implementation
    that is not ``trylast`` itself.

    :param worker_group: the workers about to be stopped.
    :param backend_config: the trainer's backend configuration.
    :param backend: the group's :class:`sgd.Backend` object (see :func:`sgd_backend_setup`);
        it is dropped after this call.
    """


@hookspec
def sgd_backend_handle_failure(
    worker_group: Workers, backend_config: BackendConfig, backend: Backend, error: BaseException
) -> None:
    """React to a failed worker group before it is torn down and restarted.

    Called when a worker raised or died. All implementations are called; the
    built-in one runs ``backend.on_failure``.

    :param worker_group: the failed group (some actors may be dead).
    :param backend_config: the trainer's backend configuration.
    :param backend: the group's :class:`sgd.Backend` object; a restart keeps it and
        calls its ``on_start`` again on the new workers.
    :param error: the error that ended the attempt.
    """


# --- result handling -----------------------------------------------------------


@hookspec
def sgd_default_callbacks(trainer: Any) -> Sequence[TrainingCallback]:
    """Callbacks to add to every ``Trainer.run`` of ``trainer``.

    All implementations are called; their callbacks run after the ones the
    user passed, in plugin registration order.

    :param trainer: the trainer about to run.
    :returns: a sequence of callback instances (may be empty).
    """


@hookspec
def sgd_handle_result(results: list, run_info: dict) -> None:
    """Observe one round of results (one dict per worker, world-rank order).

    Called on the driver for every report round, after the round is persisted to the run's
    ``results.jsonl``. All implementations are called; sgd-core's own runs last and hands the
    round to the run's callbacks (:meth:`sgd.TrainingCallback.handle_result`), so a plugin
    sees each round before any callback. An exception raised here ends the run like a
    callback's would. Keep it fast: it sits on the report path.

    :param results: the round, one metrics dict per worker.
    :param run_info: ``{"run_dir": str, "logdir": str, "config": dict, "callbacks": list}``
        (``callbacks``: the run's :class:`sgd.TrainingCallback` objects, in order).

    Example::

        @sgd.hookimpl
        def sgd_handle_result(results, run_info):
            if results[0].get("loss", 0) > 1e6:
                raise RuntimeError(f"loss diverged in {run_info['run_dir']}")
    """


# --- checkpoint storage ----------------------------------------------------------


@hookspec(firstresult=True)
def sgd_checkpoint_storage(uri: str) -> Optional[Any]:
    """Return the checkpoint storage that handles ``uri``.

    Stops at the first non-None result. Implement it for the URI schemes the
    plugin declared in :func:`sgd_checkpoint_storage_schemes`; return ``None``
    for any other URI.

    :param uri: a local path or a URI such as ``s3://bucket/prefix``.
    :returns: a storage object, or ``None`` if this plugin does not handle ``uri``.
    """


# --- tune adaptation ----------------------------------------------------------------


@hookspec(firstresult=True)
def sgd_tune_trainable(trainer: Any, train_func: Any, dataset: Any) -> Optional[Any]:
    """Turn ``trainer`` and ``train_func`` into a Ray Tune trainable.

    Stops at the first non-None result. Provided by ``sgd-tune``; when no
    plugin answers, ``Trainer.to_tune_trainable`` (and ``DataParallelTrainer.as_trainable``)
    raise ``ImportError`` naming that package.

    :param trainer: the (not started) :class:`sgd.Trainer` whose settings each trial copies,
        or an AIR-style :class:`sgd.DataParallelTrainer` (then ``train_func`` and ``dataset``
        are ``None``: the trainer holds them, and the answer is a function trainable that
        Tune calls with the trial's config, with its placement group in ``_resources``).
    :param train_func: the user's training function.
    :param dataset: the dataset(s) to shard across each trial's workers, or ``None``.
    :returns: a Tune trainable class, or ``None``.
    """


# --- checkpoint codecs -----------------------------------------------------


@hookspec
def sgd_checkpoint_codecs() -> Sequence[Any]:
    """Register checkpoint codecs: how a dict checkpoint's state is written to one file.

    All implementations are called. A checkpoint's metadata names its codec; loading
    picks it only among the codecs registered here (and sgd-core's own ``"sgd"`` and
    ``"pickle"``), never by importing a name read from disk.

    :returns: codec objects with ``name``, ``suffix``, ``aliases`` (older names),
        ``save(obj, file) -> list of type names that need pickle`` and
        ``load(file, trusted, where)``, which must not run code named by the file
        unless ``trusted`` (see :class:`sgd.codecs.Codec`).

    Example::

        @sgd.hookimpl
        def sgd_checkpoint_codecs():
            return [MyCodec()]
    """
