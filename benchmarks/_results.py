"""Shared by the benchmark scripts: machine facts and the JSON + markdown result files."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Dict, List

RESULTS = Path(__file__).parent / "results"


def machine(**extra: Any) -> Dict[str, Any]:
    """Date, CPUs and the versions that matter, plus ``extra``."""
    import ray
    import torch

    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch.__version__,
        **extra,
    }


def write(name: str, title: str, meta: Dict[str, Any], cases: List[Dict[str, Any]]) -> str:
    """Write ``results/<name>.json`` and ``.md``; return the markdown table.

    Each case has ``case``, ``median``, ``unit``, ``spread``, ``target`` and ``met``.
    """
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": meta, "cases": cases}, indent=2))
    lines = [title, "", "| case | median | spread | target | met? |", "|---|---|---|---|---|"]
    for c in cases:
        value = f"{c['median']:.2f} {c['unit']}".rstrip()
        lines.append(f"| {c['case']} | {value} | {c['spread']} | {c['target']} | {'yes' if c['met'] else 'NO'} |")
    table = "\n".join(lines) + "\n"
    (RESULTS / f"{name}.md").write_text(table)
    return table
