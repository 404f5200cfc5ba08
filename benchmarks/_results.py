"""Shared by the benchmark scripts: machine facts and the JSON + markdown result files."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

RESULTS = Path(__file__).parent / "results"


def _cpu_model() -> Optional[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def loadavg() -> Optional[List[float]]:
    """The 1, 5 and 15 minute load averages (``None`` where the OS has none): a busy machine
    shows here before it shows as noise in the numbers."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine(**extra: Any) -> Dict[str, Any]:
    """Date, CPUs and the versions that matter, plus ``extra``."""
    import ray
    import torch

    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "torch": torch.__version__,
        **extra,
    }


def save(name: str, data: Dict[str, Any], markdown: str, out: Path = RESULTS) -> None:
    """Write ``out/<name>.json`` (``data``) and ``out/<name>.md`` (``markdown``)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown)


def write(name: str, title: str, meta: Dict[str, Any], cases: List[Dict[str, Any]], out: Path = RESULTS) -> str:
    """Write ``out/<name>.json`` and ``.md``; return the markdown table.

    Each case has ``case``, ``median``, ``unit``, ``spread``, ``target`` and ``met``.
    """
    lines = [title, "", "| case | median | spread | target | met? |", "|---|---|---|---|---|"]
    for c in cases:
        value = f"{c['median']:.2f} {c['unit']}".rstrip()
        met = "—" if c['met'] is None else ("yes" if c['met'] else "NO")
        lines.append(f"| {c['case']} | {value} | {c['spread']} | {c['target']} | {met} |")
    table = "\n".join(lines) + "\n"
    save(name, {"machine": meta, "cases": cases}, table, out)
    return table
