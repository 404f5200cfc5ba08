"""``sgd run``: run an unchanged ``torchrun``-style script on N sgd workers.

Each worker runs the script as ``__main__`` (``runpy``) inside an sgd training
session, so ``sgd.report`` / ``sgd.save_checkpoint`` / ``sgd.load_checkpoint``
work in it and a killed worker restarts the script from the top. The pieces:

- :class:`ScriptRunner` (worker side): sets ``sys.argv``, ``sys.path``, the working
  directory and the standard streams, runs the script, turns ``SystemExit`` into
  success or :class:`ScriptExitError`.
- :class:`_LaunchPlugin` (driver side, registered for one launch): sets the
  ``torchrun`` launcher variables on the workers before every start of the script,
  through the ``sgd_backend_training_start`` hook. The backend sets its own
  (``MASTER_ADDR``/``MASTER_PORT`` for torch, ``TF_CONFIG``...).
- Output: the script's ``sys.stdout``/``sys.stderr`` reach the driver line by line
  with a ``[rank N]`` prefix (:mod:`sgd.launcher.output`).
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from sgd.errors import PicklableError, WorkerError
from sgd.hookspecs import hookimpl
from sgd.launcher.output import OutputChannel, OutputPrinter, OutputPump, start_sink, text_stream
from sgd.launcher.ship import pack, unpack
from sgd.plugins import resolve_backend
from sgd.session import get_session
from sgd.trainer import Trainer
from sgd.utils import ensure_ray


class ScriptExitError(PicklableError, RuntimeError):
    """The script ended with ``sys.exit(code)``, ``code`` not 0 or ``None``."""

    def __init__(self, code: int, world_rank: int):
        super().__init__(f"the script exited with status {code} on rank {world_rank}")
        self.code = code
        self.world_rank = world_rank


# --- worker side: running the script ------------------------------------------------------


@dataclass
class ScriptRunner:
    """The training function of ``sgd run``: runs ``target`` as ``__main__`` on a worker.

    :param target: the script's absolute path, or a module name with ``module=True``.
    :param args: the script's arguments (``sys.argv[1:]``).
    :param module: run ``target`` as a module (``python -m``).
    :param cwd: the driver's working directory; used on the worker when it exists there.
    :param sink: the output sink actor, or ``None`` to leave the streams alone.
    :param bundle: the script's directory (for a module, the working directory) packed by the
        driver (:mod:`sgd.launcher.ship`): a worker whose host lacks the script runs the copy.
    """

    target: str
    args: Sequence[str] = ()
    module: bool = False
    cwd: Optional[str] = None
    sink: Any = None
    bundle: Any = None

    def _localized(self) -> Any:
        """This runner with the script, and the working directory, found on this host: as given
        when they exist here, else in the unpacked bundle."""
        bundle = self.bundle
        if bundle is None:
            return self
        present = (self.cwd is not None and os.path.isdir(self.cwd)) if self.module else os.path.isfile(self.target)
        if present:
            return self
        root = unpack(bundle)
        if self.module:
            return dataclasses.replace(self, cwd=root, bundle=None)
        rel = os.path.relpath(self.target, bundle.root)
        target = os.path.join(root, rel)
        cwd = self.cwd
        if cwd is None or not os.path.isdir(cwd):
            within = os.path.relpath(cwd, bundle.root) if cwd is not None else ".."
            cwd = root if within.startswith("..") else os.path.join(root, within)
        return dataclasses.replace(self, target=target, cwd=cwd, bundle=None)

    def __call__(self) -> None:
        local = self._localized()
        if local is not self:
            return local()  # type: ignore[no-any-return]

        session = get_session()
        rank = session.context.world_rank if session is not None else 0
        saved_argv, saved_path, saved_out, saved_err = sys.argv, list(sys.path), sys.stdout, sys.stderr
        saved_cwd = os.getcwd()
        channel = OutputChannel(self.sink, rank) if self.sink is not None else None
        if channel is not None:
            sys.stdout = text_stream(channel, "stdout", saved_out)
            sys.stderr = text_stream(channel, "stderr", saved_err)
        try:
            if self.cwd and os.path.isdir(self.cwd):
                os.chdir(self.cwd)
            self._run(rank)
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            sys.argv, sys.stdout, sys.stderr = saved_argv, saved_out, saved_err
            sys.path[:] = saved_path
            try:
                os.chdir(saved_cwd)
            except OSError:
                pass
            if channel is not None:
                channel.close()

    def _run(self, rank: int) -> None:
        try:
            if self.module:
                sys.argv = [self.target, *self.args]  # runpy puts the module's path in argv[0]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(self.target, run_name="__main__", alter_sys=True)
            else:
                if not os.path.isfile(self.target):
                    import socket

                    raise FileNotFoundError(
                        f"script {self.target} not found on worker rank {rank} ({socket.gethostname()}) and "
                        "not shipped (its directory exceeds SGD_RUN_SHIP_LIMIT_MB); put it at the same path "
                        "on every host (a shared file system) or raise the limit."
                    )
                sys.argv = [self.target, *self.args]
                sys.path.insert(0, os.path.dirname(self.target))
                runpy.run_path(self.target, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            if code is None or code == 0:
                return
            if not isinstance(code, int):
                print(code, file=sys.stderr)  # as the interpreter does for sys.exit("message")
                code = 1
            raise ScriptExitError(code, rank) from None
        except BaseException as exc:
            # Start the remote traceback at the script, not at runpy's machinery.
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None and _is_launcher_frame(tb.tb_frame.f_code.co_filename):
                tb = tb.tb_next
            exc.__traceback__ = tb
            raise


def _is_launcher_frame(filename: str) -> bool:
    return filename in ("<frozen runpy>", __file__, getattr(runpy, "__file__", None))


# --- driver side: environment ------------------------------------------------------------


def _set_env(env: Dict[str, str]) -> None:
    os.environ.update(env)


def launcher_env(contexts: Sequence[Any], run_id: str, restart_count: int, max_restarts: int,
                 run_dir: Optional[str]) -> List[Dict[str, str]]:
    """The variables ``torchrun`` sets for its workers (and ``SGD_RUN_DIR``), one dict per rank.

    :param contexts: the workers' :class:`~sgd._worker.session.WorkerContext`, in rank order.
    """
    n = len(contexts)
    nodes = len({c.node_rank for c in contexts})
    envs = []
    for rank, ctx in enumerate(contexts):
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(n),
            "LOCAL_RANK": str(ctx.local_rank),
            "LOCAL_WORLD_SIZE": str(ctx.local_world_size),
            "GROUP_RANK": str(ctx.node_rank),
            "GROUP_WORLD_SIZE": str(nodes),
            "NODE_RANK": str(ctx.node_rank),
            "ROLE_NAME": "default",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(n),
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            # Our workers have no elastic agent: init_process_group must not look for its store.
            "TORCHELASTIC_USE_AGENT_STORE": "False",
        }
        if run_dir is not None:
            env["SGD_RUN_DIR"] = run_dir
        envs.append(env)
    return envs


class _LaunchPlugin:
    """A plugin of one launch's trainer only (``Trainer(plugins=[...])``): before every start
    of the script (the first and each restart) sets the launcher variables on the workers."""

    def __init__(self, run_id: str):
        #: the launch's trainer (set once it is made)
        self.trainer: Any = None
        self._run_id = run_id
        self.starts = 0

    @hookimpl
    def sgd_backend_training_start(self, worker_group: Any, backend_config: Any) -> None:
        self._set(worker_group, self.starts)
        self.starts += 1

    @hookimpl
    def sgd_backend_setup(self, worker_group: Any, backend_config: Any) -> None:
        # A group re-formed in place while the script runs (sgd.elastic.run): its new workers
        # (and the survivors' new ranks) get the variables of the current start.
        if self.starts:
            self._set(worker_group, self.starts - 1)

    def _set(self, worker_group: Any, restart_count: int) -> None:
        import ray

        run_dir = self.trainer.latest_run_dir
        envs = launcher_env(worker_group.contexts, self._run_id, restart_count, self.trainer.max_retries,
                            str(run_dir) if run_dir is not None else None)
        ray.get([worker_group.execute_single_async(rank, _set_env, env) for rank, env in enumerate(envs)])


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


def failure_message(error: BaseException) -> str:
    """What ``sgd run`` prints for ``error``: the failing rank and its remote traceback."""

    if isinstance(error, ScriptExitError):
        return f"worker rank {error.world_rank} exited with status {error.code}"
    seen = set()
    exc: Optional[BaseException] = error
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, WorkerError):
            head = str(exc).split("\n\nRemote traceback:\n", 1)[0]
            return f"{head}\n\nRemote traceback:\n{trim_traceback(exc.remote_traceback).rstrip()}"
        seen.add(id(exc))
        exc = exc.__cause__
    return f"{type(error).__name__}: {error}"


def trim_traceback(text: str) -> str:
    """``text`` (a formatted traceback) without the sgd frames its blocks start with: the
    session thread and the runner, the same in every run. The script's frames stay; a
    block made only of sgd frames stays whole."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # sgd/
    lines = text.splitlines(keepends=True)
    out: List[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        i += 1
        if not lines[i - 1].startswith("Traceback (most recent call last):"):
            continue
        frames: List[List[str]] = []  # each: the 'File' line and its source lines
        while i < len(lines) and lines[i].startswith('  File "'):
            frame = [lines[i]]
            i += 1
            while i < len(lines) and lines[i].startswith("    "):
                frame.append(lines[i])
                i += 1
            frames.append(frame)

        def ours(frame: List[str]) -> bool:
            filename = frame[0][len('  File "'):].split('"', 1)[0]
            return os.path.abspath(filename).startswith(package)

        first = next((k for k, f in enumerate(frames) if not ours(f)), 0)
        for frame in frames[first:]:
            out.extend(frame)
    return "".join(out)


def exit_code_for(error: BaseException) -> int:
    if isinstance(error, ScriptExitError):
        return error.code if 0 < error.code < 256 else 1
    if isinstance(error, KeyboardInterrupt):
        return 130
    return 1


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
