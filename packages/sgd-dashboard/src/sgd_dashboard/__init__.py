"""sgd-dashboard: watch and understand sgd runs in a browser, from their run folders alone.

``sgd dashboard [RESULTS_DIR_OR_RUN]`` serves it (:mod:`sgd_dashboard.cli`);
:func:`create_app` makes the ASGI application for a server of one's own.
"""

from sgd_dashboard.app import DEFAULT_PORT, create_app

__version__ = "0.1.0"

__all__ = ["DEFAULT_PORT", "create_app"]
