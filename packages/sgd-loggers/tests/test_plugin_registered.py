"""sgd-loggers is discovered through its entry point: listed by `sgd plugins`, light to import."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import sgd
from sgd import plugins
from sgd_loggers import (
    CSVLoggerCallback,
    JsonLoggerCallback,
    MLflowLoggerCallback,
    PrintCallback,
    ProgressCallback,
    TBXLoggerCallback,
    WandbLoggerCallback,
)

CALLBACKS = ["JsonLoggerCallback", "CSVLoggerCallback", "TBXLoggerCallback", "MLflowLoggerCallback",
             "WandbLoggerCallback", "TorchTensorboardProfilerCallback", "PrintCallback", "ProgressCallback"]


def test_listed_by_sgd_plugins():
    out = subprocess.run([sys.executable, "-m", "sgd", "plugins", "--json"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    table = json.loads(out)
    (row,) = [r for r in table["plugins"] if r["name"] == "loggers"]
    assert row["distribution"] == "sgd-loggers" and row["version"] == "0.1.0"
    assert row["callbacks"] == CALLBACKS
    assert {"sgd_callbacks", "sgd_cli_commands", "sgd_default_callbacks"} <= set(row["hooks"])
    assert not [f for f in table["failed"] if f["name"] == "loggers"]
    text = subprocess.run([sys.executable, "-m", "sgd", "plugins"], capture_output=True, text=True, check=True,
                          timeout=120).stdout
    lines = text.splitlines()
    (row,) = [i for i, ln in enumerate(lines) if ln.startswith("loggers ")]
    # the callbacks are listed on the (indented) lines under the plugin's row
    under = " ".join(ln.strip() for ln in itertools.takewhile(lambda ln: ln.startswith("  "), lines[row + 1:]))
    assert under.startswith("callbacks: ") and all(name in under for name in CALLBACKS)


def test_callback_classes_through_the_hook():
    answers = plugins.get_plugin_manager().hook.sgd_callbacks()
    provided = [cls for answer in answers for cls in answer]
    for cls in (JsonLoggerCallback, CSVLoggerCallback, TBXLoggerCallback, MLflowLoggerCallback, WandbLoggerCallback,
                PrintCallback, ProgressCallback):
        assert cls in provided and issubclass(cls, sgd.TrainingCallback)


def test_importing_the_plugin_imports_no_logging_library():
    code = ("import sys, sgd, sgd_loggers, sgd_loggers.plugin; from sgd.cli import build_parser; build_parser(); "
            "heavy = ('mlflow', 'wandb', 'tensorboardX', 'tensorboard', 'matplotlib', 'torch', 'numpy'); "
            "print(sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_default_progress_callback(monkeypatch):
    hook = plugins.get_plugin_manager().hook
    monkeypatch.delenv("SGD_PROGRESS", raising=False)
    added = [cb for answer in hook.sgd_default_callbacks(trainer=None) for cb in answer]
    assert [type(cb) for cb in added if isinstance(cb, ProgressCallback)] == [ProgressCallback]
    monkeypatch.setenv("SGD_PROGRESS", "0")
    added = [cb for answer in hook.sgd_default_callbacks(trainer=None) for cb in answer]
    assert not [cb for cb in added if isinstance(cb, ProgressCallback)]


def test_plot_command_registered():
    from sgd.cli import build_parser

    args = build_parser().parse_args(["plot", "run_dir", "--metric", "loss", "--metric", "acc", "-o", "p.png"])
    assert (args.run_dir, args.metric, args.output) == ("run_dir", ["loss", "acc"], "p.png")
    assert callable(args.func)
