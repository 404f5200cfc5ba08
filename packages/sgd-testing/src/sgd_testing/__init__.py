"""Test-only helpers shared by sgd packages (fixtures load through the ``pytest11`` entry point)."""

from sgd_testing.contract import BackendContractTests
from sgd_testing.faults import KillWorker
from sgd_testing.fixtures import wait_for

__all__ = ["BackendContractTests", "KillWorker", "wait_for"]
