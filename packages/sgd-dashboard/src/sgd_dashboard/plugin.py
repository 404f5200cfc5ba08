"""Entry point of sgd-dashboard: adds ``sgd dashboard`` to the ``sgd`` command line.

Glue only: nothing of the server (starlette, uvicorn, numpy) is imported until the command runs.
"""

import sgd


@sgd.hookimpl
def sgd_cli_commands(subparsers):
    """Add ``sgd dashboard``."""
    from sgd_dashboard.cli import add_dashboard_command

    add_dashboard_command(subparsers)
