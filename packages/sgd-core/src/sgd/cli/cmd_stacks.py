"""``sgd stacks``: every worker's Python stacks of a running job, asked of its driver through
the run directory (from another terminal)."""

from __future__ import annotations

import argparse
import sys

from sgd import runs


def cmd_stacks(args: argparse.Namespace) -> int:
    """Ask a running job's driver for every worker's stacks, through its run directory."""
    import secrets
    import time

    try:
        run_dir = runs.resolve_run_dir(args.run_dir)
    except FileNotFoundError as exc:
        print(f"sgd stacks: error: {exc}", file=sys.stderr)
        return 2
    status = runs.run_info(run_dir).status
    if status != "RUNNING":
        print(f"sgd stacks: error: {run_dir} is not running (its status is {status}); stacks come from the "
              "workers of a running job", file=sys.stderr)
        return 2
    token = f"sgd stacks {secrets.token_hex(8)}"
    (run_dir / runs.STACKS_REQUEST).write_text(token)
    deadline = time.monotonic() + args.timeout
    answer = run_dir / runs.STACKS_FILE
    while time.monotonic() < deadline:
        try:
            text = answer.read_text()
        except OSError:
            text = ""
        if text.startswith(token + "\n"):
            print(text[len(token) + 1:], end="")
            return 0
        time.sleep(0.1)
    (run_dir / runs.STACKS_REQUEST).unlink(missing_ok=True)
    print(f"sgd stacks: error: the driver of {run_dir} did not answer within {args.timeout:g} s (it reads "
          "requests between rounds, about once a second): is its process alive?", file=sys.stderr)
    return 1
