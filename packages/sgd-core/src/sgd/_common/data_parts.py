"""Dividing a Ray Dataset's plan into parts that workers execute on their own.

A dataset whose logical plan is a *source* followed only by one-to-one maps (``map``,
``map_batches``, ``filter``, ``flat_map``, column selection...) can be cut at its source:
the source's **units** (the read tasks of a datasource, the files of a file read, the blocks
of in-memory data) are dealt out, and each part is the same chain of maps over a source that
holds only that part's units. Each worker executes its part with its own Ray Data executor,
so no actor sits between the workers and the blocks.

Everything here reads Ray Data's logical plan (``ray.data._internal``): :func:`divisible`
says why a plan cannot be divided, and the callers fall back to ``streaming_split``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

_UNIT_BYTES = 128 * 1024 * 1024  # Ray Data's default target block size

#: a part: ``(unit index, first row, end row)`` per unit; ``None`` rows means the whole unit.
Slices = List[Tuple[int, Optional[int], Optional[int]]]


@dataclass
class Units:
    """What one dataset's source is made of, found once on the driver."""

    kind: str  # "read" (read tasks), "files" (a file listing), "blocks" (in-memory bundles)
    items: List[Any]  # ReadTask | file path | RefBundle, one per unit
    rows: List[Optional[int]]
    weights: List[float]  # what balancing compares when rows are unknown (bytes or 1)

    @property
    def sliceable(self) -> bool:
        """Whether a unit can be cut at a row (so parts balance to one row, and equal parts exist)."""
        return self.kind in ("read", "blocks") and all(r is not None for r in self.rows)

    @property
    def total_rows(self) -> Optional[int]:
        return sum(r for r in self.rows if r is not None) if self.sliceable else None


def _chain(ds: Any) -> Tuple[Any, List[Any]]:
    """The plan's source operator and the operators above it, lowest first."""
    op = ds._logical_plan.dag
    above = []
    while op.input_dependencies:
        if len(op.input_dependencies) != 1:
            raise _NotDivisible(f"{type(op).__name__} combines several datasets")
        above.append(op)
        op = op.input_dependencies[0]
    above.reverse()
    return op, above


class _NotDivisible(Exception):
    pass


def divisible(ds: Any) -> Optional[str]:
    """``None`` when the dataset's plan can be divided into parts, else why not."""
    try:
        from ray.data._internal.logical.operators.map_operator import AbstractMap
        from ray.data._internal.logical.operators.read_operator import ListFiles, Read, ReadFiles

        source, above = _chain(ds)
        if isinstance(source, ListFiles):
            if not above or not isinstance(above[0], ReadFiles):
                return "its file listing is not read by a ReadFiles operator"
        elif not isinstance(source, Read) and source.output_data() is None:
            return f"its source {type(source).__name__} is neither a read nor data in the object store"
        if isinstance(source, Read) and source.datasource.should_create_reader:
            return "its datasource only has the legacy reader interface"
        for op in above:
            if not isinstance(op, AbstractMap):
                return (f"it holds {type(op).__name__}, an operation over the whole dataset (a shuffle, "
                        "sort, repartition, limit, union...)")
        return None
    except _NotDivisible as exc:
        return str(exc)
    except (ImportError, AttributeError) as exc:  # another Ray version's plan
        return f"this Ray version's plan is not understood ({exc})"


def find_units(ds: Any, min_units: int) -> Units:
    """The units of a divisible dataset's source (see :func:`divisible`)."""
    from ray.data._internal.logical.operators.read_operator import ListFiles, Read

    source, _ = _chain(ds)
    if isinstance(source, Read):
        parallelism = source.parallelism if source.parallelism and source.parallelism > 0 else 0
        size = source.datasource.estimate_inmemory_data_size()
        by_size = -(-size // _UNIT_BYTES) if size else 0
        # Enough read tasks that parts balance and each worker's executor has several to run
        # at once, none much above a block's size (a datasource caps this at its files or rows).
        tasks = source.datasource.get_read_tasks(max(parallelism, min_units, by_size))
        rows = [t.metadata.num_rows for t in tasks]
        return Units("read", list(tasks), rows, [_weight(t.metadata.size_bytes) for t in tasks])
    if isinstance(source, ListFiles):
        paths, sizes = _list_files(source)
        return Units("files", paths, [None] * len(paths), [_weight(s) for s in sizes])
    bundles = list(source.output_data())
    rows = [b.num_rows() for b in bundles]
    return Units("blocks", bundles, rows, [_weight(b.size_bytes()) for b in bundles])


def _weight(size: Optional[int]) -> float:
    return float(size) if size else 1.0


def _list_files(op: Any) -> Tuple[List[str], List[Optional[int]]]:
    """Every file a file read's listing names, in a fixed order, with its size."""
    import pyarrow.fs as pafs

    fs = op.filesystem
    if fs is None:
        fs, _ = pafs.FileSystem.from_uri(op.paths[0])
    exts = tuple(f".{e.lower().lstrip('.')}" for e in (op.file_extensions or []))
    found: List[Tuple[str, Optional[int]]] = []
    for path in op.paths:
        info = fs.get_file_info(path)
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True)) if info.type == pafs.FileType.Directory \
            else [info]
        for i in infos:
            name = i.path.rsplit("/", 1)[-1]
            if i.type != pafs.FileType.File or name.startswith((".", "_")):
                continue
            if exts and not i.path.lower().endswith(exts):
                continue
            found.append((i.path, i.size))
    found.sort()
    return [p for p, _ in found], [s for _, s in found]


def deal(units: Units, order: Sequence[int], n: int, rank: int, equal: bool) -> Slices:
    """Rank ``rank``'s part of ``n``: contiguous in ``order`` (a permutation of the units).

    Sliceable units: each part gets rows ``[r*T//n, (r+1)*T//n)`` of the concatenation (parts
    differ by one row at most), or with ``equal`` ``T//n`` rows each and the last ``T % n``
    rows of the order left out. Otherwise whole units are dealt by weight (rows, else bytes),
    so parts differ by about one unit.
    """
    if units.sliceable:
        total = sum(r for r in units.rows if r is not None)
        if equal:
            each = total // n
            lo, hi = rank * each, (rank + 1) * each
        else:
            lo, hi = rank * total // n, (rank + 1) * total // n
        part: Slices = []
        at = 0
        for u in order:
            rows = units.rows[u]
            assert rows is not None
            start, end = max(lo, at), min(hi, at + rows)
            if start < end:
                whole = start == at and end == at + rows
                part.append((u, None, None) if whole else (u, start - at, end - at))
            at += rows
        return part
    weights = [units.rows[u] if units.rows[u] is not None else units.weights[u] for u in order]
    total_w = float(sum(w or 0 for w in weights)) or 1.0
    part, at_w = [], 0.0
    for u, w in zip(order, weights):
        mid = at_w + (w or 0) / 2
        if min(int(mid * n / total_w), n - 1) == rank:
            part.append((u, None, None))
        at_w += w or 0
    return part


# --- building a part's dataset --------------------------------------------------------------

def build_part(ds: Any, units: Units, part: Slices, shuffle_seed: Optional[Tuple[int, int]] = None,
               cpu_limit: Optional[float] = None) -> Any:
    """The dataset that executes only ``part`` of ``ds``: its source cut to those units (and
    rows), the maps above unchanged; order preserved, so a pass is repeatable. With
    ``shuffle_seed``, the rows of every block are permuted too (a seed per block content)."""
    from ray.data._internal.logical.interfaces import LogicalPlan
    from ray.data._internal.logical.operators.input_data_operator import InputData
    from ray.data._internal.logical.operators.read_operator import ListFiles
    from ray.data.dataset import Dataset

    source, above = _chain(ds)
    if units.kind == "read":
        part_source = _PartDatasource(source.datasource, [(units.items[u], a, b) for u, a, b in part])
        new = dataclasses.replace(source, datasource=part_source, datasource_or_legacy_reader=part_source,
                                  parallelism=max(1, len(part)), num_outputs=None, detected_parallelism=None)
    elif units.kind == "files":
        assert isinstance(source, ListFiles)
        paths = [units.items[u] for u, _, _ in part]
        new = dataclasses.replace(source, paths=paths, source_paths=paths, limit=None,
                                  file_indexer=_listing_indexer(source.file_indexer, len(paths)))
    else:
        new = InputData(input_data=[_slice_bundle(units.items[u], a, b) for u, a, b in part])
    for op in above:
        new = op._with_new_input_dependencies([new])
    context = ds.context.copy()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False  # one per worker and epoch: noise on the driver's console
    limits = context.execution_options.resource_limits
    if cpu_limit is not None and (limits.cpu is None or limits.cpu == float("inf")):
        # Every worker runs an executor that would otherwise take the whole cluster's CPUs as
        # its budget: n executors would launch n times the tasks there are CPUs for.
        context.execution_options.resource_limits = limits.copy(cpu=cpu_limit)
    out = Dataset(LogicalPlan(new, context), context, ds._in_stats)
    if shuffle_seed is not None:
        out = out.map_batches(_ShuffleRows(shuffle_seed), batch_format="pyarrow", batch_size=None,
                              zero_copy_batch=True)
    return out


@functools.cache
def _http_filesystem_missing() -> bool:
    """Whether fsspec's HTTP filesystem cannot be imported (``aiohttp`` not installed)."""
    try:
        import fsspec.implementations.http  # noqa: F401
    except ImportError:
        return True
    return False


def _listing_indexer(indexer: Any, files: int) -> Any:
    """The file indexer that lists a part of ``files`` files: ``indexer``, sized for a part.

    - **Footer actors.** Ray Data's Parquet indexer (``FooterFileIndexer``) starts a pool
      of footer-reading actors for every listing, 32 by default, each a new worker process,
      and sends them the files in batches of 10 (``_footer_batch_size``). A part that
      lists 16 files would start 32 processes to keep 2 busy, and every worker does so
      every epoch. The pool is cut to the batches there are.
    - **Sequential listing without aiohttp.** A part names its files one by one. Ray Data
      resolves a list of paths in a thread pool, and each thread imports
      ``fsspec.implementations.http``; without ``aiohttp`` one of those imports sees the
      module another thread is failing to import and raises ``ImportError: cannot import
      name 'HTTPFileSystem'`` (Ray 2.60: every ``read_parquet([file, ...])`` fails so, while
      a directory lists in one thread). Then the listing is made sequential: the files are
      already known, it only stats them.

    Attributes another Ray version lacks are left alone.
    """
    out = copy.copy(indexer)
    actors, batch = getattr(out, "_num_actors", None), getattr(out, "_footer_batch_size", None)
    if isinstance(actors, int) and isinstance(batch, int) and batch > 0:
        out._num_actors = max(1, min(actors, -(-files // batch)))
        window = getattr(out, "_max_inflight_batches", None)
        if isinstance(window, int):
            out._max_inflight_batches = max(1, min(window, 2 * out._num_actors))
    if getattr(out, "_num_workers", 1) > 1 and _http_filesystem_missing():
        out._num_workers = 1
    return out


def _slice_bundle(bundle: Any, start: Optional[int], end: Optional[int]) -> Any:
    """Rows ``[start, end)`` of an in-memory bundle (all when ``None``), as a bundle of blocks
    that hold just those rows. Ray's own ``RefBundle.slice`` only marks a slice, which reading a
    dataset from such bundles ignores (every worker read every row of a one-block
    ``from_pandas``): the blocks at the edges are cut and stored anew instead."""
    if start is None or end is None:
        return bundle
    if start > 0:
        bundle = bundle.slice(start)[1]
        end -= start
    if end < bundle.num_rows():
        bundle = bundle.slice(end)[0]
    return _cut_slices(bundle)


def _cut_slices(bundle: Any) -> Any:
    """``bundle`` with each sliced block replaced by a block of just the slice's rows."""
    import ray
    from ray.data._internal.execution.interfaces import ref_bundle as rb
    from ray.data.block import BlockAccessor

    slices = getattr(bundle, "slices", None)
    if not slices or all(s is None for s in slices):
        return bundle
    entries: List[Any] = []
    for entry, cut in zip(bundle.blocks, slices):
        ref, meta = (entry.ref, entry.metadata) if hasattr(entry, "ref") else entry
        if cut is not None and (cut.start_offset, cut.end_offset) != (0, meta.num_rows):
            block = BlockAccessor.for_block(ray.get(ref)).slice(cut.start_offset, cut.end_offset, copy=True)
            ref, meta = ray.put(block), BlockAccessor.for_block(block).get_metadata()
        entries.append(rb.BlockEntry(ref, meta) if hasattr(rb, "BlockEntry") else (ref, meta))
    return rb.RefBundle(tuple(entries), owns_blocks=False, schema=bundle.schema)


class _ShuffleRows:
    """Permutes a block's rows; the permutation depends on the epoch's seed and the block's
    size and first row, so a pass over the same part is repeatable (a resumed epoch)."""

    def __init__(self, seed: Tuple[int, int]):
        self.seed = seed

    def __call__(self, table: Any) -> Any:
        import numpy as np

        n = table.num_rows
        if n < 2:
            return table
        first = zlib.crc32(repr(table.slice(0, 1).to_pylist()).encode())
        rng = np.random.default_rng([self.seed[0] & 0xFFFFFFFF, self.seed[1], n, first])
        return table.take(rng.permutation(n))


def _read_slice(task: Any, start: Optional[int], end: Optional[int]) -> Iterator[Any]:
    """Run one read task, keeping rows ``[start, end)`` of what it yields (all when ``None``)."""
    if start is None or end is None:
        yield from task()
        return
    from ray.data.block import BlockAccessor

    at = 0
    for block in task():
        acc = BlockAccessor.for_block(block)
        rows = acc.num_rows()
        lo, hi = max(start, at), min(end, at + rows)
        if lo < hi:
            yield block if (lo == at and hi == at + rows) else acc.slice(lo - at, hi - at, copy=False)
        at += rows
        if at >= end:
            return  # the rest of the unit belongs to another part: stop reading


def _part_read_tasks(pieces: List[Tuple[Any, Optional[int], Optional[int]]]) -> List[Any]:
    import functools

    from ray.data.block import BlockMetadata
    from ray.data.datasource import ReadTask

    out = []
    for task, start, end in pieces:
        meta = task.metadata
        if start is not None and end is not None:
            rows = meta.num_rows or 0
            size = int(meta.size_bytes * (end - start) / rows) if meta.size_bytes and rows else meta.size_bytes
            meta = BlockMetadata(num_rows=end - start, size_bytes=size, input_files=meta.input_files,
                                 exec_stats=None)
        out.append(ReadTask(functools.partial(_read_slice, task, start, end), meta, schema=task.schema))
    return out


def _datasource_base() -> type:
    from ray.data.datasource import Datasource

    return Datasource


class _PartDatasource(_datasource_base()):  # type: ignore[misc]
    """A datasource that returns a fixed list of (sliced) read tasks of another one."""

    def __init__(self, original: Any, pieces: List[Tuple[Any, Optional[int], Optional[int]]]):
        self._original_name = original.get_name()
        self._pieces = pieces

    def get_name(self) -> str:
        return f"{self._original_name}Part"

    def estimate_inmemory_data_size(self) -> Optional[int]:
        sizes = [t.metadata.size_bytes for t, _, _ in self._pieces]
        return sum(sizes) if all(s is not None for s in sizes) else None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                       data_context: Any = None) -> List[Any]:
        return _part_read_tasks(self._pieces)


