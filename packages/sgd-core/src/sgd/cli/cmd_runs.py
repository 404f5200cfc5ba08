"""``sgd runs ls`` and ``sgd runs show``: run directories listed, and one summarised."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from sgd import runs
from sgd.cli.text import print_table, short_value, time_text
from sgd.utils import results_root


def _cmd_runs_ls(args: argparse.Namespace) -> int:
    import dataclasses


    root = Path(args.logdir).expanduser() if args.logdir else results_root()
    try:
        found = runs.find_runs(root)
    except FileNotFoundError as exc:
        print(f"sgd runs ls: error: {exc}", file=sys.stderr)
        return 2
    infos = [runs.run_info(p) for p in found]
    if args.json:
        print(json.dumps([dataclasses.asdict(i) for i in infos], indent=2))
        return 0
    if not infos:
        print(f"no runs under {root}")
        return 0

    def shown(path: str) -> str:
        try:
            rel = os.path.relpath(path, root)
        except ValueError:
            return path
        return path if rel.startswith("..") else rel

    header = ("run", "status", "iterations", "started", "latest checkpoint")
    rows = [(shown(i.path), i.status, str(i.iterations), time_text(i.started), i.latest_checkpoint or "-")
            for i in infos]
    print(f"runs under {root}:")
    print_table(header, rows)
    return 0


def _cmd_runs_show(args: argparse.Namespace) -> int:

    try:
        run_dir = runs.resolve_run_dir(args.run_dir)
    except FileNotFoundError as exc:
        print(f"sgd runs show: error: {exc}", file=sys.stderr)
        return 2
    summary = runs.run_summary(run_dir)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return 0

    unverified = {c["name"]: c["problem"] for c in summary.get("unverified_checkpoints", [])}

    def checkpoint_text(c: Optional[Dict[str, Any]]) -> str:
        if c is None:
            return "-"
        mark = " NOT VERIFIED" if c["name"] in unverified else ""
        return f"{c['name']} (after iteration {c.get('iteration', '?')}){mark}"

    workers = summary["num_workers"]
    if isinstance(workers, list) and len(workers) == 2:
        workers = str(workers[0]) if workers[0] == workers[1] else f"{workers[0]}-{workers[1]}"
    resources = summary["resources_per_worker"] or {}
    per_worker = ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}"
                           for k, v in resources.items())
    backend = summary["backend"] or "-"
    config = summary["backend_config"] or {}
    if config:
        backend += " (" + ", ".join(f"{k}={v}" for k, v in config.items()) + ")"
    status = summary["status"]
    if summary["status_time"] is not None and status != "RUNNING":
        status += f" at {time_text(summary['status_time'])}"
    rows = [
        ("run", summary["path"]),
        ("status", status),
        ("started", time_text(summary["started"])),
        ("backend", backend),
        ("workers", f"{workers or '-'}" + (f" ({per_worker} per worker)" if per_worker else "")),
        ("max retries", str(summary["max_retries"]) if summary["max_retries"] is not None else "-"),
        ("iterations", str(summary["iterations"])),
        ("checkpoints", str(summary["checkpoints"])),
        ("latest checkpoint", checkpoint_text(summary["latest_checkpoint"])),
        ("best checkpoint", checkpoint_text(summary["best_checkpoint"])),
    ]
    rows += [("NOT VERIFIED", f"{name}: {problem}") for name, problem in unverified.items()]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    final = summary["final_metrics"]
    if final:
        print("final metrics (rank 0):")
        keys = sorted(final, key=lambda k: (str(k).startswith("_"), str(k)))
        key_width = max(len(str(k)) for k in keys)
        for k in keys:
            print(f"  {str(k).ljust(key_width)}  {short_value(final[k])}")
    else:
        print("final metrics (rank 0): -")
    return 0


def add_runs_parser(sub: Any) -> None:
    p = sub.add_parser("runs", help="list run directories and summarise one")
    runs_sub = p.add_subparsers(dest="runs_command", required=True)
    ls = runs_sub.add_parser("ls", help="one line per run: path, status, iterations, started, latest checkpoint")
    ls.add_argument("logdir", nargs="?", help="where to look (default $SGD_RESULTS_DIR or ~/sgd_results)")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=_cmd_runs_ls)
    show = runs_sub.add_parser("show", help="summarise one run: status, backend, iterations, checkpoints, metrics")
    show.add_argument("run_dir", help="a run directory (logdir/run_NNN), or a logdir for its latest run")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=_cmd_runs_show)
