"""How a run reaches each worker: one start call per worker, which also answers the run's first
poll.

The call carries the run's code (the function, the backend's encoders, the checkpoint), the
worker's dataset shard and the run information; what is the same for every run of the group
(the driver's node, its file server: ``SENT_ONCE``) only until the worker has it. From
:data:`PUT_CODE_FROM` workers on the code is put in the object store once and every call holds a
reference. After starting the training thread the worker waits up to :data:`FIRST_REPLY_S` for
the run's first items, then up to :data:`FIRST_LINGER_S` for its end, and answers with them as a
poll reply (:meth:`sgd.group.rounds.RoundCollector` takes it in as one): a short run costs one
call per worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Type

import ray

from sgd._worker.actor import SENT_ONCE
from sgd.backend import Backend
from sgd.group.protocol import RunRequest
from sgd.group.rounds import POLL_BATCH
from sgd.worker_group import WorkerGroup

#: How long a worker's start call waits for its run's first items, to send them with its reply:
#: one call fewer per worker and run. A run slower to report is polled as usual after it, seconds
#: (``0``: the start call answers nothing; every item comes with a poll).
FIRST_REPLY_S = 0.05
#: Once those items are there, how much longer it waits for the run's end (a short run's end then
#: comes with them: no poll at all), seconds.
FIRST_LINGER_S = 0.005
#: From this many workers on, a run's code and checkpoint are put in the object store once and
#: sent by reference (below it, inline in each call is cheaper).
PUT_CODE_FROM = 4
#: A run's code pickled smaller than this (bytes) is sent in every start call all the same.
INLINE_CODE_BYTES = 64 * 1024


@dataclass
class StartArgs:
    """What a start call carries besides the code and the run information."""

    shards: List[Any]  # by rank
    max_pending: int
    start_iteration: int
    reforms: bool  # the backend can re-form the group in place
    join: Any = None  # these workers join a group that re-formed in place...
    snapshot: Any = None  # ...from this snapshot's reference


def start_calls(wg: WorkerGroup, ranks: List[int], request: RunRequest, backend_cls: Type[Backend],
                run_info: Dict[str, Any], sent_once: Dict[Any, Tuple[Any, ...]], args: StartArgs) -> List[Any]:
    """Start ``request``'s function on the workers of ``wg`` at ``ranks``; the start calls'
    references. ``sent_once`` (actor id → what it was told once) is updated."""
    # Everything that may import a framework when unpickled (the function, the backend's
    # encoders, the checkpoint) travels pickled while a preload is pending on that worker,
    # which unpickles it once the preload finished (issue 18). The encoders run on the
    # workers: no backend instance state travels.
    user_code = (request.train_func, backend_cls.encode_data, request.checkpoint)
    # From PUT_CODE_FROM workers on, sent once rather than once per worker: each form (the
    # code, or its pickle for workers with a preload pending) is put in the object store once
    # and every worker gets a reference (a resumed run's checkpoint is serialised once). A
    # pickle smaller than INLINE_CODE_BYTES travels in each call instead: fetching an object
    # from another node's store costs every worker more than the bytes in its call.
    first_poll = POLL_BATCH if FIRST_REPLY_S > 0 else 0
    refs: List[Any] = []
    pickled: Optional[bytes] = None
    put: Dict[bool, Any] = {}
    once = tuple(run_info.get(k) for k in SENT_ONCE)
    short = {k: v for k, v in run_info.items() if k not in SENT_ONCE}
    for rank in ranks:
        code, preloads = wg.user_code_for(rank, user_code, pickled)
        if preloads:
            pickled = code
        if len(ranks) >= PUT_CODE_FROM and not (preloads and len(code) < INLINE_CODE_BYTES):
            if bool(preloads) not in put:
                put[bool(preloads)] = ray.put(code)
            code = put[bool(preloads)]
        worker = wg.workers[rank]
        told = sent_once.get(worker._actor_id)
        if told is not None and all(a is b or a == b for a, b in zip(told, once)):
            info = short  # an actor handle costs both sides far more than plain data
        else:
            info = run_info
            sent_once[worker._actor_id] = once
        refs.append(worker._sgd_start_training.remote(
            code, args.shards[rank], args.max_pending, args.start_iteration, request.checkpoint_target,
            info, preloads, args.reforms, args.join, args.snapshot, first_poll, FIRST_REPLY_S, FIRST_LINGER_S,
        ))
    return refs
