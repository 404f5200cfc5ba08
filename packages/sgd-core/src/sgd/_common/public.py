"""The public home of a class defined in a submodule of a split module.

``sgd.air``, ``sgd.plugins``, ``sgd.trainer``, ``sgd.data``, ``sgd.cli`` and ``sgd.worker_group``
were single modules; each is now a package whose submodules hold one concept apiece and whose
``__init__`` re-exports the public names. A public class keeps the module users import it from as its ``__module__``, so
that nothing that records a class by its dotted name changes: pickles sent between processes
(configs, results, exceptions, dataset shards), ``air_trainer.json`` in a run directory (which
names config classes and the trainer class), and the reprs and messages that print it.
"""

from __future__ import annotations

from typing import Callable, TypeVar

C = TypeVar("C", bound=type)


def public_module(name: str) -> Callable[[C], C]:
    """Class decorator: ``cls.__module__ = name`` (a module that re-exports ``cls``).

    Put it above ``@dataclass``, so that the dataclass machinery still reads the defining
    module's namespace.
    """

    def mark(cls: C) -> C:
        cls.__module__ = name
        return cls

    return mark
