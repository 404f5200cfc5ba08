"""How a run reaches each worker: one start call per worker, which also answers the run's first
poll.

The call carries a :class:`~sgd._common.protocol.StartRequest` (the function, the backend's
encoders, the checkpoint, the run's settings), the worker's dataset shard and the run
information; what is the same for every run of the group (the driver's node, its file server:
``SENT_ONCE``) only until the worker has it. The request is pickled once per form (one form for
every worker with as many preloads pending, most often all of them) and every call carries the
bytes: a call with three arguments costs the driver far less than one with thirteen (Ray
serialises and checks each argument on its own). A request whose pickle is large (a resumed
run's checkpoint, a function that holds data) is put in the object store once instead and every
call holds a reference. After starting the training thread the worker waits up to
:data:`FIRST_REPLY_S` for the run's first items, then up to :data:`FIRST_LINGER_S` for its end,
and answers with them as a poll reply (:meth:`sgd.group.rounds.RoundCollector` takes it in as
one): a short run costs one call per worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Type

import ray

from sgd._common.protocol import StartRequest
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
#: comes with them: no poll at all), seconds. A run's first items reach the driver at most this
#: much later; at N = 32 on two cores, 200 reports take a worker 30-110 ms, and 5 ms here cost a
#: poll or more per worker and 8 % of the rounds per second (issue 35).
FIRST_LINGER_S = 0.05
#: A start request pickled larger than this (bytes) is put in the object store once and sent by
#: reference (from two workers on); a smaller one travels in every start call.
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
    first_poll = POLL_BATCH if FIRST_REPLY_S > 0 else 0
    forms: Dict[int, Any] = {}  # preloads pending -> what the calls carry
    pickled: Optional[bytes] = None
    once = tuple(run_info.get(k) for k in SENT_ONCE)
    short = {k: v for k, v in run_info.items() if k not in SENT_ONCE}
    refs: List[Any] = []
    for rank in ranks:
        code, preloads = wg.user_code_for(rank, user_code, pickled)
        if preloads:
            pickled = code
        form = forms.get(preloads)
        if form is None:
            form = forms[preloads] = _request_form(
                StartRequest(code, preloads, args.max_pending, args.start_iteration, request.checkpoint_target,
                             args.reforms, first_poll, FIRST_REPLY_S, FIRST_LINGER_S),
                len(ranks))
        worker = wg.workers[rank]
        told = sent_once.get(worker._actor_id)
        if told is not None and all(a is b or a == b for a, b in zip(told, once)):
            info = short  # an actor handle costs both sides far more than plain data
        else:
            info = run_info
            sent_once[worker._actor_id] = once
        shard = args.shards[rank]
        if args.join is not None:
            refs.append(worker._sgd_start_training.remote(form, info, shard, args.join, args.snapshot))
        elif shard is not None:
            refs.append(worker._sgd_start_training.remote(form, info, shard))
        else:
            refs.append(worker._sgd_start_training.remote(form, info))
    return refs


def _request_form(start: StartRequest, workers: int) -> Any:
    """What the start calls carry for ``start``: its pickle; for several workers, the request put
    in the object store once when it holds a checkpoint (Ray's serialiser keeps the arrays out of
    band), or its pickle put there when that is large."""
    import ray.cloudpickle as cloudpickle

    if workers > 1 and not start.preloads and start.user_code[2] is not None:
        return ray.put(start)
    blob = cloudpickle.dumps(start)
    if workers > 1 and len(blob) > INLINE_CODE_BYTES:
        return ray.put(blob)
    return blob
