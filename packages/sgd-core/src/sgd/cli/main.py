"""The ``sgd`` command's parser (every subcommand, and those plugins add through
``sgd_cli_commands``) and :func:`main`, the console script's entry point."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from sgd import plugins
from sgd.cli.cmd_plugins import cmd_plugins
from sgd.cli.cmd_run import add_run_parser, split_run_argv
from sgd.cli.cmd_runs import add_runs_parser
from sgd.cli.cmd_stacks import cmd_stacks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgd", description="sgd: distributed training on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugins and what they provide")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_plugins)
    add_run_parser(sub)
    add_runs_parser(sub)
    st = sub.add_parser("stacks", help="every worker's Python stacks of a running job (from another terminal)")
    st.add_argument("run_dir", help="the job's run directory (logdir/run_NNN), or its logdir for the latest run")
    st.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the driver (default 30)")
    st.set_defaults(func=cmd_stacks)
    plugins.get_plugin_manager().hook.sgd_cli_commands(subparsers=sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: Optional[List[str]] = None
    if argv and argv[0] == "run":
        head, script_args = split_run_argv(argv[1:])
        argv = ["run", *head]
    args = build_parser().parse_args(argv)
    if script_args is not None:
        args.script_args = script_args
    return int(args.func(args))
