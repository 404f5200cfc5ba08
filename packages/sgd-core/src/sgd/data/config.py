"""``DatasetConfig``: how one dataset reaches the workers (divided, split by Ray Data, or whole;
shuffled each epoch; Ray AIR's fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

from sgd._common.public import public_module

_SPLITS = (True, False, "parts", "coordinated")


@public_module("sgd.data")
@dataclass(frozen=True)
class DatasetConfig:
    """How one dataset reaches the workers.

    :param split: ``True`` (the default): each worker gets its own part, **divided** when the
        dataset's plan allows it (a source followed by maps), else through Ray Data's
        ``streaming_split`` (a warning says why). ``"parts"``: divided, or ``ValueError`` when
        the plan cannot be. ``"coordinated"``: always ``streaming_split`` (one coordinator
        actor hands the blocks out; all workers iterate together; it can balance any plan).
        ``False``: the whole dataset to every worker (a validation set each worker
        evaluates in full).
    :param shuffle: a new order every epoch. Divided: the source's units (read tasks, files,
        blocks) are dealt to the workers in a new random order each epoch and the rows of
        every block are permuted (a shuffle at the granularity of the units, no pass over
        the data). Coordinated (and ``split=False``): a full ``random_shuffle`` re-executed
        per epoch. ``streaming=False``: shuffled once globally, then within each shard
        every epoch.
    :param seed: with ``shuffle``, the seed. Divided: epoch ``e``'s order is drawn from
        ``(seed, e)``, so a run is repeatable and epochs still differ. Coordinated: every
        epoch has the same order (Ray Data's ``random_shuffle(seed=)``).
    :param streaming: ``True`` (the default) reads the dataset again every epoch, holding
        nothing in memory beyond Ray Data's window. ``False`` materialises it once (Ray's
        object store, spilling to disk) and splits its blocks.
    :param equal: every worker gets the same number of rows, and up to ``num_workers - 1``
        rows (the last ones of the epoch's order) are left out of each epoch. The default,
        ``False``, leaves no row out: parts differ by at most one row where the source's
        row counts are known (read tasks and in-memory blocks are cut at a row), by about
        one unit (a file) where they are not. Divided, ``equal`` counts the rows the
        source yields: a ``filter`` or a ``map_batches`` that changes the row count makes
        the parts differ again; ``split="coordinated"`` equalises what comes out instead.

    Ray AIR's ``DatasetConfig`` fields (``from ray.air.config import DatasetConfig`` code runs
    with ``from sgd import DatasetConfig``); every field left ``None`` takes the trainer's
    default for that dataset, as AIR merged a user's config into the trainer's:

    :param fit: the AIR trainer's ``preprocessor`` is fitted on this dataset (default: only
        on ``"train"``; at most one dataset may say ``True``).
    :param transform: the preprocessor transforms this dataset (default ``True``).
    :param required: ``fit()`` fails with ``ValueError`` when this dataset is not passed.
    :param global_shuffle: AIR's name of ``shuffle``.
    :param randomize_block_order: ``True`` is ``shuffle`` (sgd's shuffle deals the source's
        blocks in a new order every epoch); ``False`` or ``None``: no change.
    :param max_object_store_memory_fraction: ``-1`` materialises the dataset once
        (``streaming=False``), AIR's bulk ingest; any other value streams.
    :param per_epoch_preprocessor: a fitted or stateless preprocessor applied to this dataset's
        rows every epoch (lazily, so random transforms differ per epoch).

    ``split`` left ``None`` is ``True`` in ``Trainer.run``. AIR trainers split every dataset (Ray
    Train 2.60, :class:`sgd.DataConfig`); given a dict of ``DatasetConfig`` they keep Ray AIR's
    rule: ``"train"`` split, every other dataset whole to every worker unless its config says so.
    """

    split: Union[bool, str, None] = None
    shuffle: bool = False
    seed: Optional[int] = None
    streaming: bool = True
    equal: bool = False
    fit: Optional[bool] = None
    required: Optional[bool] = None
    transform: Optional[bool] = None
    global_shuffle: Optional[bool] = None
    randomize_block_order: Optional[bool] = None
    max_object_store_memory_fraction: Optional[float] = None
    per_epoch_preprocessor: Any = None

    def resolved(self, split: Union[bool, str] = True) -> DatasetConfig:
        """This config with AIR's fields turned into sgd's and ``split=None`` set to ``split``."""
        import dataclasses

        shuffle = self.shuffle or bool(self.global_shuffle) or bool(self.randomize_block_order)
        fraction = self.max_object_store_memory_fraction
        streaming = self.streaming and not (fraction is not None and fraction < 0)
        return dataclasses.replace(self, split=split if self.split is None else self.split, shuffle=shuffle,
                                   streaming=streaming)

    def merged(self, base: DatasetConfig) -> DatasetConfig:
        """``base`` with the fields this config sets (AIR's ``DatasetConfig.merge``): a field
        left at its default (``None``, or sgd's defaults) keeps ``base``'s."""
        import dataclasses

        defaults = DatasetConfig()
        changes = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                   if getattr(self, f.name) is not getattr(defaults, f.name)
                   and getattr(self, f.name) != getattr(defaults, f.name)}
        return dataclasses.replace(base, **changes)

    def __post_init__(self) -> None:
        if self.split is not None and not any(
                self.split is s or (isinstance(s, str) and self.split == s) for s in _SPLITS):
            raise ValueError(
                f"DatasetConfig(split={self.split!r}) is not one of True (divide the dataset, or "
                "coordinate when it cannot be divided), 'parts', 'coordinated' or False (the whole "
                "dataset to every worker)"
            )
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"DatasetConfig(seed={self.seed!r}) must be an int or None")
