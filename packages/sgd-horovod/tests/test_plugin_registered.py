"""sgd-horovod is discovered through its entry point, imports nothing heavy, says how to
install Horovod when it is missing, and passes the backend contract."""

import subprocess
import sys

import pytest

import sgd
from sgd_horovod import INSTALL_HINT, HorovodConfig
from sgd_testing import BackendContractTests


def test_discovered_without_importing_sgd_horovod():
    spec = sgd.plugins.available_backends()["horovod"]
    assert spec.config_cls is HorovodConfig
    assert spec.provider == "sgd-horovod"
    assert sgd.Trainer(backend="horovod", num_workers=2).backend_config == HorovodConfig()


def test_plugin_module_imports_neither_horovod_nor_torch():
    code = (
        "import sgd, sgd_horovod, sgd_horovod.plugin, sys; sgd.plugins.available_backends(); "
        "print('horovod' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_missing_horovod_gives_an_install_hint():
    # A Python in which `import horovod` fails, whether or not it is installed here.
    code = (
        "import sys; sys.modules['horovod'] = None\n"
        "from sgd_horovod._horovod import require_horovod, horovod_available\n"
        "try:\n    require_horovod('horovod.runner.http.http_server', 'on the driver')\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "cannot be imported on the driver" in out
    assert "scripts/build_horovod.py --install" in out
    assert "scripts/build_horovod.py" in INSTALL_HINT


@pytest.mark.usefixtures("requires_horovod")
class TestHorovodContract(BackendContractTests):
    backend_name = "horovod"
    provider = "sgd-horovod"

    @staticmethod
    def collective():
        import horovod.torch as hvd
        import torch

        hvd.init()
        return hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
