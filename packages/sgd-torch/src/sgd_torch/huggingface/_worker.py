"""What both Hugging Face trainers do on a worker before the user's code runs.

``accelerate.PartialState`` (which ``transformers.TrainingArguments`` and
``accelerate.Accelerator`` both build) finds sgd's process group by itself: it reads
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (set by the torch backend) and skips
``init_process_group`` when a group exists. Two things it cannot know:

- a CPU worker must say so (``ACCELERATE_USE_CPU``): otherwise, with no GPU visible,
  accelerate falls back to a single process and ignores the group;
- a GPU worker's device: sgd lets the workers of a node see all the node's GPUs, so
  ``cuda:<LOCAL_RANK>`` may be another worker's GPU; ``ACCELERATE_TORCH_DEVICE`` names
  the one Ray gave this worker (:func:`sgd_torch.get_device`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Dict, Iterator, Mapping, Optional


def _reset_accelerate_state() -> None:
    """Forget accelerate's process-wide singletons (a previous run's device, precision...)."""
    import sys

    if "accelerate" not in sys.modules:
        return
    from accelerate.state import AcceleratorState, GradientState

    # accelerate keeps these as class-level dicts; the same calls TrainingArguments makes.
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@contextlib.contextmanager
def worker_environment(extra_env: Optional[Mapping[str, str]] = None,
                       num_threads: Optional[int] = None) -> Iterator[Dict[str, str]]:
    """Set the environment accelerate reads for this worker, for the ``with`` block.

    :param extra_env: more variables (the ``accelerate launch`` ones of an accelerate config).
    :param num_threads: ``torch.set_num_threads`` for the block (``num_cpu_threads_per_process``).
    :returns: (as the ``with`` target) the variables that were set.
    """
    import torch

    from sgd_torch.train_loop_utils import get_device

    device = get_device()
    env: Dict[str, str] = {}
    if device.type == "cuda":
        env["ACCELERATE_TORCH_DEVICE"] = str(device)
        torch.cuda.set_device(device)
    else:
        env["ACCELERATE_USE_CPU"] = "true"
    env.update(extra_env or {})
    saved = {name: os.environ.get(name) for name in env}
    saved_threads = torch.get_num_threads()
    os.environ.update(env)
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    _reset_accelerate_state()
    try:
        yield env
    finally:
        # The worker process may run another run next (several runs of one sgd.Trainer).
        _reset_accelerate_state()
        if num_threads is not None:
            torch.set_num_threads(saved_threads)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
