"""Ray Train's shipped examples, run on sgd with their imports renamed (issue 53).

Ray's wheel ships its Train examples (``ray/train/examples/...``). :func:`load` reads one from the
installed Ray, renames its imports with :data:`IMPORT_MAP` (issue 53's map, one sgd module per Ray
module), applies the example's listed :class:`Edit` s (each with its reason: what a ``# sgd:``
comment says in a ported test) and runs the result as a module. Nothing of Ray's is copied into
this repository, and a Ray release whose example no longer holds an edit's text fails loudly
(:class:`EditNotFound`), so an edit never goes stale unnoticed.

Used by the ported Ray 2.60 tests (``packages/*/tests/test_ray260_*.py``, which import Ray's
example functions as Ray's own tests do), ``tests/test_ray260_examples.py`` and
``examples/ray260/run_ray_example.py``.
"""

from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from sgd.errors import PicklableError

#: Ray module → sgd module, longest first (issue 53's map).
IMPORT_MAP: Tuple[Tuple[str, str], ...] = (
    ("ray.train.huggingface.transformers", "sgd_torch.huggingface.transformers"),
    ("ray.train.tensorflow.keras", "sgd_tensorflow.keras"),
    ("ray.train.collective", "sgd.collective"),
    ("ray.train.lightning", "sgd_torch.lightning"),
    ("ray.train.tensorflow", "sgd_tensorflow"),
    ("ray.train.xgboost", "sgd_xgboost.xgboost"),
    ("ray.train.lightgbm", "sgd_xgboost.lightgbm"),
    ("ray.train.torch", "sgd_torch"),
    ("ray.train", "sgd"),
)

_DOTTED = re.compile(r"(?<![\w.])ray\.train(?:\.\w+)*")
_IMPORT_SUBMODULE = re.compile(r"^(\s*)import (sgd_\w+(?:\.\w+)*|sgd\.\w+(?:\.\w+)*)\s*$", re.MULTILINE)
_FROM_RAY_IMPORT_TRAIN = re.compile(r"^(\s*)from ray import train\s*$", re.MULTILINE)


class EditNotFound(PicklableError, LookupError):
    """An :class:`Edit`'s text is not in the example: the installed Ray's example changed."""


@dataclass(frozen=True)
class Edit:
    """One change to an example beyond the renamed imports.

    :param old: text of Ray's example (every occurrence is replaced; at least one must be there).
    :param new: what replaces it.
    :param why: the reason, as a ported test's ``# sgd:`` comment gives it.
    """

    old: str
    new: str
    why: str


def _rename_dotted(match: re.Match[str]) -> str:
    name = match.group(0)
    for ray_name, sgd_name in IMPORT_MAP:
        if name == ray_name or name.startswith(ray_name + "."):
            return sgd_name + name[len(ray_name):]
    return name  # pragma: no cover - "ray.train" always matches


def rename_imports(source: str) -> str:
    """Rename every ``ray.train...`` module in ``source`` with :data:`IMPORT_MAP`.

    ``from ray import train`` becomes ``import sgd as train``; ``import ray.train.torch`` (which in
    Ray also binds ``ray.train``) becomes ``import sgd, sgd_torch`` so that the code's
    ``sgd.get_context()`` (Ray's ``ray.train.get_context()``) still finds ``sgd``.

    :param source: a Python module's text.
    :returns: the text with the modules renamed.
    """
    source = _FROM_RAY_IMPORT_TRAIN.sub(r"\1import sgd as train", source)
    source = _DOTTED.sub(_rename_dotted, source)

    def bind_sgd(match: re.Match[str]) -> str:
        indent, module = match.group(1), match.group(2)
        return f"{indent}import sgd, {module}" if module != "sgd" else match.group(0)

    return _IMPORT_SUBMODULE.sub(bind_sgd, source)


def apply_edits(source: str, edits: Iterable[Edit], name: str = "example") -> str:
    """Apply ``edits`` to ``source`` in order.

    :raises EditNotFound: an edit's ``old`` text is not in ``source`` (naming the example and the edit).
    """
    for edit in edits:
        if edit.old not in source:
            raise EditNotFound(f"{name}: the text {edit.old!r} of the edit ({edit.why}) is not in the installed "
                               f"Ray's example; update sgd_testing.ray_examples.EDITS for this Ray release")
        source = source.replace(edit.old, edit.new)
    return source


def ray_examples_dir() -> Path:
    """The installed Ray's ``ray/train/examples`` folder."""
    import ray.train

    return Path(ray.train.__file__).parent / "examples"


def renamed_source(example: str, extra: Sequence[Edit] = ()) -> str:
    """The text of Ray's ``example`` (a path under ``ray/train/examples``, e.g.
    ``"pytorch/torch_linear_example.py"``) with its imports renamed, then :data:`EDITS` for it and
    ``extra`` applied."""
    path = ray_examples_dir() / example
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the installed Ray ships no example {example!r}; "
                                f"known ones: {', '.join(sorted(EDITS))}")
    source = rename_imports(path.read_text())
    return apply_edits(source, [*EDITS.get(example, ()), *extra], name=example)


def load(example: str, extra: Sequence[Edit] = (), run_main: bool = False,
         argv: Optional[List[str]] = None) -> types.ModuleType:
    """Run Ray's ``example`` with its imports renamed and return it as a module.

    The module is registered in ``sys.modules`` (as ``ray260_<stem>``) and pickled by value, so its
    functions reach Ray's workers (which cannot import it).

    :param example: a path under ``ray/train/examples``, e.g. ``"pytorch/torch_linear_example.py"``.
    :param extra: edits applied after the example's own (:data:`EDITS`).
    :param run_main: run the example's ``if __name__ == "__main__":`` block too.
    :param argv: ``sys.argv[1:]`` while the example runs (its argparse reads it).
    """
    import ray.cloudpickle

    source = renamed_source(example, extra)
    name = "ray260_" + Path(example).stem
    module = types.ModuleType(name)
    module.__file__ = str(ray_examples_dir() / example)
    module.__dict__["_sgd_synthetic"] = sys.modules[__name__]  # the synthetic data the edits use
    sys.modules[name] = module
    ray.cloudpickle.register_pickle_by_value(module)
    code = compile(source, module.__file__, "exec")
    saved_argv = sys.argv
    sys.argv = [module.__file__, *(argv or [])]
    try:
        if run_main:
            # Functions defined under "__main__" are pickled by value too (cloudpickle's rule).
            module.__dict__["__name__"] = "__main__"
        exec(code, module.__dict__)
    finally:
        sys.argv = saved_argv
        module.__dict__["__name__"] = name
    return module


_SUITE_CLUSTER = "the suite's (or caller's) Ray cluster is already running: start one only if none is"
_NESTED_MODULE = ("`train.torch.X` reaches ray.train.torch as an attribute of ray.train; sgd's torch module is "
                  "the separate package sgd_torch (issue 53's map), which the example imports")

#: The edits each example needs beyond its renamed imports (the ``# sgd:`` lines of a port).
EDITS: Dict[str, Tuple[Edit, ...]] = {
    "pytorch/torch_linear_example.py": (
        Edit("import sgd as train\n", "import sgd as train\nimport sgd_torch\n", _NESTED_MODULE),
        Edit("train.torch.", "sgd_torch.", _NESTED_MODULE),
        Edit("ray.init(num_cpus=3)", "ray.is_initialized() or ray.init(num_cpus=3)", _SUITE_CLUSTER),
    ),
    "pytorch/torch_regression_example.py": (
        Edit("import sgd as train\n", "import sgd as train\nimport sgd_torch\n", _NESTED_MODULE),
        Edit("train.torch.", "sgd_torch.", _NESTED_MODULE),
        Edit('dataset = ray.data.read_csv("s3://anonymous@air-example-data/regression.csv")',
             "dataset = ray.data.from_pandas(_sgd_synthetic.regression_frame())",
             "the suite downloads nothing: a synthetic frame with the columns of Ray's regression.csv "
             "(x000..x099, y)"),
        Edit("ray.init(num_cpus=4)", "ray.is_initialized() or ray.init(num_cpus=4)", _SUITE_CLUSTER),
    ),
    "tf/tensorflow_regression_example.py": (
        Edit('dataset = ray.data.read_csv("s3://anonymous@air-example-data/regression.csv")',
             "dataset = ray.data.from_pandas(_sgd_synthetic.regression_frame())",
             "the suite downloads nothing: a synthetic frame with the columns of Ray's regression.csv "
             "(x000..x099, y)"),
        Edit("ray.init(num_cpus=4, num_gpus=num_gpus)",
             "ray.is_initialized() or ray.init(num_cpus=4, num_gpus=num_gpus)", _SUITE_CLUSTER),
    ),
    "pytorch/torch_quick_start.py": (
        Edit("from torchvision import datasets\nfrom torchvision.transforms import ToTensor\n", "",
             "torchvision is not a dependency of the suite"),
        Edit('    return datasets.FashionMNIST(\n        root="/tmp/data",\n        train=True,\n'
             '        download=True,\n        transform=ToTensor(),\n    )',
             "    return _sgd_synthetic.fashion_mnist_like()",
             "the suite downloads nothing: 256 random 28x28 images in FashionMNIST's 10 classes"),
        Edit("num_epochs = 3", "num_epochs = 1", "one epoch keeps the suite short"),
        Edit("ScalingConfig(num_workers=4, use_gpu=use_gpu)", "ScalingConfig(num_workers=2, use_gpu=use_gpu)",
             "2 workers: the suite's cluster has 4 CPUs shared with others"),
    ),
    "tf/tensorflow_quick_start.py": (
        Edit("(x_train, y_train), _ = tf.keras.datasets.mnist.load_data()",
             "(x_train, y_train) = _sgd_synthetic.mnist_like()",
             "the suite downloads nothing: 256 random 28x28 uint8 images in MNIST's 10 classes"),
        Edit(".shuffle(60000)", ".shuffle(256)", "the synthetic set has 256 images"),
        Edit("epochs=3, steps_per_epoch=70", "epochs=1, steps_per_epoch=2", "a few steps keep the suite short"),
        Edit("ScalingConfig(num_workers=4, use_gpu=use_gpu)", "ScalingConfig(num_workers=2, use_gpu=use_gpu)",
             "2 workers: the suite's cluster has 4 CPUs shared with others"),
        Edit("    trainer.fit()\n    # __tf_trainer_end__", "    results = trainer.fit()\n    # __tf_trainer_end__",
             "keep the result for the caller to check (torch_quick_start.py keeps it as `results`)"),
    ),
}


def regression_frame(rows: int = 200, seed: int = 0):
    """A pandas frame shaped as Ray's ``regression.csv``: 100 features ``x000``..``x099`` and ``y``,
    a noisy linear function of them."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 100)).astype("float64")
    y = x @ rng.normal(size=100) / 10 + rng.normal(scale=0.01, size=rows)
    frame = pd.DataFrame(x, columns=[f"x{i:03d}" for i in range(100)])
    frame["y"] = y
    return frame


def fashion_mnist_like(size: int = 256, seed: int = 0):
    """A torch dataset of ``size`` random 1x28x28 float images and labels in 0..9 (the items of
    torchvision's FashionMNIST with ``ToTensor()``)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(size, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (size,), generator=generator)
    return torch.utils.data.TensorDataset(images, labels)


def mnist_like(size: int = 256, seed: int = 0):
    """``(x, y)``: ``size`` random 28x28 uint8 images and int labels in 0..9 (the training half of
    ``tf.keras.datasets.mnist.load_data()``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(size, 28, 28), dtype=np.uint8), rng.integers(0, 10, size=size, dtype=np.uint8)
