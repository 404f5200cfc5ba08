"""`import sgd` (with every plugin discovered) pulls in no deep-learning framework."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_import_sgd_does_not_import(framework):
    code = (
        "import sys, sgd, sgd_torch\n"
        "sgd.plugins.available_backends()\n"
        "sgd.Trainer(backend='torch', num_workers=2)\n"
        f"print({framework!r} in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_python_m_sgd_and_console_script_agree():
    import shutil

    a = subprocess.run([sys.executable, "-m", "sgd", "plugins"], capture_output=True, text=True, check=True).stdout
    script = shutil.which("sgd") or str(__import__("pathlib").Path(sys.executable).parent / "sgd")
    b = subprocess.run([script, "plugins"], capture_output=True, text=True, check=True).stdout
    assert a == b and "torch" in a
