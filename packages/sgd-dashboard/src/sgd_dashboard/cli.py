"""``sgd dashboard [RESULTS_DIR_OR_RUN] [--host H] [--port P] [--token T] [--allow-stacks]``: serve
the dashboard of the runs in a folder (default: sgd's results root) and print its URL; until Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any, Optional

#: ``sgd dashboard``'s default port: TensorBoard's 6006 + 1 (Ray's dashboard has 8265).
DEFAULT_PORT = 6007


def add_dashboard_command(subparsers: Any) -> None:
    """Add ``sgd dashboard`` to ``sgd``'s sub-parsers."""
    p = subparsers.add_parser(
        "dashboard", help="serve a web dashboard of the runs in a folder (live charts, workers, events, logs)",
        description="Serve a web dashboard of the runs at or below RESULTS_DIR_OR_RUN: live metric charts, "
                    "workers, restarts and lost hosts, checkpoints and per-rank logs, read from the run folders "
                    "alone (no Ray needed). It binds 127.0.0.1 unless --host says otherwise; another address "
                    "needs a token.")
    p.add_argument("path", nargs="?", default=None, metavar="RESULTS_DIR_OR_RUN",
                   help="a results folder, an experiment's folder or one run's folder "
                        "(default: $SGD_RESULTS_DIR or ~/sgd_results)")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to bind (default 127.0.0.1; another one needs --token)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"the port (default {DEFAULT_PORT}; 0 picks a free one and prints it)")
    p.add_argument("--token", default=None,
                   help="a token every request must bring (or set SGD_DASHBOARD_TOKEN); required off loopback")
    p.add_argument("--allow-stacks", action="store_true",
                   help="let the page ask a running job for its workers' Python stacks (as `sgd stacks`)")
    p.set_defaults(func=cmd_dashboard)


def _fail(message: str, code: int = 2) -> int:
    print(f"sgd dashboard: error: {message}", file=sys.stderr)
    return code


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(host: str, port: int, token: Optional[str]) -> str:
    """The URL to open for a server bound to ``host``:``port``."""
    shown = host.strip("[]")
    if shown in ("0.0.0.0", "::", ""):
        shown = socket.gethostname()
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Run the dashboard's server until Ctrl-C."""
    from sgd.utils import results_root
    from sgd_dashboard.app import create_app
    from sgd_dashboard.security import TOKEN_ENV

    token = args.token or os.environ.get(TOKEN_ENV) or None
    folder = args.path if args.path is not None else str(results_root())
    if not 0 <= args.port <= 65535:
        return _fail(f"--port {args.port}: a port is a number from 0 to 65535 (0: any free one)")
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        hint = " (another program has it: pass --port 0 for a free one)" if args.port else ""
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}{hint}", 1)
    port = sock.getsockname()[1]
    try:
        app = create_app(folder, token=token, allow_stacks=args.allow_stacks, host=args.host, port=port)
    except (ValueError, FileNotFoundError) as exc:
        sock.close()
        return _fail(str(exc))
    import uvicorn

    app.state.dashboard.warm_up()

    print(f"sgd dashboard: the runs in {os.path.abspath(os.path.expanduser(folder))} at "
          f"{url_of(args.host, port, token)} (Ctrl-C to stop)", flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0
