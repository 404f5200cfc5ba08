"""The repository's top-level conftest: every test suite here uses sgd-testing's fixtures.

sgd-testing's pytest plugin is opt-in (installing the package adds nothing to a suite); this
line opts in for all of ``packages/*/tests`` and ``tests/``. pytest reads ``pytest_plugins``
only in the top-level conftest.py, which is why it is here and not in each tests folder.
"""

pytest_plugins = ["sgd_testing.fixtures"]
