"""``Trainer``: run a training function on N Ray workers with a backend set up.

Re-exports only; the code is in the submodules, one concept each:

- ``trainer``: :class:`Trainer`, the façade;
- ``iterator``: :class:`TrainingIterator`, the report rounds of one run;
- ``arguments``: the trainer's and ``run``'s arguments, checked and resolved;
- ``settings``: ``trainer.json``'s settings, a restored trainer's arguments, ``str(trainer)``'s table;
- ``run_dirs``: the next ``run_NNN``, the checkpoint mirror, a run opened with its checkpoint manager;
- ``controller``: the run controller (and worker group) a trainer's settings make.

The public classes keep ``sgd.trainer`` as their ``__module__``.
"""

from sgd.trainer.iterator import TrainingIterator
from sgd.trainer.trainer import Trainer

__all__ = ["Trainer", "TrainingIterator"]
