"""``sgd dashboard`` through the real ``sgd`` console script: listed as a plugin, its help, the
refusals (a non-local bind without a token, a folder that is not there), and a server on a free
port that prints its URL, answers there and stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import runfolders as rf

SGD = str(Path(sys.executable).parent / "sgd")


def _env():
    env = dict(os.environ)
    env.pop("SGD_DASHBOARD_TOKEN", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def test_listed_by_sgd_plugins():
    out = subprocess.run([SGD, "plugins", "--json"], capture_output=True, text=True, check=True, timeout=120)
    table = json.loads(out.stdout)
    (row,) = [r for r in table["plugins"] if r["name"] == "dashboard"]
    assert row["distribution"] == "sgd-dashboard" and row["hooks"] == ["sgd_cli_commands"]
    assert not [f for f in table["failed"] if f["name"] == "dashboard"]


def test_the_plugin_imports_nothing_of_the_server():
    code = ("import sys, sgd_dashboard.plugin; from sgd.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('starlette', 'uvicorn', 'numpy', 'sgd_dashboard.app') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_help():
    out = subprocess.run([SGD, "dashboard", "--help"], capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stderr
    for words in ("RESULTS_DIR_OR_RUN", "--host", "--port", "--token", "--allow-stacks", "default 6007",
                  "SGD_DASHBOARD_TOKEN"):
        assert words in out.stdout, words


def test_a_non_local_host_without_a_token_is_refused(results):
    out = subprocess.run([SGD, "dashboard", str(results), "--host", "0.0.0.0", "--port", "0"], capture_output=True,
                         text=True, timeout=120, env=_env())
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("sgd dashboard: error: refusing to serve on 0.0.0.0 without a token")
    assert "--token" in out.stderr and "Traceback" not in out.stderr


def test_a_folder_that_is_not_there(tmp_path):
    out = subprocess.run([SGD, "dashboard", str(tmp_path / "nope"), "--port", "0"], capture_output=True, text=True,
                         timeout=120, env=_env())
    assert out.returncode == 2 and "is not a directory" in out.stderr and "Traceback" not in out.stderr


def test_serves_on_a_free_port_until_ctrl_c(results):
    rf.make_run(results / "exp", rounds=4)
    env = {**_env(), "SGD_DASHBOARD_TOKEN": "tok-123"}
    proc = subprocess.Popen([SGD, "dashboard", str(results), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()  # type: ignore
    try:
        line = lines.get(timeout=120)
        m = re.search(r"at (http://127\.0\.0\.1:(\d+)/\?token=tok-123) \(Ctrl-C to stop\)", line)
        assert m and int(m.group(2)) > 0, line
        with httpx.Client(base_url=m.group(1).split("?")[0], timeout=30) as client:
            assert client.get("/api/runs").status_code == 403  # the token from the environment is needed
            page = client.get("/", params={"token": "tok-123"}, follow_redirects=True)
            assert page.status_code == 200
            (row,) = client.get("/api/runs").json()["runs"]
            assert row["name"] == "exp/run_001" and row["iterations"] == 4
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
