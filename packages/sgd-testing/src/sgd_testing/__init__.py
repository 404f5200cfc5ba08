"""Test-only helpers shared by sgd packages. The pytest fixtures are opt-in:
``pytest_plugins = ["sgd_testing.fixtures"]`` in a suite's top-level conftest.py."""

from sgd_testing.contract import BackendContractTests
from sgd_testing.fake_group import FakeGroup, fake_trainer_run, rounds_of
from sgd_testing.faults import KillWorker, RoomFreedAt, grow_during_run, sigkill_when
from sgd_testing.fixtures import wait_for

__all__ = ["BackendContractTests", "FakeGroup", "KillWorker", "RoomFreedAt", "fake_trainer_run", "grow_during_run",
           "rounds_of", "sigkill_when", "wait_for"]
