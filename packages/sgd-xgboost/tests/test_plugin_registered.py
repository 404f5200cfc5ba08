"""sgd-xgboost is discovered through its entry point and both backends pass the backend contract."""

import subprocess
import sys

import pytest

import sgd
from sgd_testing import BackendContractTests
from sgd_xgboost import LightGBMConfig, XGBoostConfig
from sgd_xgboost.config import machines_for


def test_discovered_without_importing_sgd_xgboost():
    backends = sgd.plugins.available_backends()
    assert backends["xgboost"].config_cls is XGBoostConfig
    assert backends["lightgbm"].config_cls is LightGBMConfig
    assert backends["xgboost"].provider == backends["lightgbm"].provider == "sgd-xgboost"


def test_plugin_imports_neither_framework():
    # Nor numpy: every sgd process discovers the plugin (the `sgd` CLI too; sgd-loggers' test of
    # the CLI's imports caught the data helpers' numpy).
    code = (
        "import sgd, sgd_xgboost, sgd_xgboost.plugin, sys; sgd.plugins.available_backends(); "
        "print('xgboost' in sys.modules, 'lightgbm' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False False"


def test_unknown_backend_message_names_this_package():
    # With autoload off the backends are unknown: the message says which package provides them.
    code = (
        "import sgd\n"
        "try:\n    sgd.Trainer(backend='lightgbm')\nexcept ValueError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "SGD_DISABLE_PLUGIN_AUTOLOAD": "1"}).stdout
    assert "sgd-xgboost" in out, out


def test_config_validation():
    assert XGBoostConfig().name == "xgboost" and LightGBMConfig().name == "lightgbm"
    with pytest.raises(ValueError, match="tracker_port"):
        XGBoostConfig(tracker_port=70000)
    with pytest.raises(ValueError, match="timeout_s"):
        XGBoostConfig(timeout_s=-1)
    with pytest.raises(ValueError, match="communicator_timeout_s"):
        XGBoostConfig(communicator_timeout_s=0)
    with pytest.raises(ValueError, match="time_out_min"):
        LightGBMConfig(time_out_min=0)


def test_machines_shape():
    assert machines_for([("10.0.0.1", 1234), ("10.0.0.2", 5678)]) == "10.0.0.1:1234,10.0.0.2:5678"
    # Loopback aliases (several Ray nodes on one machine) are not interface addresses LightGBM finds
    # itself at: every worker that can reach them is on this machine, where 127.0.0.1 is the same.
    assert machines_for([("127.0.0.3", 1234), ("127.0.0.4", 5678)]) == "127.0.0.1:1234,127.0.0.1:5678"


class TestXGBoostContract(BackendContractTests):
    backend_name = "xgboost"
    provider = "sgd-xgboost"

    @staticmethod
    def collective():
        import numpy as np
        from xgboost import collective

        assert collective.get_world_size() == sgd.world_size()
        assert collective.get_rank() == sgd.world_rank()
        return float(collective.allreduce(np.array([sgd.world_rank() + 1.0]), collective.Op.SUM)[0])


class TestLightGBMContract(BackendContractTests):
    backend_name = "lightgbm"
    provider = "sgd-xgboost"

    @staticmethod
    def collective():
        # A data-parallel model on rows split by rank: every worker ends with the same trees.
        import lightgbm
        import numpy as np

        import sgd_xgboost

        rng = np.random.default_rng(sgd.world_rank())
        x = rng.normal(size=(200, 3))
        y = (x[:, 0] > 0).astype(float)
        params = {"objective": "binary", "tree_learner": "data", "num_threads": 1, "verbose": -1,
                  "min_data_in_leaf": 5, **sgd_xgboost.get_network_params()}
        booster = lightgbm.train(params, lightgbm.Dataset(x, label=y), num_boost_round=3)
        trees = booster.model_to_string().split("end of trees")[0]  # the parameters name each worker's port
        assert "internal_count=400" in trees  # both workers' rows
        return trees
