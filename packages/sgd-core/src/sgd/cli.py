"""The ``sgd`` command (also ``python -m sgd``): ``sgd plugins``, ``sgd run``, ``sgd runs``.

Heavy modules (Ray, the launcher) are imported inside the commands that need them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import itertools
import json
import logging
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from sgd import launcher as launch
from sgd import plugins, runs
from sgd.utils import results_root


def _version(dist: Optional[str]) -> str:
    if not dist:
        return "-"
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _answers(pm: Any, hook_name: str) -> Dict[str, List[Any]]:
    """Plugin name → what its implementation of a discovery hook returns ([] if it fails), each
    plugin asked on its own through pluggy (:func:`sgd.plugins.ask_each`)."""
    return {answer.plugin: [item for value in answer.values for item in (value or [])]
            for answer in plugins.ask_each(pm, hook_name) if answer.error is None}


def plugin_table() -> List[Dict[str, Any]]:
    """One record per loaded plugin: name, distribution, version, what it provides."""
    pm = plugins.get_plugin_manager()
    backends = plugins.available_backends()
    declared = {hook: _answers(pm, hook)
                for hook in ("sgd_backends", "sgd_callbacks", "sgd_checkpoint_storage_schemes")}
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist = plugins.plugin_distribution(name)
        provided_backends = [s.name for s in declared["sgd_backends"].get(name, [])]
        callbacks = [c.__name__ for c in declared["sgd_callbacks"].get(name, [])]
        schemes = [str(s) for s in declared["sgd_checkpoint_storage_schemes"].get(name, [])]
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        rows.append(
            {
                "name": name,
                "distribution": dist,
                "version": _version(dist),
                "backends": [b for b in provided_backends if b in backends],
                "callbacks": callbacks,
                "storage": schemes,
                "hooks": hooks,
            }
        )
    return rows


#: ``sgd plugins`` keeps every line within this many columns.
TABLE_WIDTH = 100


def _wrap(text: str, indent: str, width: int = TABLE_WIDTH) -> List[str]:
    """``text`` wrapped at ``width`` on ", " and spaces; continuation lines start with ``indent``."""
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [text]


def format_plugin_table(rows: List[Dict[str, Any]], width: int = TABLE_WIDTH) -> List[str]:
    """The lines of ``sgd plugins``: one row per plugin (name, version, backends, storage schemes),
    its callbacks on the lines under it, every line at most ``width`` columns.

    A cell wider than its column wraps within the column: the first three columns are capped
    (at 24, 12 and 24 characters), the storage column takes the rest.

    :param rows: records as :func:`plugin_table` returns them.
    :param width: the widest line allowed (at least 80).
    """
    header = ("plugin", "version", "backends", "storage")
    cells = [
        (str(r["name"]), str(r["version"]), ", ".join(r["backends"]) or "-", ", ".join(r["storage"]) or "-")
        for r in rows
    ]
    widths = [min(max(len(row[i]) for row in cells + [header]), cap) for i, cap in enumerate((24, 12, 24))]
    widths.append(width - sum(widths) - 2 * len(widths))
    lines = []
    for record, row in zip([None, *rows], [header, *cells]):
        wrapped = [textwrap.wrap(cell, w, break_on_hyphens=False) or [cell] for cell, w in zip(row, widths)]
        for parts in itertools.zip_longest(*wrapped, fillvalue=""):
            lines.append("  ".join(part.ljust(w) for part, w in zip(parts, widths)).rstrip())
        if record is not None and record["callbacks"]:
            lines.extend(_wrap("  callbacks: " + ", ".join(record["callbacks"]), "    ", width))
    return lines


def _cmd_plugins(args: argparse.Namespace) -> int:
    rows = plugin_table()
    failures = plugins.load_failures()
    conflicts = plugins.backend_conflicts()
    if args.json:
        print(
            json.dumps(
                {
                    "plugins": rows,
                    "failed": [f.__dict__ for f in failures],
                    "conflicts": conflicts,
                },
                indent=2,
            )
        )
        return 0
    for line in format_plugin_table(rows):
        print(line)
    for name, providers in conflicts.items():
        print()
        print(*_wrap(f"conflict: backend {name!r} is provided by {', '.join(providers)}", "    "), sep="\n")
    if failures:
        print("\nfailed to load:")
        for f in failures:
            print(*_wrap(f"  {f.name} ({f.distribution or '?'}): {f.reason}", "      "), sep="\n")
    return 0


# --- sgd run ------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _retries(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -2
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be an integer >= -1 (-1: unlimited), got {text!r}")
    return value


def _json_object(text: str) -> Dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


# The options of ``sgd run`` that take a value: everything from the first other word on
# (the script) belongs to the script, so they are split off before argparse sees them.
_RUN_OPTIONS_WITH_VALUE = (
    (("--backend",), dict(default="torch", metavar="NAME",
                          help="a backend name: torch (default), tensorflow, horovod, base, any installed one")),
    (("-n", "--num-workers"), dict(type=_positive_int, default=1, metavar="N", help="workers (default 1)")),
    (("--max-retries",), dict(type=_retries, default=3, metavar="K",
                              help="restarts after a worker dies (default 3; -1: unlimited)")),
    (("--logdir",), dict(default=None, metavar="DIR",
                         help="where runs go (default $SGD_RESULTS_DIR or ~/sgd_results, train_<time>)")),
    (("--resources-per-worker",), dict(type=_json_object, default=None, metavar="JSON",
                                       help='Ray resources per worker, e.g. \'{"CPU": 2}\'')),
    (("--backend-config",), dict(type=_json_object, default=None, metavar="JSON",
                                 help='keyword arguments of the backend\'s config, e.g. \'{"timeout_s": 60}\'')),
)

_RUN_EPILOG = """\
examples:
  sgd run -n 2 train.py --lr 0.1
  sgd run --backend torch -n 4 --use-gpu --max-retries 3 --logdir my_exp train.py
  sgd run -n 2 -m mypackage.train --epochs 3
  sgd run -n 2 -- train.py        (-- ends sgd's options; after the script, -- is the script's)

Every word after the script belongs to the script. Each worker runs the script as
__main__ with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT... set (torch:
the script calls init_process_group itself); sgd.report / sgd.save_checkpoint /
sgd.load_checkpoint work in it. See docs/sgd-run.md.
"""


def split_run_argv(argv: List[str]) -> Tuple[List[str], List[str]]:
    """Split the words after ``sgd run`` into sgd's (up to and including the script) and the script's."""
    with_value = {name for names, _ in _RUN_OPTIONS_WITH_VALUE for name in names}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[: i + 2], argv[i + 2:]
        if word.startswith("-") and word != "-":
            takes_value = word in with_value or (
                not word.startswith("--") and word[:2] in with_value and len(word) > 2
            )
            attached = "=" in word or (not word.startswith("--") and len(word) > 2)
            i += 2 if takes_value and not attached else 1
            continue
        return argv[: i + 1], argv[i + 1:]
    return argv, []


def _add_run_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a torchrun-style script on N workers with sgd's reporting and restarts",
        description="Run an unchanged torchrun-style training script on N sgd workers (Ray actors).",
        epilog=_RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    for names, kwargs in _RUN_OPTIONS_WITH_VALUE:
        p.add_argument(*names, **kwargs)  # type: ignore[arg-type]
    p.add_argument("--use-gpu", action="store_true", help="one GPU per worker (torch: nccl)")
    p.add_argument("-m", "--module", action="store_true", help="the script is a module name (python -m)")
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")
    p.set_defaults(func=_cmd_run)


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a record comes (not when it was made)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _sgd_logging() -> Iterator[None]:
    """Show sgd's INFO messages (restarts...) on stderr while a command runs."""
    log = logging.getLogger("sgd")
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("sgd: %(message)s"))
    level = log.level
    log.addHandler(handler)
    if level == logging.NOTSET or level > logging.INFO:
        log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _metrics_text(metrics: Dict[str, Any]) -> str:
    shown = {k: v for k, v in metrics.items() if not str(k).startswith("_")}
    return ", ".join(f"{k}={_short_value(v)}" for k, v in shown.items())


def _short_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _cmd_run(args: argparse.Namespace) -> int:

    def started(run_dir: Any) -> None:
        print(f"sgd run: {args.num_workers} worker(s), backend {args.backend}; run directory {run_dir}",
              file=sys.stderr, flush=True)

    try:
        with _sgd_logging():
            result = launch.launch(
                args.script, args.script_args, module=args.module, backend=args.backend,
                num_workers=args.num_workers, use_gpu=args.use_gpu, resources_per_worker=args.resources_per_worker,
                logdir=args.logdir, max_retries=args.max_retries, backend_config=args.backend_config,
                on_start=started,
            )
    except launch.LaunchError as exc:
        print(f"sgd run: error: {exc}", file=sys.stderr)
        return 2
    restarts = f" after {result.starts - 1} restart(s)" if result.starts > 1 else ""
    if result.error is not None:
        if isinstance(result.error, KeyboardInterrupt):
            print("sgd run: interrupted; the workers are stopped", file=sys.stderr)
        else:
            print(f"sgd run: failed{restarts}: {launch.failure_message(result.error)}", file=sys.stderr)
        if result.run_dir is not None:
            print(f"sgd run: run directory {result.run_dir}", file=sys.stderr)
        return result.exit_code
    summary = f"sgd run: finished{restarts}"
    if result.final_metrics:
        iteration = result.final_metrics[0].get("_training_iteration", "?")
        summary += f"; {iteration} report(s), last (rank 0): {_metrics_text(result.final_metrics[0]) or '-'}"
    print(summary, file=sys.stderr)
    print(f"sgd run: run directory {result.run_dir}", file=sys.stderr)
    return 0


# --- sgd runs -------------------------------------------------------------------------


def _time_text(stamp: Optional[float]) -> str:
    import datetime

    if stamp is None:
        return "-"
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


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
    rows = [(shown(i.path), i.status, str(i.iterations), _time_text(i.started), i.latest_checkpoint or "-")
            for i in infos]
    print(f"runs under {root}:")
    _print_table(header, rows)
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
        status += f" at {_time_text(summary['status_time'])}"
    rows = [
        ("run", summary["path"]),
        ("status", status),
        ("started", _time_text(summary["started"])),
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
            print(f"  {str(k).ljust(key_width)}  {_short_value(final[k])}")
    else:
        print("final metrics (rank 0): -")
    return 0


def _cmd_stacks(args: argparse.Namespace) -> int:
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


def _add_runs_parser(sub: Any) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgd", description="sgd: distributed training on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugins and what they provide")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_plugins)
    _add_run_parser(sub)
    _add_runs_parser(sub)
    st = sub.add_parser("stacks", help="every worker's Python stacks of a running job (from another terminal)")
    st.add_argument("run_dir", help="the job's run directory (logdir/run_NNN), or its logdir for the latest run")
    st.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the driver (default 30)")
    st.set_defaults(func=_cmd_stacks)
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


if __name__ == "__main__":
    sys.exit(main())
