"""Sharded checkpoints: every worker writes its own part of the state with
``torch.distributed.checkpoint`` (DCP), straight into the run's checkpoint folder; the driver
never holds the weights.

``save_sharded_checkpoint({"model": model, "opt": opt}, step=3)`` on every rank: each writes
its shard into a temporary folder and hashes it, rank 0 adds sgd's metadata (the digests of
every file and ``step=3``), and the driver renames the folder into place, numbered, as the
latest checkpoint, and applies the retention policy. A failure before that leaves the previous
checkpoint as the latest. ``load_sharded_checkpoint({"model": model, "opt": opt})`` loads the
checkpoint the run started from (``run(..., checkpoint=path)``, ``fit(resume_from_checkpoint=...)``
or the one restored after a failure) into the objects, in place, whatever the number of workers
and however the model is sharded now, and returns its metadata.

Nothing read from a checkpoint runs code: DCP's ``.metadata`` file is a pickle, read here with
an unpickler that builds only DCP's own metadata classes; values stored as bytes (an optimizer's
``lr``...) are read with ``torch.load(weights_only=True)``.

This module saves and loads; what the state dict of a model or optimizer is to DCP is in
:mod:`sgd_torch.sharded_state`, and the safe reading of the files in :mod:`sgd_torch.sharded_reader`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from sgd.checkpoint import METADATA_FILE, SHARDED_KEY, is_sharded, write_sharded_metadata
from sgd.checkpoint.integrity import file_digest
from sgd.session import get_session
from sgd_torch.sharded_reader import _DCP_METADATA, SafeFileSystemReader, SafeLoadPlanner
from sgd_torch.sharded_state import _apply, _check_against, _dcp_state

#: What a sharded checkpoint's metadata names as the writer of its files.
WRITER = "torch.distributed.checkpoint"


def save_sharded_checkpoint(state: Dict[str, Any], *, blocking: bool = True, **metadata: Any) -> None:
    """Save ``state`` as a sharded checkpoint; call it on every worker, as ``sgd.save_checkpoint``.

    :param state: models (``nn.Module``, FSDP2 / DDP / plain), optimizers (with their model
        in the same dict) and tensors, by name: ``{"model": model, "opt": optimizer}``.
    :param blocking: ``True``: returns once the checkpoint is committed. ``False``: returns
        once the state is staged (copied); the shards are written in the background, over a
        process group of their own, while training goes on, and the driver commits the
        checkpoint when every shard is written. The next save waits for the previous one, and
        the run does not end before the last one is committed.
    :param metadata: JSON values saved with it (``step=3``): what ``trainer.latest_checkpoint``
        and :func:`load_sharded_checkpoint` return; the checkpoint strategy scores by them.
    :raises TypeError: a value of ``state`` is neither a model, an optimizer nor a tensor, or the
        metadata is not JSON.
    """
    session = _session("save_sharded_checkpoint")
    try:
        metadata = json.loads(json.dumps(metadata, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the metadata of a sharded checkpoint must be JSON values (numbers, strings, lists, "
                        f"dicts): {exc}; put tensors in the state instead") from None
    folder = session.checkpoint_dir
    if folder is None:
        raise RuntimeError("this run has no run directory to write a sharded checkpoint into")
    _wait_for_previous(session)
    count = getattr(session, "_sgd_torch_sharded_saves", 0)
    session._sgd_torch_sharded_saves = count + 1
    # Every rank calls this the same number of times, so the count names the same folder on all.
    tmp = os.path.join(folder, f".tmp_sharded_{count:06d}")
    rank = session.context.world_rank
    # A worker whose host has a disk of its own writes its shard there, then sends it to the
    # driver's disk (sgd's file server, in chunks); one on the driver's host writes in place.
    files = None if session.shares_driver_disk else session.driver_files
    local = tempfile.mkdtemp(prefix=f"sgd_shard_{count:06d}_") if files is not None else tmp
    os.makedirs(local, exist_ok=True)
    if blocking:
        dcp.save(_dcp_state(state), checkpoint_id=local)
        _finish(local, tmp, rank, metadata, None, files)
        session.commit_written_checkpoint(tmp if rank == 0 else None, score_values=metadata)
        return
    group = _checkpoint_group()
    response = dcp.async_save(_dcp_state(state), checkpoint_id=local, process_group=group,
                              async_stager=_stager(session))
    # A Future, or (other stager settings) a response whose upload_completion is one.
    written: Any = getattr(response, "upload_completion", response)
    # Announced now, at the same place in every worker's stream of reports; committed later.
    session.commit_written_checkpoint(tmp if rank == 0 else None, score_values=metadata, wait=False)
    box: Dict[str, Any] = {}

    def finish_in_background() -> None:
        try:
            written.result()
            _finish(local, tmp, rank, metadata, group, files)
        except BaseException as exc:  # raised in the training thread by the next save or at the end
            box["error"] = exc

    thread = threading.Thread(target=finish_in_background, name="sgd-sharded-save", daemon=True)
    thread.start()
    if not hasattr(session, "_sgd_torch_pending_save"):
        session.add_finalizer(lambda: _end_of_run(session))
    session._sgd_torch_pending_save = (thread, box)


def _finish(local: str, tmp: str, rank: int, metadata: Dict[str, Any], group: Any, files: Any) -> None:
    """Every rank hashes the files it wrote (in parallel: the driver reads none of them) and,
    from a host of its own, sends them to ``tmp`` on the driver's disk; rank 0 checks that
    every shard is there and writes sgd's metadata, last."""
    try:
        own = _own_files(local, rank)
        digests = {name: file_digest(Path(local, name)) for name in own}
        if files is not None:
            for name in own:
                files.upload(os.path.join(local, name), os.path.join(tmp, name))
        every = _gather_to_rank0(digests, group)  # after every rank's upload: all are in tmp
        if rank != 0:
            return
        digests = {}
        for part in every:
            digests.update(part)
        digests[_DCP_METADATA] = file_digest(Path(local, _DCP_METADATA))
        missing = sorted(_data_files(local) - set(digests))
        if missing:
            raise FileNotFoundError(f"sharded checkpoint {tmp}: no worker reported writing the shards {missing}; "
                                    "it is not committed")
        write_sharded_metadata(Path(local), digests, metadata, WRITER)
        if files is not None:  # DCP's metadata, then sgd's: the driver commits once that one is there
            files.upload(os.path.join(local, _DCP_METADATA), os.path.join(tmp, _DCP_METADATA))
            files.upload(os.path.join(local, METADATA_FILE), os.path.join(tmp, METADATA_FILE))
    finally:
        if files is not None:
            shutil.rmtree(local, ignore_errors=True)


def _stager(session: Any) -> Any:
    """One stager per run and worker: it keeps the staging copy's memory from one save to the
    next (copied into again, not allocated and faulted in anew: 4x faster staging on CPU)."""
    stager = getattr(session, "_sgd_torch_stager", None)
    if stager is None and _stager_reusable():
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        cuda = torch.cuda.is_available()
        stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                              use_async_staging=False, use_non_blocking_copy=False))
        session._sgd_torch_stager = stager
    return stager  # None: DCP stages into fresh memory each time


_REUSABLE: List[bool] = []


def _stager_reusable() -> bool:
    """Whether this torch's ``DefaultStager`` stages more than once. torch 2.11's closes itself
    at the end of each staging (pytorch/pytorch#183413): reused, the second save fails with
    ``KeyError: <class 'type'>``. Tried once per process on a tiny state."""
    if not _REUSABLE:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        probe = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False,
                                             use_async_staging=False, use_non_blocking_copy=False))
        try:
            for _ in range(2):
                probe.stage({"t": torch.zeros(1), "meta": {"step": 1}})
            _REUSABLE.append(True)
        except Exception:
            _REUSABLE.append(False)
        finally:
            probe.close()
    return _REUSABLE[0]


def _end_of_run(session: Any) -> None:
    """The last asynchronous save is written; then the staging memory goes."""
    try:
        _wait_for_previous(session)
    finally:
        stager = getattr(session, "_sgd_torch_stager", None)
        if stager is not None:
            stager.close()


def _wait_for_previous(session: Any) -> None:
    """Wait for this run's asynchronous save in flight, if any; raise what it raised."""
    pending = getattr(session, "_sgd_torch_pending_save", None)
    if pending is None:
        return
    thread, box = pending
    thread.join()
    session._sgd_torch_pending_save = None
    if "error" in box:
        raise box["error"]


#: The gloo process group asynchronous saves run their collectives on, per default group:
#: a background thread must not use the group training's collectives run on.
_GROUPS: Dict[int, Any] = {}


def _checkpoint_group() -> Any:
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size() == 1 and "gloo" in str(dist.get_backend()):
        return None  # nothing to run concurrently with training's collectives
    # Also for one worker over NCCL: DCP's asynchronous save refuses a group without a CPU backend.
    world = dist.group.WORLD
    key = id(world)
    if key not in _GROUPS:
        _GROUPS.clear()  # a process group of an earlier run (destroyed since)
        _GROUPS[key] = dist.new_group(backend="gloo")  # collective: every rank is at this save
    return _GROUPS[key]


def load_sharded_checkpoint(state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Load the checkpoint this run started from into ``state``'s objects, in place; call it
    on every worker. Saved by 2 FSDP workers, it loads into 1 worker without FSDP, or 3.

    :param state: the same names as when it was saved: ``{"model": model, "opt": optimizer}``.
    :returns: its metadata, or ``None`` when the run started from no checkpoint.
    :raises ValueError: the checkpoint is a whole-state one (load it with ``sgd.load_checkpoint``),
        a key is missing from it, or a tensor's shape differs (the message names the key and both shapes).
    """
    session = _session("load_sharded_checkpoint")
    loaded = session.loaded_checkpoint
    if loaded is None:
        return None
    if not is_sharded(loaded):
        raise ValueError("the checkpoint this run started from is a whole-state checkpoint (sgd.save_checkpoint, "
                         "or a dict or directory passed to run()): load it with sgd.load_checkpoint(), not "
                         "sgd_torch.load_sharded_checkpoint()")
    path = loaded[SHARDED_KEY]
    # The checkpoint is on the driver's disk: read in place, or through sgd's file server from
    # a host of its own (each rank fetches only the byte ranges its shards need).
    reader = SafeFileSystemReader(path, None if session.shares_driver_disk else session.driver_files)
    saved = reader.read_metadata()
    target = _dcp_state(state)
    _check_against(target, saved.state_dict_metadata, path)
    dcp.load(target, storage_reader=reader, planner=SafeLoadPlanner())
    _apply(state, target)
    return {k: v for k, v in loaded.items() if k != SHARDED_KEY}


def _own_files(folder: str, rank: int) -> List[str]:
    return sorted(f for f in os.listdir(folder) if f.startswith(f"__{rank}_") and f.endswith(".distcp"))


def _data_files(folder: str) -> set:
    """The shard files DCP's metadata says the checkpoint has."""
    saved = SafeFileSystemReader(folder).read_metadata()
    return {info.relative_path for info in (saved.storage_data or {}).values()}


def _gather_to_rank0(value: Any, group: Any = None) -> List[Any]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    out: List[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    dist.gather_object(value, out if dist.get_rank() == 0 else None, dst=0, group=group)
    return out


def _session(what: str) -> Any:
    session = get_session()
    if session is None:
        raise RuntimeError(f"sgd_torch.{what} is called inside a training function (on every worker)")
    return session
