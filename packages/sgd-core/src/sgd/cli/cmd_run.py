"""``sgd run``: an unchanged torchrun-style script on N workers (the launcher), its options and
how the words after ``sgd run`` are split between sgd and the script."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from typing import Any, Dict, Iterator, List, Tuple

from sgd import launcher as launch
from sgd.cli.text import short_value


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


def add_run_parser(sub: Any) -> None:
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
    return ", ".join(f"{k}={short_value(v)}" for k, v in shown.items())


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
