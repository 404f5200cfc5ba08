"""``sgd_testing.suite_cost``: one line per test with its wall time, CPU time and outcome;
``scripts/suite_cost.py`` sums them per package and file."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sgd_testing.suite_cost import cgroup_cpu_reader

ROOT = Path(__file__).resolve().parents[3]


def test_each_test_gets_a_line_with_its_cpu_time_and_outcome(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_some.py").write_text(
        "import pytest, time\n\n"
        "def test_busy():\n"
        "    end = time.process_time() + 0.3\n"
        "    while time.process_time() < end:\n"
        "        pass\n\n"
        "def test_fails():\n"
        "    assert False\n\n"
        "def test_skipped():\n"
        "    pytest.skip('no')\n")
    out = tmp_path / "cost.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SGD_SUITE_COST"))}
    env["SGD_SUITE_COST_OUT"] = str(out)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "sgd_testing.suite_cost"], cwd=suite, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the one failing test
    lines = {row["id"].split("::")[1]: row for row in map(json.loads, out.read_text().splitlines())}
    assert {k: v["outcome"] for k, v in lines.items()} == {"test_busy": "passed", "test_fails": "failed",
                                                           "test_skipped": "skipped"}
    assert lines["test_busy"]["cpu"] >= 0.25 and lines["test_busy"]["wall"] >= 0.25
    assert lines["test_skipped"]["cpu"] < 0.25


def test_reads_a_v1_or_v2_cgroup_counter(tmp_path):
    v1, v2, none = tmp_path / "v1", tmp_path / "v2", tmp_path / "none"
    for d in (v1, v2, none):
        d.mkdir()
    (v1 / "cpuacct.usage").write_text("2500000000\n")
    (v2 / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n")
    assert cgroup_cpu_reader(str(v1))() == 2.5
    assert cgroup_cpu_reader(str(v2))() == 1.5
    assert cgroup_cpu_reader(str(none)) is None and cgroup_cpu_reader(None) is None
    (v2 / "cpu.stat").write_text("user_usec 1000000\nusage_usec 2000000\n")  # found wherever it is
    assert cgroup_cpu_reader(str(v2))() == 2.0
    (v2 / "cpu.stat").write_text("user_usec 1000000\n")
    with pytest.raises(RuntimeError, match=r"cpu.stat has no usage_usec line"):
        cgroup_cpu_reader(str(v2))()


def test_the_report_sums_per_package_and_file_and_counts_waiting():
    spec = importlib.util.spec_from_file_location("suite_cost_script", ROOT / "scripts" / "suite_cost.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = [{"id": "packages/a/tests/test_x.py::t1", "wall": 10.0, "cpu": 2.0, "outcome": "passed"},
            {"id": "packages/a/tests/test_x.py::t2", "wall": 2.0, "cpu": 4.0, "outcome": "passed"},
            {"id": "packages/b/tests/test_y.py::t3", "wall": 6.0, "cpu": 6.0, "outcome": "failed"}]
    text = script.report(rows, wall=60.0, cpu=30.0)
    assert text.startswith("3 tests; wall 1.0 min, CPU 0.5 min (0.50 cores busy on average); "
                           "tests waiting (wall above CPU) 0.1 min in all.")
    assert "| packages/a | 2 | 12 | 6 |" in text and "| packages/b | 1 | 6 | 6 |" in text
    assert "| packages/a/tests/test_x.py | 2 | 12 | 6 |" in text
    assert text.index("test_x.py::t1") < text.index("test_y.py::t3")  # slowest first
