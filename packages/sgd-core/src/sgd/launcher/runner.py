"""The worker side of ``sgd run``: :class:`ScriptRunner` runs the script as ``__main__``.

It sets ``sys.argv``, ``sys.path``, the working directory and the standard streams, runs the
script (the shipped copy where the host lacks it), and turns ``SystemExit`` into success or
:class:`ScriptExitError`. Both travel pickled and keep ``sgd.launcher`` as their ``__module__``.
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from sgd._common.public import public_module
from sgd.errors import PicklableError
from sgd.launcher.output import OutputChannel, text_stream
from sgd.launcher.ship import unpack
from sgd.session import get_session


@public_module("sgd.launcher")
class ScriptExitError(PicklableError, RuntimeError):
    """The script ended with ``sys.exit(code)``, ``code`` not 0 or ``None``."""

    def __init__(self, code: int, world_rank: int):
        super().__init__(f"the script exited with status {code} on rank {world_rank}")
        self.code = code
        self.world_rank = world_rank



@public_module("sgd.launcher")
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
