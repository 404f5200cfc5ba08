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
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element  # what DCP's own planner uses
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from sgd.checkpoint import METADATA_FILE, SHARDED_KEY, UntrustedCheckpointError, is_sharded, write_sharded_metadata
from sgd.checkpoint.integrity import file_digest
from sgd.session import get_session

#: What a sharded checkpoint's metadata names as the writer of its files.
WRITER = "torch.distributed.checkpoint"
_DCP_METADATA = ".metadata"


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


# --- the state and DCP ----------------------------------------------------------------------


def _dcp_state(state: Dict[str, Any]) -> Dict[str, Any]:
    if not isinstance(state, dict) or not state:
        raise TypeError(f"the state must be a non-empty dict of models, optimizers and tensors, got {state!r}")
    modules = [v for v in state.values() if isinstance(v, torch.nn.Module)]
    out: Dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, torch.nn.Module):
            out[key] = get_model_state_dict(value)
        elif isinstance(value, torch.optim.Optimizer):
            out[key] = get_optimizer_state_dict(_model_of(value, modules, key), value)
        elif isinstance(value, torch.Tensor):
            out[key] = value
        else:
            raise TypeError(
                f"state[{key!r}] is a {type(value).__name__}: a sharded checkpoint holds models, optimizers and "
                "tensors; pass plain values as metadata (save_sharded_checkpoint(state, step=3))")
    return out


def _model_of(optimizer: torch.optim.Optimizer, modules: List[torch.nn.Module], key: str) -> torch.nn.Module:
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules:
        if wanted <= {id(p) for p in module.parameters()}:
            return module
    raise TypeError(f"state[{key!r}] is an optimizer whose model is not in the same dict; pass both: "
                    f"{{'model': model, {key!r}: optimizer}}")


def _apply(state: Dict[str, Any], loaded: Dict[str, Any]) -> None:
    modules = [v for v in state.values() if isinstance(v, torch.nn.Module)]
    for key, value in state.items():
        if isinstance(value, torch.nn.Module):
            set_model_state_dict(value, loaded[key])
        elif isinstance(value, torch.optim.Optimizer):
            set_optimizer_state_dict(_model_of(value, modules, key), value, loaded[key])
        # tensors were loaded in place by dcp.load


def _check_against(target: Dict[str, Any], saved: Dict[str, Any], where: str) -> None:
    """Every tensor of the models (and plain tensors) is in the checkpoint, with its shape."""
    for key, value in target.items():
        items = value.items() if isinstance(value, dict) and not _is_optimizer_state(value) else []
        pairs = [(f"{key}.{name}", t) for name, t in items] if items else [(key, value)]
        for fqn, tensor in pairs:
            if not isinstance(tensor, torch.Tensor):
                continue
            entry = saved.get(fqn)
            if entry is None:
                raise ValueError(f"sharded checkpoint {where} has no {fqn!r} (the model has it, with shape "
                                 f"{tuple(tensor.shape)}); its keys start with: {sorted(saved)[:8]}")
            size = getattr(entry, "size", None)
            if size is not None and tuple(size) != tuple(tensor.shape):
                raise ValueError(f"sharded checkpoint {where}: {fqn!r} has shape {tuple(size)} in the checkpoint "
                                 f"and {tuple(tensor.shape)} in the model")


def _is_optimizer_state(value: Dict[str, Any]) -> bool:
    return set(value) == {"state", "param_groups"}


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


# --- reading untrusted files --------------------------------------------------------------


def _allowed(module: str, name: str) -> Any:
    """The objects a DCP ``.metadata`` pickle may name: DCP's metadata classes, ``torch.Size``,
    dtypes, layouts, memory formats and paths. Nothing that runs code when called."""
    import pathlib

    import torch.distributed.checkpoint.filesystem as dcp_fs
    import torch.distributed.checkpoint.metadata as dcp_meta

    if module == "torch.distributed.checkpoint.metadata" and not name.startswith("__"):
        obj = getattr(dcp_meta, name, None)
        if isinstance(obj, type):
            return obj
    if module == "torch.distributed.checkpoint.filesystem" and name == "_StorageInfo":
        return dcp_fs._StorageInfo
    if module == "torch" and name == "Size":
        return torch.Size
    if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
        return getattr(torch, name)
    if module == "torch.serialization" and name == "_get_layout":
        return _layout_by_name
    if module == "pathlib" and name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
        return getattr(pathlib, name)
    if module == "collections" and name == "OrderedDict":
        import collections

        return collections.OrderedDict
    return None


def _layout_by_name(name: str) -> Any:
    layout = getattr(torch, str(name).replace("torch.", ""), None)
    if not isinstance(layout, torch.layout):
        raise UntrustedCheckpointError(f"unknown tensor layout {name!r} in a sharded checkpoint's metadata")
    return layout


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, where: str):
        super().__init__(file)
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        obj = _allowed(module, name)
        if obj is None:
            raise UntrustedCheckpointError(
                f"sharded checkpoint {self._where}: its {_DCP_METADATA} names {module}.{name}, which is not part of "
                "torch.distributed.checkpoint's metadata; it was altered or not written by sgd, and is not loaded")
        return obj


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader, reading the ``.metadata`` pickle with an unpickler that builds only
    DCP's metadata classes (``torch.distributed.checkpoint.FileSystemReader`` unpickles anything).

    :param path: the checkpoint folder.
    :param driver_files: read it from the driver's disk through sgd's file server
        (``Session.driver_files``) instead of this host's: each tensor's byte range, fetched
        when DCP asks for it.
    """

    def __init__(self, path: Any, driver_files: Any = None) -> None:
        super().__init__(path)
        self._driver_files = driver_files
        if driver_files is not None:
            self.fs = _DriverFileSystem()

    def _read_file(self, name: str) -> bytes:
        where = os.path.join(str(self.path), name)
        if self._driver_files is None:
            with open(where, "rb") as f:
                return f.read()
        return self._driver_files.read(where, 0, self._driver_files.size(where))

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        if self._driver_files is None:
            return super()._slice_file(file, sinfo)
        return io.BytesIO(self._driver_files.read(str(file), sinfo.offset, sinfo.length))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise UntrustedCheckpointError("per-rank DCP metadata files are not read by sgd")
        where = str(self.path)
        metadata = _MetadataUnpickler(io.BytesIO(self._read_file(_DCP_METADATA)), where).load()
        if not isinstance(metadata, Metadata):
            raise UntrustedCheckpointError(f"sharded checkpoint {where}: {_DCP_METADATA} does not hold DCP metadata")
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = getattr(self, "load_id", None)
        metadata.storage_meta = storage_meta
        return metadata


class _DriverFileSystem(FileSystem):
    """Paths on the driver's host: a "stream" is the file's path; :meth:`SafeFileSystemReader._slice_file`
    fetches each byte range through the file server."""

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        if mode != "rb":
            raise PermissionError(f"{path} on the driver's host is opened for reading only")
        yield str(path)


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, reading values stored as bytes with ``torch.load(weights_only=True)``
    (plain values and tensors only; DCP's own planner unpickles anything)."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
