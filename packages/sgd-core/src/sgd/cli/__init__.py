"""The ``sgd`` command (also ``python -m sgd``): ``sgd plugins``, ``sgd run``, ``sgd runs``, ``sgd stacks``.

Heavy modules (Ray, the launcher) are imported inside the commands that need them.

Re-exports only; the code is in the submodules: ``main`` (the parser, :func:`main`), one module
per command (``cmd_plugins``, ``cmd_run``, ``cmd_runs``, ``cmd_stacks``), and ``text`` (how
they print values and tables).
"""

from sgd.cli.cmd_plugins import TABLE_WIDTH, format_plugin_table, plugin_table
from sgd.cli.cmd_run import split_run_argv
from sgd.cli.main import build_parser, main

__all__ = ["main", "build_parser", "split_run_argv", "plugin_table", "format_plugin_table", "TABLE_WIDTH"]
