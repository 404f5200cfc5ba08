"""Shared by this package's tests."""

import pytest

from sgd_horovod import horovod_available


@pytest.fixture
def requires_horovod():
    """Skip the test, saying how to install Horovod, when Horovod is not importable.

    Use it as ``pytestmark = pytest.mark.usefixtures("requires_horovod")``.
    """
    if not horovod_available():
        pytest.skip(
            "Horovod is not installed; build and install it with "
            "`python scripts/build_horovod.py --install -c constraints.txt` (docs/horovod.md)"
        )
