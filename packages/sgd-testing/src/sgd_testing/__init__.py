"""Test-only helpers shared by sgd packages (fixtures load through the ``pytest11`` entry point)."""

from sgd_testing.contract import BackendContractTests
from sgd_testing.faults import KillWorker, sigkill_when
from sgd_testing.fixtures import wait_for

__all__ = ["BackendContractTests", "KillWorker", "sigkill_when", "wait_for"]
