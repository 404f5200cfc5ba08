"""The launcher variables of ``sgd run``: what ``torchrun`` sets for its workers, set on sgd's.

:class:`_LaunchPlugin` is a plugin of one launch's trainer only: before every start of the
script (the first, each restart, and a group re-formed in place) it sets the variables on the
workers, through the backend lifecycle hooks. The backend sets its own (``MASTER_ADDR`` and
``MASTER_PORT`` for torch, ``TF_CONFIG``...).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

from sgd.hookspecs import hookimpl


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
