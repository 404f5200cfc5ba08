"""`sgd plugins` fits 100 columns with every plugin of this repository installed, and with
plugins that provide more than fits on one line, and still names everything each provides."""

import json
import subprocess
import sys
from typing import Dict, List

from sgd.cli import TABLE_WIDTH, format_plugin_table


def _sections(lines: List[str], names: List[str]) -> Dict[str, str]:
    """Each plugin's row and the lines under it up to the next plugin's row, joined."""
    out: Dict[str, str] = {}
    current = None
    for line in lines[1:]:
        first = line.split(" ", 1)[0]
        if first in names and not line.startswith(" "):
            current = first
            out[current] = line
        elif current is not None and line.startswith(" "):
            out[current] += " " + line.strip()
    return out


def test_installed_plugins_fit_and_are_all_listed():
    run = [sys.executable, "-m", "sgd", "plugins"]
    text = subprocess.run(run, capture_output=True, text=True, check=True, timeout=120).stdout
    table = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, check=True,
                                      timeout=120).stdout)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= TABLE_WIDTH, text
    names = [p["name"] for p in table["plugins"]]
    # every package of the repository is installed in the test environment
    assert {"sgd-core", "torch", "tensorflow", "horovod", "loggers", "tune"} <= set(names)
    sections = _sections(lines, names)
    assert list(sections) == names
    loggers = sections["loggers"]
    assert loggers.split()[:2] == ["loggers", "0.1.0"]
    for plugin in table["plugins"]:
        section = sections[plugin["name"]]
        for provided in plugin["callbacks"] + plugin["backends"] + plugin["storage"]:
            assert provided in section, (provided, section)


def test_long_answers_wrap_within_the_width():
    rows = [
        {"name": "sgd-core", "version": "0.1.0", "backends": ["base"], "callbacks": [],
         "storage": [f"scheme{i}" for i in range(30)]},
        {"name": "many", "version": "10.20.30", "backends": ["a", "b"],
         "callbacks": [f"VeryLongCallbackName{i}Callback" for i in range(12)], "storage": []},
        {"name": "p" * 120, "version": "1.0", "backends": [], "callbacks": ["X"], "storage": ["s3"]},
    ]
    lines = format_plugin_table(rows)
    assert all(len(line) <= TABLE_WIDTH for line in lines), "\n".join(lines)
    assert lines[0].split() == ["plugin", "version", "backends", "storage"]
    joined = " ".join(lines).replace(", ", ",").replace(",", ", ")
    for row in rows[:2]:
        for provided in row["callbacks"] + row["storage"]:
            assert provided in joined
    many = next(i for i, line in enumerate(lines) if line.startswith("many "))
    assert lines[many].split()[:4] == ["many", "10.20.30", "a,", "b"]
    assert lines[many + 1].startswith("  callbacks: VeryLongCallbackName0Callback")
    assert len([line for line in lines if "VeryLongCallbackName" in line]) > 1   # wrapped
    # A cell wraps within its column, aligned with its header.
    start = lines[0].index("storage")
    assert lines[1][start:].startswith("scheme0") and lines[2][:start].strip() == ""
    long_name = [line[:24] for line in lines if line.startswith("p" * 24)]
    assert "".join(long_name) == "p" * 120
