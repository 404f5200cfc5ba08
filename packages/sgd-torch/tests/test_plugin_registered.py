"""sgd-torch is discovered through its entry point and passes the backend contract."""

import sys

import sgd
from sgd_testing import BackendContractTests
from sgd_torch import TorchConfig


def test_discovered_without_importing_sgd_torch():
    spec = sgd.plugins.available_backends()["torch"]
    assert spec.config_cls is TorchConfig
    assert spec.provider == "sgd-torch"


def test_plugin_module_does_not_import_torch():
    import subprocess

    code = "import sgd, sgd_torch.plugin, sys; sgd.plugins.available_backends(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


class TestTorchContract(BackendContractTests):
    backend_name = "torch"
    provider = "sgd-torch"

    @staticmethod
    def collective():
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()
