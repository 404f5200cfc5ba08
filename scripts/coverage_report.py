"""Line and branch coverage per package from a combined coverage.py data file (``nox -s coverage``).

Prints a markdown table and writes it, with the numbers as JSON, next to the data file. A
package's figure counts every statement and branch of its ``src/`` files, measured in any process.

Usage: ``python scripts/coverage_report.py DATA_FILE``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict

import coverage


def per_package(data_file: Path) -> Dict[str, Dict[str, float]]:
    cov = coverage.Coverage(data_file=str(data_file), config_file="pyproject.toml")
    cov.load()
    out_json = data_file.with_suffix(".json")
    cov.json_report(outfile=str(out_json), ignore_errors=True)
    files = json.loads(out_json.read_text())["files"]
    totals: Dict[str, Dict[str, float]] = {}
    for path, info in files.items():
        parts = Path(path).parts
        if "packages" not in parts:
            continue
        package = parts[parts.index("packages") + 1]
        s = info["summary"]
        t = totals.setdefault(package, {"statements": 0, "covered_lines": 0, "branches": 0, "covered_branches": 0})
        t["statements"] += s["num_statements"]
        t["covered_lines"] += s["covered_lines"]
        t["branches"] += s.get("num_branches", 0)
        t["covered_branches"] += s.get("covered_branches", 0)
    for t in totals.values():
        t["line_pct"] = 100.0 * t["covered_lines"] / t["statements"] if t["statements"] else 100.0
        t["branch_pct"] = 100.0 * t["covered_branches"] / t["branches"] if t["branches"] else 100.0
    return dict(sorted(totals.items()))


def table(totals: Dict[str, Dict[str, float]]) -> str:
    lines = ["| package | statements | lines covered | branches | branches covered |", "|---|---|---|---|---|"]
    for name, t in totals.items():
        lines.append(f"| {name} | {t['statements']:.0f} | {t['line_pct']:.1f}% | {t['branches']:.0f} | "
                     f"{t['branch_pct']:.1f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    data_file = Path(sys.argv[1]).resolve()
    totals = per_package(data_file)
    text = table(totals)
    data_file.with_name("coverage-by-package.md").write_text(text)
    data_file.with_name("coverage-by-package.json").write_text(json.dumps(totals, indent=2))
    print(text)


if __name__ == "__main__":
    main()
