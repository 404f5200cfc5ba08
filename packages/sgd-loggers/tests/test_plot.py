"""``sgd plot``: a run's metrics over _training_iteration, from results.jsonl or results.json."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from sgd_loggers import JsonLoggerCallback
from sgd_loggers.plot import load_rounds, make_figure, plot_run


def write_jsonl(run_dir, rounds, tail=""):
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rounds]
    (run_dir / "results.jsonl").write_text("\n".join(lines) + "\n" + tail)


def write_json(run_dir, rounds, workers_to_log=0):
    cb = JsonLoggerCallback(workers_to_log=workers_to_log)
    cb.start_training(logdir=str(run_dir), config={})
    for r in rounds:
        cb.handle_result(r)
    cb.finish_training()


def lines_of(ax):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_figure_from_jsonl_one_line_per_worker(tmp_path, make_rounds):
    pytest.importorskip("matplotlib")
    rounds = make_rounds(workers=2, reports=4)
    write_jsonl(tmp_path, rounds, tail='[{"loss": 9, "_training_iter')  # a line cut by a crash is skipped
    loaded, source = load_rounds(tmp_path)
    assert source.name == "results.jsonl" and loaded == rounds
    fig = make_figure(loaded)
    axes = fig.get_axes()
    assert [ax.get_ylabel() for ax in axes] == ["loss", "acc/top1"]
    assert lines_of(axes[0]) == {
        "worker 0": ([1, 2, 3, 4], [r[0]["loss"] for r in rounds]),
        "worker 1": ([1, 2, 3, 4], [r[1]["loss"] for r in rounds]),
    }
    assert axes[-1].get_xlabel() == "_training_iteration"


def test_figure_from_json_logger_file_with_non_finite_values(tmp_path):
    pytest.importorskip("matplotlib")
    rounds = [[{"loss": v, "name": "x", "_training_iteration": i}] for i, v in
              enumerate([1.0, float("nan"), float("inf"), 0.5], start=1)]
    write_json(tmp_path, rounds)
    loaded, source = load_rounds(tmp_path)
    assert source.name == "results.json"
    (ax,) = make_figure(loaded, ["loss"]).get_axes()
    xs, ys = lines_of(ax)["worker 0"]
    assert xs == [1, 2, 3, 4]
    assert ys[0] == 1.0 and math.isnan(ys[1]) and ys[2] == math.inf and ys[3] == 0.5


def test_jsonl_is_preferred_and_core_spellings_of_non_finite(tmp_path):
    pytest.importorskip("matplotlib")
    write_json(tmp_path, [[{"loss": 5.0, "_training_iteration": 1}]])
    write_jsonl(tmp_path, [[{"loss": "nan", "_training_iteration": 1}], [{"loss": 2.0, "_training_iteration": 2}]])
    (ax,) = make_figure(load_rounds(tmp_path)[0], ["loss"]).get_axes()
    xs, ys = lines_of(ax)["worker 0"]
    assert xs == [1, 2] and math.isnan(ys[0]) and ys[1] == 2.0


def test_cli_writes_a_png(tmp_path, make_rounds):
    mpl_image = pytest.importorskip("matplotlib.image")
    run_dir = tmp_path / "train_x" / "run_001"
    write_jsonl(run_dir, make_rounds(workers=2, reports=5))
    out = tmp_path / "plot.png"
    proc = subprocess.run([sys.executable, "-m", "sgd", "plot", str(run_dir), "--metric", "loss", "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"wrote {out}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = mpl_image.imread(out).shape
    assert (width, height) == (800, 320)  # 8 x 3.2 inches at 100 dpi: one panel


def test_default_output_and_metrics(tmp_path, make_rounds):
    pytest.importorskip("matplotlib")
    write_json(tmp_path, make_rounds(workers=1, reports=3))
    path = plot_run(tmp_path)
    assert path == tmp_path / "metrics.png" and path.stat().st_size > 0


def test_cli_errors(tmp_path, make_rounds, capsys):
    from sgd.cli import main

    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sgd plot: no results in") and "results.jsonl or results.json" in err
    write_jsonl(tmp_path, make_rounds(workers=1, reports=2))
    assert main(["plot", str(tmp_path), "--metric", "accuracy"]) == 2
    assert capsys.readouterr().err == (
        "sgd plot: metric(s) 'accuracy' not in the results; available: _time_this_iter_s, _timestamp, acc/top1, loss\n"
    )
    (tmp_path / "results.jsonl").unlink()
    (tmp_path / "results.json").write_text('{"not": "a list"}')
    assert main(["plot", str(tmp_path)]) == 2
    assert "does not hold a JSON list of rounds" in capsys.readouterr().err


def test_missing_matplotlib_gives_install_hint(tmp_path, monkeypatch, make_rounds, capsys):
    from sgd.cli import main

    write_jsonl(tmp_path, make_rounds(workers=1, reports=2))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert main(["plot", str(tmp_path)]) == 1
    assert "pip install 'sgd-loggers[plot]'" in capsys.readouterr().err
