"""Cross-validation: a Ray Dataset split into ``k`` (train, validation) pairs."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from sgd.data.split import is_ray_dataset


def cross_validation_folds(dataset: Any, k: int, *, shuffle: bool = True, seed: Optional[int] = 0) -> List[
        Tuple[Any, Any]]:
    """Split a Ray Dataset into ``k`` folds: ``[(train, validation), ...]``, one pair per fold.

    Each validation set is one fold; its training set is the union of the other ``k - 1``.
    Folds differ by at most one row, and every row is in exactly one validation set (the
    dataset is materialised once, shuffled first with ``shuffle``). Pass each pair to a run,
    for example ``trainer.run(train_func, dataset={"train": train, "val": val},
    dataset_config={"val": sgd.DatasetConfig(split=False)})``.

    :raises ValueError: ``k < 2``, or more folds than rows.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise ValueError(f"k must be an int >= 2, got {k!r}")
    if not is_ray_dataset(dataset):
        raise TypeError(f"cross_validation_folds takes a Ray Dataset, got {type(dataset).__name__}")
    if shuffle:
        dataset = dataset.random_shuffle(seed=seed)
    dataset = dataset.materialize()
    total = dataset.count()
    if total < k:
        raise ValueError(f"cross_validation_folds: {k} folds need at least {k} rows; the dataset has {total}")
    folds = dataset.split_at_indices([i * total // k for i in range(1, k)])
    pairs = []
    for i, val in enumerate(folds):
        others = [f for j, f in enumerate(folds) if j != i]
        train = others[0].union(*others[1:]) if len(others) > 1 else others[0]
        pairs.append((train, val))
    return pairs
