"""``sgd plot RUN_DIR [--metric NAME ...] [-o plot.png]``: a run's metrics over ``_training_iteration``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sgd_loggers._util import NON_FINITE, flatten, scalar

#: Results files ``sgd plot`` reads, in order of preference.
RESULTS_FILES = ("results.jsonl", "results.json")
# Non-finite numbers as the writers spell them: JsonLoggerCallback ("NaN") and sgd core ("nan").
_FROM_JSON = {**{v: float(k) for k, v in NON_FINITE.items()}, **{k: float(k) for k in NON_FINITE}}

Series = Dict[str, Dict[int, Tuple[List[float], List[float]]]]


def load_rounds(run_dir: Path) -> Tuple[List[List[Dict[str, Any]]], Path]:
    """The report rounds of a run and the file they came from.

    ``results.jsonl`` (written by sgd core: one JSON list of per-worker dicts per line) is
    preferred; a line that does not parse (a run killed mid-write) is skipped. Else
    ``results.json`` (written by :class:`~sgd_loggers.JsonLoggerCallback`).

    :raises FileNotFoundError: neither file exists.
    :raises ValueError: the file is not what these writers write.
    """
    jsonl, json_file = (run_dir / name for name in RESULTS_FILES)
    if jsonl.is_file():
        rounds = []
        with open(jsonl, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rounds.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return [_as_round(r, jsonl) for r in rounds], jsonl
    if json_file.is_file():
        with open(json_file, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, list):
            raise ValueError(f"{json_file} does not hold a JSON list of rounds")
        return [_as_round(r, json_file) for r in data], json_file
    raise FileNotFoundError(
        f"no results in {run_dir}: expected {' or '.join(RESULTS_FILES)} "
        "(pass a run directory such as ~/sgd_results/train_<date>/run_001)"
    )


def _as_round(entry: Any, source: Path) -> List[Dict[str, Any]]:
    if isinstance(entry, dict):  # tolerate a file of plain dicts: one worker
        return [entry]
    if isinstance(entry, list) and all(isinstance(r, dict) for r in entry):
        return entry
    raise ValueError(f"{source}: each round must be a list of per-worker dicts, got {type(entry).__name__}")


def _number(value: Any) -> Optional[float]:
    if isinstance(value, str):
        return _FROM_JSON.get(value)
    return scalar(value)


def collect_series(rounds: List[List[Dict[str, Any]]]) -> Series:
    """metric -> worker position -> (iterations, values). Non-numeric values are left out."""
    series: Series = {}
    for index, round_ in enumerate(rounds, start=1):
        for worker, result in enumerate(round_):
            flat = flatten(result)
            x = _number(flat.get("_training_iteration"))
            x = float(index) if x is None or not math.isfinite(x) else x
            for key, value in flat.items():
                y = _number(value)
                if y is None or key == "_training_iteration":
                    continue
                xs, ys = series.setdefault(key, {}).setdefault(worker, ([], []))
                xs.append(x)
                ys.append(y)
    return series


def default_metrics(series: Series) -> List[str]:
    """The metrics plotted when none is asked for: those whose name does not start with ``_``."""
    return [k for k in series if not k.startswith("_")]


def make_figure(rounds: List[List[Dict[str, Any]]], metrics: Optional[Sequence[str]] = None, title: str = "") -> Any:
    """A matplotlib ``Figure``: one panel per metric, one line per worker, x = ``_training_iteration``.

    :raises ImportError: matplotlib is missing (with the install hint).
    :raises ValueError: a metric is not in the results, or there is nothing to plot.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise ImportError("sgd plot needs matplotlib: pip install 'sgd-loggers[plot]'") from exc

    series = collect_series(rounds)
    wanted = list(metrics) if metrics else default_metrics(series)
    missing = [m for m in wanted if m not in series]
    if missing:
        available = ", ".join(sorted(series)) or "none"
        raise ValueError(f"metric(s) {', '.join(map(repr, missing))} not in the results; available: {available}")
    if not wanted:
        raise ValueError("the results hold no numeric metric to plot")
    fig = Figure(figsize=(8, 2.6 * len(wanted) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(wanted), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, wanted):
        workers = series[metric]
        for worker, (xs, ys) in sorted(workers.items()):
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=f"worker {worker}")
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
        if len(workers) > 1:
            ax.legend(loc="best", fontsize="small")
    axes[-1].set_xlabel("_training_iteration")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(title)
    return fig


def plot_run(run_dir: Path, metrics: Optional[Sequence[str]] = None, output: Optional[Path] = None) -> Path:
    """Draw a run's metrics into ``output`` (default ``RUN_DIR/metrics.png``); returns the path."""
    run_dir = Path(run_dir).expanduser()
    rounds, source = load_rounds(run_dir)
    fig = make_figure(rounds, metrics, title=f"{run_dir.parent.name}/{run_dir.name} ({source.name})")
    output = Path(output).expanduser() if output else run_dir / "metrics.png"
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    return output


def _cmd_plot(args: argparse.Namespace) -> int:
    try:
        path = plot_run(Path(args.run_dir), args.metric, Path(args.output) if args.output else None)
    except ImportError as exc:
        print(f"sgd plot: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as exc:
        print(f"sgd plot: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def add_plot_command(subparsers: Any) -> None:
    """Register ``sgd plot`` on the ``sgd`` command's sub-parsers."""
    p = subparsers.add_parser(
        "plot",
        help="plot a run's metrics over _training_iteration (needs sgd-loggers[plot])",
        description="Plot a run's metrics over _training_iteration from RUN_DIR/results.jsonl "
        "(or RUN_DIR/results.json, written by JsonLoggerCallback).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, e.g. ~/sgd_results/train_<date>/run_001")
    p.add_argument(
        "--metric", action="append", metavar="NAME",
        help="a metric to plot (repeat for several; nested keys joined with '/'); "
        "default: every numeric metric not starting with '_'",
    )
    p.add_argument("-o", "--output", metavar="PNG", help="the image to write (default: RUN_DIR/metrics.png)")
    p.set_defaults(func=_cmd_plot)
