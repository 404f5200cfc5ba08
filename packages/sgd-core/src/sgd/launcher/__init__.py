"""``sgd run``: run an unchanged ``torchrun``-style script on N sgd workers.

Each worker runs the script as ``__main__`` (``runpy``) inside an sgd training
session, so ``sgd.report`` / ``sgd.save_checkpoint`` / ``sgd.load_checkpoint``
work in it and a killed worker restarts the script from the top. The pieces:

- :class:`ScriptRunner` (worker side, :mod:`sgd.launcher.runner`): sets ``sys.argv``,
  ``sys.path``, the working directory and the standard streams, runs the script, turns
  ``SystemExit`` into success or :class:`ScriptExitError`.
- :class:`_LaunchPlugin` (driver side, registered for one launch, :mod:`sgd.launcher.env`):
  sets the ``torchrun`` launcher variables on the workers before every start of the script,
  through the ``sgd_backend_training_start`` hook. The backend sets its own
  (``MASTER_ADDR``/``MASTER_PORT`` for torch, ``TF_CONFIG``...).
- Output: the script's ``sys.stdout``/``sys.stderr`` reach the driver line by line
  with a ``[rank N]`` prefix (:mod:`sgd.launcher.output`).
- :func:`launch` (driver side, here): the launch; :mod:`sgd.launcher.failures` says what a
  failed one prints and returns.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from sgd.errors import PicklableError
from sgd.launcher.env import _LaunchPlugin
from sgd.launcher.env import launcher_env as launcher_env
from sgd.launcher.failures import exit_code_for
from sgd.launcher.failures import failure_message as failure_message
from sgd.launcher.failures import trim_traceback as trim_traceback
from sgd.launcher.output import OutputPrinter, OutputPump, start_sink
from sgd.launcher.runner import ScriptExitError as ScriptExitError
from sgd.launcher.runner import ScriptRunner
from sgd.launcher.ship import pack
from sgd.plugins import resolve_backend
from sgd.trainer import Trainer
from sgd.utils import ensure_ray

# --- driver side: the launch --------------------------------------------------------------


class LaunchError(PicklableError, ValueError):
    """Bad input to ``sgd run`` (found before anything starts)."""


def backend_config_for_script(name: str, overrides: Optional[Dict[str, Any]] = None) -> Any:
    """The backend config ``sgd run --backend name`` uses.

    A backend config with an ``init_process_group`` field (torch) gets ``False``: the
    script creates its own process group, as under ``torchrun``.

    :raises LaunchError: unknown backend, or ``overrides`` the config does not accept.
    """

    try:
        spec = resolve_backend(name)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    kwargs: Dict[str, Any] = {}
    if dataclasses.is_dataclass(spec.config_cls):
        if "init_process_group" in {f.name for f in dataclasses.fields(spec.config_cls)}:
            kwargs["init_process_group"] = False
    kwargs.update(overrides or {})
    try:
        return spec.config_cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise LaunchError(f"bad --backend-config for backend {name!r}: {exc}") from None


def resolve_script(target: str, module: bool = False) -> str:
    """The script's absolute path (or the module name with ``module=True``).

    :raises LaunchError: the script does not exist or is not a file; the module is not found.
    """
    if module:
        import importlib.util

        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        if found is None:
            # Workers import it with the working directory on sys.path, as ``python -m`` does.
            sys.path.insert(0, os.getcwd())
            try:
                found = importlib.util.find_spec(target)
            except (ImportError, ValueError):
                found = None
            finally:
                sys.path.pop(0)
        if found is None:
            raise LaunchError(f"module {target!r} not found")
        return target
    path = Path(target).expanduser()
    if not path.exists():
        raise LaunchError(f"script {target!r} not found")
    if not path.is_file():
        raise LaunchError(f"script {target!r} is not a file")
    return str(path.resolve())


@dataclass
class LaunchResult:
    """What :func:`launch` did."""

    #: 0 on success; the script's exit status, or 1, on failure.
    exit_code: int
    #: ``logdir/run_NNN`` of the run (``None`` if it never started).
    run_dir: Optional[Path] = None
    #: the error that ended the run, if any.
    error: Optional[BaseException] = None
    #: the report rounds' last metrics, one dict per worker (``[]`` if nothing was reported).
    final_metrics: List[Dict[str, Any]] = field(default_factory=list)
    #: how many times the script was started on the group (1 without restarts).
    starts: int = 0



def launch(
    target: str,
    args: Sequence[str] = (),
    *,
    module: bool = False,
    backend: Any = "torch",
    num_workers: int = 1,
    use_gpu: bool = False,
    resources_per_worker: Optional[Dict[str, float]] = None,
    logdir: Optional[str] = None,
    max_retries: int = 3,
    backend_config: Optional[Dict[str, Any]] = None,
    capture_output: bool = True,
    on_start: Optional[Callable[[Path], None]] = None,
) -> LaunchResult:
    """Run a script on ``num_workers`` sgd workers, as ``sgd run`` does.

    :param target: the script's path (or a module name with ``module=True``).
    :param args: the script's arguments.
    :param backend: a backend name (see :func:`backend_config_for_script`) or a ``BackendConfig``.
    :param backend_config: keyword arguments for the named backend's config class.
    :param capture_output: print the script's output on this process's stdout/stderr,
        each line prefixed with ``[rank N]``; ``False`` leaves it to Ray's log streaming.
    :param on_start: called with the run directory once the script runs on every worker.
    :returns: a :class:`LaunchResult`; errors inside the run are returned, not raised.
    :raises LaunchError: bad input, found before any worker starts.
    """

    resolved = resolve_script(target, module)
    if isinstance(backend, str):
        config = backend_config_for_script(backend, backend_config)
    elif backend_config:
        raise LaunchError("backend_config goes with a backend name, not a BackendConfig instance")
    else:
        config = backend
    plugin = _LaunchPlugin(uuid.uuid4().hex[:12])
    try:
        trainer = Trainer(backend=config, num_workers=num_workers, use_gpu=use_gpu,
                          resources_per_worker=resources_per_worker, logdir=logdir, max_retries=max_retries,
                          plugins=[plugin])
    except (TypeError, ValueError) as exc:
        raise LaunchError(str(exc)) from None
    plugin.trainer = trainer


    sink: Any = None
    pump: Optional[OutputPump] = None
    result = LaunchResult(exit_code=1)
    try:
        ensure_ray()
        if capture_output:
            sink = start_sink()
            pump = OutputPump(sink, OutputPrinter(num_workers))
        trainer.start()

        # Hosts with their own disks lack the script: ship its directory, as `ray job submit
        # --working-dir` does (used only where the script is not found at its path).
        bundle = pack(os.getcwd()) if module else pack(os.path.dirname(resolved), must_include=resolved)
        runner = ScriptRunner(resolved, tuple(args), module, os.getcwd(), sink, bundle)
        iterator = trainer.run_iterator(runner)
        result.run_dir = trainer.latest_run_dir
        if on_start is not None and result.run_dir is not None:
            on_start(result.run_dir)
        for round_ in iterator:
            result.final_metrics = round_
        result.exit_code = 0
    except BaseException as exc:  # KeyboardInterrupt included: the workers are stopped below
        result.error = exc
        result.exit_code = exit_code_for(exc)
        result.run_dir = trainer.latest_run_dir
    finally:
        try:
            trainer.shutdown()
        finally:
            result.starts = plugin.starts
            if pump is not None:
                pump.stop()
            if sink is not None:
                import ray

                try:
                    ray.kill(sink)
                except Exception:  # the cluster is already gone
                    pass
    return result
