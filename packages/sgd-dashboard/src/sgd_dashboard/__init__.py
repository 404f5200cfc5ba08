"""sgd-dashboard: watch and understand sgd runs in a browser, from their run folders alone.

``sgd dashboard [RESULTS_DIR_OR_RUN]`` serves it (:mod:`sgd_dashboard.cli`);
:func:`create_app` makes the ASGI application for a server of one's own. ``create_app`` is
imported on first use: the ``sgd`` command line loads this package's plugin on every call, and
it should not pay for starlette and numpy there.
"""

from typing import Any

from sgd_dashboard.cli import DEFAULT_PORT

__version__ = "0.1.0"

__all__ = ["DEFAULT_PORT", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from sgd_dashboard.app import create_app

        return create_app
    raise AttributeError(f"module 'sgd_dashboard' has no attribute {name!r}")
