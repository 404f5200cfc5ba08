"""Installing sgd-testing adds nothing to a user's test suite: its fixtures (two of them autouse)
load only where a suite opts in with ``pytest_plugins = ["sgd_testing.fixtures"]``."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path


def test_no_pytest11_entry_point():
    found = [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.value.startswith("sgd_testing")]
    assert found == [], f"sgd-testing must not load itself into every pytest run: {found}"


def _pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SGD_RESULTS_DIR"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=folder, capture_output=True, text=True, env=env, timeout=120)


def test_a_suite_gets_the_fixtures_only_when_it_opts_in(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_env.py").write_text(
        "import os\n\n"
        "def test_results_dir():\n"
        "    print('SGD_RESULTS_DIR=' + os.environ.get('SGD_RESULTS_DIR', 'unset'))\n")
    plain = _pytest_in(suite, "-s")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "SGD_RESULTS_DIR=unset" in plain.stdout  # no autouse fixture ran

    (suite / "conftest.py").write_text('pytest_plugins = ["sgd_testing.fixtures"]\n')
    opted = _pytest_in(suite, "-s")
    assert opted.returncode == 0, opted.stdout + opted.stderr
    assert "SGD_RESULTS_DIR=unset" not in opted.stdout and "sgd_results" in opted.stdout
