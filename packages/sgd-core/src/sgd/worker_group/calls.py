"""Running code on a worker group's actors: execute (on all, on one), preloads, stacks.

A function sent to a worker that was told to preload modules travels pickled and is unpickled
there only once those preloads finished, so that unpickling it never races an import.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import ray

from sgd._common.waits import wait

#: After one worker's call in :meth:`WorkerGroup.execute` failed, how long the others may go on.
EXECUTE_ERROR_GRACE_S = 5.0


class _Calls:
    """The running-code part of :class:`sgd.WorkerGroup` (a mixin: the group's ``__init__`` sets these)."""

    workers: List[Any]
    _preloads: Dict[Any, int]

    def _check_running(self) -> None:
        if not self.workers:
            raise RuntimeError("this WorkerGroup is shut down; call start() first")

    def _send_preload(self, actor: Any, modules: Tuple[str, ...]) -> None:
        actor._sgd_preload.remote(tuple(modules))
        self._preloads[actor._actor_id] = self._preloads.get(actor._actor_id, 0) + 1

    def user_code_for(self, index: int, code: Any, pickled: Optional[bytes] = None) -> Tuple[Any, int]:
        """How to send ``code`` (a function) to worker ``index``: ``(code or its pickle, preloads)``.

        While preloads were sent to that worker, the function travels pickled and the worker
        unpickles it once they finished (``preloads`` is how many), so that unpickling never
        races an import. For code that calls worker methods itself; :meth:`execute` does it.
        """
        n = self._preloads.get(self.workers[index]._actor_id, 0)
        if not n:
            return code, 0
        if pickled is None:
            import ray.cloudpickle as cloudpickle

            pickled = cloudpickle.dumps(code)
        return pickled, n

    def stacks(self, timeout_s: float = 10.0, include_idle: bool = False) -> List[str]:
        """The Python stack of every thread of every worker, in rank order (see
        :meth:`sgd.Trainer.stacks`). A worker that does not answer within ``timeout_s`` (dead,
        or its process frozen) gets a line that says so."""
        self._check_running()
        refs = [w._sgd_stacks.remote(include_idle) for w in self.workers]
        ready, _ = wait(refs, timeout=timeout_s)
        out = []
        for rank, ref in enumerate(refs):
            if ref not in ready:
                out.append(f"=== rank {rank}: no answer within {timeout_s:g} s (its process is frozen or gone) ===\n")
                continue
            try:
                out.append(ray.get(ref))
            except Exception as exc:  # dead
                out.append(f"=== rank {rank}: no stack ({type(exc).__name__}: {str(exc).splitlines()[0]}) ===\n")
        return out

    def execute_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[ray.ObjectRef]:
        """Run ``fn(*args, **kwargs)`` on every worker; object refs in rank order."""
        self._check_running()
        refs, pickled = [], None
        for i, w in enumerate(self.workers):
            code, n = self.user_code_for(i, fn, pickled)
            if n:
                pickled = code
            refs.append(w._sgd_execute.remote(code, args, kwargs, n))
        return refs

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> List[Any]:
        """Run ``fn(*args, **kwargs)`` on every worker; results in rank order."""
        refs = self.execute_async(fn, *args, **kwargs)
        pending = list(refs)
        while pending:
            # Every call that returned (one wait and one get for all of them, so that the
            # driver's calls do not grow as N² with the workers), else the first to return.
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
            if not ready:
                ready, pending = wait(pending, num_returns=1)
            try:
                ray.get(ready)
            except Exception:
                # The other calls get a moment to end (so that each worker ran ``fn`` once
                # whichever failed first), not forever: one may be blocked in a collective
                # the failed worker will never join. Their results are read, so that Ray
                # does not log their errors as "unhandled" later.
                done = wait(pending, timeout=EXECUTE_ERROR_GRACE_S)[0]
                for ref in done:
                    try:
                        ray.get(ref)
                    except Exception:
                        pass
                raise
        return ray.get(refs)  # read already: no round trip

    def execute_single_async(self, index: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ray.ObjectRef:
        """Run ``fn(*args, **kwargs)`` on worker ``index``; an object ref."""
        self._check_running()
        if not 0 <= index < len(self.workers):
            raise IndexError(f"worker index {index} out of range for {len(self.workers)} workers")
        code, n = self.user_code_for(index, fn)
        return self.workers[index]._sgd_execute.remote(code, args, kwargs, n)

    def execute_single(self, index: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on worker ``index`` and return its result."""
        return ray.get(self.execute_single_async(index, fn, *args, **kwargs))

    def preload(self, modules: Tuple[str, ...]) -> None:
        """Start importing ``modules`` on every worker in the background and return at once.

        The driver and the workers' control calls (placement, ranks) go on meanwhile; a
        function sent later with :meth:`execute` (or a training function) is unpickled on each
        worker only once the preloads sent before it finished, so that unpickling it never races
        the import (which can leave a package half-imported). An import error is left for the
        code that needs the module to report.
        """
        self._check_running()
        for w in self.workers:
            self._send_preload(w, tuple(modules))

